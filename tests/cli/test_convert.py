"""fastdata-convert: round trip, --max-side, damaged inputs, crash + resume, map growth."""
from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import lmdb
import numpy as np
import pytest
from PIL import Image, ImageOps, JpegImagePlugin
from torchvision.datasets import ImageFolder

import fastdata
from fastdata.cache import format as cf
from repo import ROOT


from fastdata.cli.convert import ConvertError, convert, main
from fastdata.sources.lmdb import LMDBSource



def image(i: int, w: int, h: int) -> Image.Image:
    """A smooth image whose colour encodes ``i`` (distinct per sample, compresses well)."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.array([i * 53 % 256, i * 97 % 256, i * 29 % 256], dtype=np.float64)
    arr = (base + 60 * np.sin(x[..., None] / 9.0 + np.arange(3)) + 40 * np.cos(y[..., None] / 7.0)) % 256
    return Image.fromarray(arr.astype(np.uint8))


def make_folder(root: Path, classes=("bird", "cat", "dog"), per_class: int = 6, nested: bool = True) -> Path:
    i = 0
    for c in classes:
        for k in range(per_class):
            d = root / c / ("sub" if nested and k % 3 == 2 else "")
            d.mkdir(parents=True, exist_ok=True)
            ext = ".png" if k == 4 else (".JPG" if k == 5 else ".jpg")
            image(i, 64 + 7 * k, 48 + 5 * k).save(d / f"img{k:02d}{ext}", format="PNG" if ext == ".png" else "JPEG",
                                                   quality=85)
            i += 1
    (root / classes[0] / "notes.txt").write_text("not an image extension: never listed")
    return root


def records(path: Path) -> Dict[bytes, bytes]:
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            return dict(txn.cursor().iternext())
    finally:
        env.close()


def assert_same_pixels(stored: List, sources: List[bytes]) -> None:
    """Records hold their sources losslessly (restart-indexed rewrites of the JPEGs)."""
    assert len(stored) == len(sources)
    for got, src in zip(stored, sources):
        np.testing.assert_array_equal(fastdata.decode(got), fastdata.decode(src))


def test_round_trip_matches_imagefolder(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "src")
    assert main([str(src), str(tmp_path / "db"), "--workers", "2", "--quiet", "--verify"]) == 0
    ref = ImageFolder(str(src))
    s = LMDBSource(str(tmp_path / "db"))
    assert s.classes == ref.classes
    assert len(s) == len(ref.samples)
    np.testing.assert_array_equal(s.labels, np.array(ref.targets, dtype=np.int64))
    assert s.labels.dtype == np.int64
    got = s.fetch(range(len(s)))
    for i, (path, _) in enumerate(ref.samples):
        data = Path(path).read_bytes()
        if data[:3] == b"\xff\xd8\xff":  # rewritten losslessly with a restart index: the same pixels
            assert fastdata.probe(got[i]).restart_indexed and s.restart_indexed[i]
            np.testing.assert_array_equal(fastdata.decode(got[i]), fastdata.decode(data))
        else:
            assert got[i] == data and not s.restart_indexed[i]  # PNG: original bytes, unless --max-side
        assert s.sha256(i) == hashlib.sha256(data).digest()
        assert os.path.join(s.meta["source"]["root"], s.source_path(i)) == path
    assert not s.reencoded.any() and not s.transcoded.any()
    assert s.meta["format_version"] == cf.FORMAT_VERSION and s.meta["skipped"] == []
    s.close()
    del got  # the views hold the cache open, and py-lmdb opens it only once per process
    # every stored record is a sample or a known metadata key: nothing left over, nothing pickled
    keys = set(records(tmp_path / "db"))
    assert keys == {cf.sample_key(i) for i in range(len(s))} | {
        cf.META_KEY, cf.LABELS_KEY, cf.PATHS_KEY, cf.SHA256_KEY, cf.STORED_SHA256_KEY, cf.REENCODED_KEY,
        cf.COMPLETE_KEY}


def test_list_file_source(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "src", per_class=3, nested=False)
    files = sorted(src.rglob("*.jpg"))
    labels = [7 - k % 3 for k in range(len(files))]
    lines = ["# path,label", ""] + [f"{f.relative_to(tmp_path)},{lab}" for f, lab in zip(files, labels)]
    lines[3] = f"{files[1]},{labels[1]}"  # absolute paths work too
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    convert(str(tmp_path / "train.csv"), str(tmp_path / "db"), workers=1)
    s = LMDBSource(str(tmp_path / "db"))
    assert s.classes == [str(k) for k in range(8)]
    np.testing.assert_array_equal(s.labels, labels)
    for stored, f in zip(s.fetch(range(len(files))), files):
        np.testing.assert_array_equal(fastdata.decode(stored), fastdata.decode(f.read_bytes()))

    (tmp_path / "bad.csv").write_text(f"{files[0]};3\n")
    with pytest.raises(ConvertError, match=r"bad.csv:1: expected 'path,label'"):
        convert(str(tmp_path / "bad.csv"), str(tmp_path / "db2"), workers=1)


def _oracle(data: bytes, max_side: int) -> Image.Image:
    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    w, h = img.size
    scale = max_side / max(w, h)
    return img.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.LANCZOS)


@pytest.mark.parametrize("quality", [90, 60])
def test_max_side(tmp_path: Path, quality: int) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    image(1, 200, 120).save(src / "0_big.jpg", quality=95)
    image(2, 50, 40).save(src / "1_small.jpg", quality=95, subsampling=0, progressive=True)
    image(3, 90, 60).save(src / "2_small.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW on display: stored 300x100 shows as 100x300
    image(4, 300, 100).save(src / "3_rotated.jpg", quality=95, exif=exif.tobytes())
    image(5, 30, 60).save(src / "4_rotated_small.jpg", quality=95, exif=exif.tobytes())
    args = [str(tmp_path / "src"), str(tmp_path / "db"), "--max-side", "64", "--workers", "2", "--quiet", "--verify"]
    assert main(args + ["--quality", str(quality)]) == 0
    s = LMDBSource(str(tmp_path / "db"))
    out = s.fetch(range(5))
    originals = [p.read_bytes() for p in sorted(src.iterdir())]
    # fits: kept losslessly (restart-indexed, the same pixels), EXIF and all
    assert fastdata.probe(out[4]).orientation == 6 and fastdata.probe(out[4]).restart_indexed
    np.testing.assert_array_equal(fastdata.decode(out[4]), fastdata.decode(originals[4]))
    # fits but progressive: transcoded losslessly to baseline (same pixels), not re-encoded
    assert not fastdata.probe(out[1]).progressive
    np.testing.assert_array_equal(fastdata.decode(out[1]), fastdata.decode(originals[1]))
    np.testing.assert_array_equal(s.reencoded, [True, False, True, True, False])
    np.testing.assert_array_equal(s.transcoded, [False, True, False, False, False])
    for k, size in [(0, (64, 38)), (2, (64, 43)), (3, (21, 64))]:
        img = Image.open(io.BytesIO(out[k]))
        assert img.format == "JPEG" and img.size == size
        assert JpegImagePlugin.get_sampling(img) == 2 and not img.info.get("progressive")  # baseline 4:2:0
        assert img.getexif().get(0x0112) is None  # orientation was applied to the pixels
        assert fastdata.probe(out[k]).restart_indexed  # re-encoded, then indexed losslessly
        # oracle: Pillow decode + orientation + LANCZOS, encoded the same way
        buf = io.BytesIO()
        _oracle(originals[k], 64).save(buf, "JPEG", quality=quality, subsampling="4:2:0")
        ref = Image.open(buf)
        assert img.quantization == ref.quantization  # the requested quality
        diff = np.abs(np.asarray(img.convert("RGB"), np.float64) - np.asarray(ref.convert("RGB"), np.float64))
        assert diff.mean() < 1.0, diff.mean()
    assert s.meta["options"] == {"max_side": 64, "quality": quality, "keep_progressive": False,
                                 "restart_interval_mcus": cf.RESTART_INTERVAL_MCUS}


def make_damaged(root: Path) -> List[str]:
    """Good images plus three bad ones; returns the bad paths relative to root."""
    make_folder(root, classes=("a", "b"), per_class=4, nested=False)
    good = (root / "a" / "img00.jpg").read_bytes()
    (root / "a" / "trunc.jpg").write_bytes(good[: len(good) // 2])
    (root / "b" / "noise.jpeg").write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    (root / "b" / "page.JPEG").write_bytes(b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n")
    return ["a/trunc.jpg", "b/noise.jpeg", "b/page.JPEG"]


def test_damaged_skip_and_raise(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src"
    bad = make_damaged(src)
    assert main([str(src), str(tmp_path / "skip"), "--on-error", "skip", "--workers", "2", "--quiet"]) == 0
    err = capsys.readouterr().err
    s = LMDBSource(str(tmp_path / "skip"))
    assert sorted(x["path"] for x in s.skipped) == sorted(bad)
    assert all(x["reason"].startswith("invalid image") for x in s.skipped)
    for b in bad:
        assert f"skipped {b}:" in err
    ref = [(p, t) for p, t in ImageFolder(str(src)).samples if os.path.relpath(p, src) not in bad]
    assert len(s) == len(ref) == 8
    assert_same_pixels(s.fetch(range(len(s))), [Path(p).read_bytes() for p, _ in ref])
    np.testing.assert_array_equal(s.labels, [t for _, t in ref])

    assert main([str(src), str(tmp_path / "raise"), "--workers", "2", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and str(src / "a" / "trunc.jpg") in err  # the first bad file, by name
    with pytest.raises(cf.CacheFormatError, match="incomplete"):
        LMDBSource(str(tmp_path / "raise"))
    # fix the file and resume: equals a clean conversion of the fixed tree
    (src / "a" / "trunc.jpg").write_bytes((src / "a" / "img00.jpg").read_bytes())
    assert main([str(src), str(tmp_path / "raise"), "--resume", "--on-error", "skip", "--quiet"]) == 0
    assert main([str(src), str(tmp_path / "clean"), "--on-error", "skip", "--quiet"]) == 0
    assert records(tmp_path / "raise") == records(tmp_path / "clean")


def test_sigkill_then_resume_equals_clean_run(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "src", per_class=10, nested=False)
    blocker = src / "dog" / "img07.jpg"  # late in the order: earlier batches get committed first
    reached = tmp_path / "reached"
    dst = tmp_path / "db"
    # The converter stops for good when it comes to the blocker (a named pipe did this before
    # the reader refused non-regular files), so the kill lands mid-run, after earlier commits.
    child = (
        "import pathlib, sys, time\n"
        "import fastdata.cli.convert as c, fastdata.cache.build.ordered_pool as w\n"
        "real = w.process_one\n"
        "def process_one(pos, path, *args):\n"
        f"    if path == {str(blocker)!r}:\n"
        f"        pathlib.Path({str(reached)!r}).touch()\n"
        "        time.sleep(3600)\n"
        "    return real(pos, path, *args)\n"
        "w.process_one = process_one  # what the ordered pool calls with --workers 1\n"
        f"sys.exit(c.main([{str(src)!r}, {str(dst)!r}, '--workers', '1', '--batch-size', '4', '--quiet']))\n")
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not reached.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"converter never reached the blocker: {proc.communicate()[1]!r}")
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    partial = records(dst)
    assert cf.sample_key(0) in partial and cf.COMPLETE_KEY not in partial  # killed with work committed
    with pytest.raises(cf.CacheFormatError, match=r"incomplete.*--resume"):
        LMDBSource(str(dst))

    with pytest.raises(ConvertError, match="--resume"):
        convert(str(src), str(dst), workers=1)  # never silently overwrites
    with pytest.raises(ConvertError, match="differ"):
        convert(str(src), str(dst), workers=1, resume=True, max_side=32)
    convert(str(src), str(dst), workers=2, resume=True, batch_size=3)
    convert(str(src), str(tmp_path / "clean"), workers=2)
    assert records(dst) == records(tmp_path / "clean")
    assert convert(str(src), str(dst), resume=True).already_complete


def test_map_size_grows(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "src", per_class=4, nested=False)
    convert(str(src), str(tmp_path / "db"), workers=1, map_size=16 << 10, batch_size=5)
    s = LMDBSource(str(tmp_path / "db"))
    ref = ImageFolder(str(src)).samples
    total = sum(Path(p).stat().st_size for p, _ in ref)
    assert total > 16 << 10  # the initial map could not have held it
    assert_same_pixels(s.fetch(range(len(s))), [Path(p).read_bytes() for p, _ in ref])


def test_missing_source(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "nope"), str(tmp_path / "db")]) == 1
    assert "no such folder or list file" in capsys.readouterr().err


def make_progressive_folder(root: Path) -> Dict[str, bytes]:
    """One class of every kind convert must tell apart; returns name -> source bytes."""
    rng = np.random.default_rng(3)
    files: Dict[str, bytes] = {}

    def save(name: str, img: Image.Image, **kw) -> None:
        buf = io.BytesIO()
        img.save(buf, "PNG" if name.endswith(".png") else "JPEG", **kw)
        files[name] = buf.getvalue()

    photo = lambda i, w, h: Image.fromarray(  # noqa: E731 - grain, so files have realistic entropy
        np.clip(np.asarray(image(i, w, h), np.float64) + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    save("p420.jpg", photo(1, 120, 90), progressive=True, quality=90)
    save("p444.jpg", photo(2, 100, 70), progressive=True, quality=90, subsampling=0)
    save("pgray.jpg", photo(3, 90, 60).convert("L"), progressive=True, quality=90)
    save("prot.jpg", photo(4, 110, 80), progressive=True, quality=90, exif=exif.tobytes())
    save("pcmyk.jpg", photo(5, 60, 40).convert("CMYK"), progressive=True, quality=90)
    save("base.jpg", photo(6, 80, 60), quality=90)
    save("zz.png", photo(7, 40, 30))
    d = root / "a"
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    return files


def test_progressive_transcoded_losslessly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    files = make_progressive_folder(tmp_path / "src")
    assert main([str(tmp_path / "src"), str(tmp_path / "db"), "--workers", "2", "--verify"]) == 0
    summary = capsys.readouterr().err
    s = LMDBSource(str(tmp_path / "db"))
    names = [os.path.basename(s.source_path(i)) for i in range(len(s))]
    stored = dict(zip(names, (bytes(b) for b in s.fetch(range(len(s))))))
    transcoded = ["p420.jpg", "p444.jpg", "pgray.jpg", "prot.jpg"]
    for name in transcoded:
        assert not fastdata.probe(stored[name]).progressive
        np.testing.assert_array_equal(fastdata.decode(stored[name]), fastdata.decode(files[name]))
    assert fastdata.probe(stored["prot.jpg"]).orientation == 6  # EXIF kept: the decode is oriented
    for name in ("pcmyk.jpg", "zz.png"):  # CMYK and non-JPEG: source bytes
        assert stored[name] == files[name]
    # baseline: rewritten with a restart index (lossless), as are the transcoded ones
    np.testing.assert_array_equal(fastdata.decode(stored["base.jpg"]), fastdata.decode(files["base.jpg"]))
    for name in transcoded + ["base.jpg"]:
        assert fastdata.probe(stored[name]).restart_indexed
    np.testing.assert_array_equal(s.transcoded, [n in transcoded for n in names])
    np.testing.assert_array_equal(s.restart_indexed, [n == "base.jpg" for n in names])
    assert not s.reencoded.any()
    for i, name in enumerate(names):
        assert s.sha256(i) == hashlib.sha256(files[name]).digest()  # of the source, as documented
    before, after = sum(len(files[n]) for n in transcoded), sum(len(stored[n]) for n in transcoded)
    assert (s.meta["transcoded"], s.meta["transcoded_bytes_in"], s.meta["transcoded_bytes_out"]) == (4, before, after)
    assert s.meta["options"] == {"max_side": None, "quality": None, "keep_progressive": False,
                                 "restart_interval_mcus": cf.RESTART_INTERVAL_MCUS}
    assert f"4 progressive transcoded to baseline ({before / 1e6:.2f} -> {after / 1e6:.2f} MB)" in summary

    assert main([str(tmp_path / "src"), str(tmp_path / "keep"), "--keep-progressive", "--quiet", "--verify"]) == 0
    k = LMDBSource(str(tmp_path / "keep"))
    for i, b in enumerate(k.fetch(range(len(k)))):
        name = os.path.basename(k.source_path(i))
        if name.startswith("p"):  # progressive ones (and CMYK) kept as they are
            assert bytes(b) == files[name]
    assert not k.transcoded.any() and k.meta["transcoded"] == 0
    k.close()
    # a view still alive holds the cache open: resuming it in this process is refused, and says why
    with pytest.raises(ConvertError, match=r"views of 1 fetch\(es\) are alive"):
        convert(str(tmp_path / "src"), str(tmp_path / "keep"), resume=True)
    del b
    # the flag is part of the options: resuming with the other setting is refused
    with pytest.raises(ConvertError, match="different inputs or options"):
        convert(str(tmp_path / "src"), str(tmp_path / "keep"), resume=True)


def test_damaged_progressive_skipped_or_raised(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    files = make_progressive_folder(tmp_path / "src")
    good = files["p420.jpg"]
    (tmp_path / "src" / "a" / "p_trunc.jpg").write_bytes(good[: len(good) * 2 // 3])
    assert main([str(tmp_path / "src"), str(tmp_path / "skip"), "--on-error", "skip", "--quiet"]) == 0
    assert "1 skipped" in capsys.readouterr().err
    s = LMDBSource(str(tmp_path / "skip"))
    assert [x["path"] for x in s.skipped] == ["a/p_trunc.jpg"]
    assert "Premature end of JPEG file" in s.skipped[0]["reason"]
    assert len(s) == len(files) and s.meta["transcoded"] == 4

    assert main([str(tmp_path / "src"), str(tmp_path / "raise"), "--quiet"]) == 1
    assert str(tmp_path / "src" / "a" / "p_trunc.jpg") in capsys.readouterr().err


def test_a_file_that_cannot_be_transcoded_is_stored_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file that decodes but cannot be transcoded (here: a simulated libjpeg failure) is a
    # good image: it keeps its original bytes, under either --on-error, and is not counted
    # as transcoded.
    from fastdata import _C

    files = make_progressive_folder(tmp_path / "src")

    class FakeC:
        NativeDecodeError = _C.NativeDecodeError

        @staticmethod
        def transcode_restart_indexed(data: bytes, max_pixels: int, interval_mcus: int) -> bytes:
            if data == files["p444.jpg"]:
                raise _C.NativeDecodeError("simulated failure")
            return _C.transcode_restart_indexed(data, max_pixels, interval_mcus)

    monkeypatch.setattr(fastdata, "_C", FakeC)
    for on_error in ("skip", "raise"):
        s = convert(str(tmp_path / "src"), str(tmp_path / on_error), workers=1, on_error=on_error)
        assert not s.skipped and s.transcoded == 3
        src = fastdata.LMDBSource(str(tmp_path / on_error))
        stored = {Path(src.source_path(i)).name: (bytes(src.fetch([i])[0]), int(src.transcoded[i]))
                  for i in range(len(src))}
        assert stored["p444.jpg"] == (files["p444.jpg"], 0)
