"""Bad input: a clear DecodeError naming the sample, never a crash, never a silent pass.

Crash-prone kinds run first in a child interpreter: a segfault or abort() (or libjpeg's
default error_exit, which calls exit()) shows as a non-zero / negative return code instead
of killing pytest. The child prints one JSON line per file; the parent checks them. The
checked-in regression files live in tests/assets/damaged/ (see its README.txt); the kinds
that are cheaper to make than to check in are header surgery on the same source JPEG.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
from PIL import Image

import fastdata
from imagegen import (corrupt_entropy, damaged_source_jpeg, encode_jpeg, encode_other, make_12bit, patch_sof,
                      photo_like, pillow_crop_resize, pillow_oriented, pillow_rgb, psnr, sos_offset)
from repo import ROOT

RRC = fastdata.RandomResizedCrop(32)
# (48, 64) output of a 48x64 image with resize 48: the region is the whole image, so the
# decoder must read every row (and reach the damage wherever it is; a random crop of the
# top rows might legitimately never see it).
WHOLE = fastdata.CenterCrop((48, 64), resize=48)

# tests/assets/damaged: file -> True if it is a damaged JPEG that lenient decoding still
# turns into a (partly grey) picture, False if it is not an image at all.
DAMAGED = {"truncated.jpg": True, "random_bytes.jpg": False, "html_page.JPEG": False, "corrupt_entropy.jpg": True}
PNG_NAMED = "png_named.JPEG"  # a valid PNG under a JPEG name: must decode through the fallback


@pytest.fixture(scope="module")
def good() -> bytes:
    """The 48x64 JPEG the damaged assets were cut from."""
    return damaged_source_jpeg()


def generated_bad(good: bytes) -> Dict[str, Tuple[bytes, bool]]:
    """name -> (bytes, decodes when not strict): the kinds made by header/scan surgery."""
    sos = sos_offset(good)
    mid = sos + (len(good) - sos) // 2
    # Restart markers make damage detectable another way: libjpeg warns when RSTn is out of step.
    with_restarts = encode_jpeg(photo_like(48, 64, index=5), quality=85, restart_blocks=4)
    return {
        "empty": (b"", False),
        "truncated_in_header": (good[:sos - 10], False),
        "soi_then_random": (b"\xff\xd8\xff" + np.random.default_rng(4).integers(0, 256, 3000, np.uint8).tobytes(),
                            False),
        "marker_in_scan": (good[:mid] + b"\xff\xd3" + good[mid:], True),
        "corrupt_restart_intervals": (corrupt_entropy(with_restarts, seed=0, count=60), True),
        "12bit_sof1": (make_12bit(good), False),
        "12bit_sof0": (patch_sof(good, precision=12), False),
        "60000x60000": (patch_sof(good, height=60000, width=60000), False),
        "zero_width": (patch_sof(good, width=0), False),
        "zero_height": (patch_sof(good, height=0), False),
    }


def all_bad(good: bytes, damaged_dir: Path) -> Dict[str, Tuple[bytes, bool]]:
    """Generated kinds plus the checked-in damaged files."""
    out = generated_bad(good)
    out.update({name: ((damaged_dir / name).read_bytes(), lenient) for name, lenient in DAMAGED.items()})
    return out


def test_assets_are_small_and_as_described(damaged_dir):
    names = sorted(p.name for p in damaged_dir.iterdir() if p.name != "README.txt")
    assert names == sorted([*DAMAGED, PNG_NAMED])
    assert (damaged_dir / "README.txt").is_file()
    for name in names:
        assert 0 < len((damaged_dir / name).read_bytes()) < 10_000, name
    assert (damaged_dir / PNG_NAMED).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    truncated = (damaged_dir / "truncated.jpg").read_bytes()
    assert truncated[:3] == b"\xff\xd8\xff" and not truncated.endswith(b"\xff\xd9")


# ------------------------------------------------------------------ crash-prone: child process

CHILD = textwrap.dedent("""
    import json, resource, sys
    import fastdata
    for path in sys.argv[1:]:
        print("START " + path, flush=True)  # names the file if the child dies on it
        data = open(path, "rb").read()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        res = {}
        def attempt(key, fn):
            try:
                out = fn()
                res[key] = ["ok", list(getattr(out, "shape", ()))]
            except fastdata.DecodeError as e:
                res[key] = ["DecodeError", str(e), e.reason]
        attempt("probe", lambda: fastdata.probe(data))
        attempt("decode_strict", lambda: fastdata.decode(data, strict=True))
        attempt("decode_lenient", lambda: fastdata.decode(data, strict=False))
        attempt("batch_bytes", lambda: fastdata.decode_batch([data], fastdata.RandomResizedCrop(32), threads=1))
        attempt("batch_path", lambda: fastdata.decode_batch([path], fastdata.CenterCrop(32), threads=1, indices=[5]))
        spec = fastdata.CenterCrop((48, 64), resize=48)
        for strict in (True, False):
            _, failures = fastdata.decode_batch([data, path], spec, strict=strict, on_error="skip", indices=[3, 4])
            res[f"skip_strict_{strict}"] = [[f.index, f.name, f.reason] for f in failures]
        res["rss_growth_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        print("RESULT " + json.dumps([path, res]), flush=True)
""")


def run_child(paths: List[Path]) -> Dict[str, dict]:
    """Run CHILD over ``paths`` in one fresh interpreter; file name -> results."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    started = [ln for ln in proc.stdout.splitlines() if ln.startswith("START ")]
    assert proc.returncode == 0, (f"child died with {proc.returncode} (negative = signal) on "
                                  f"{started[-1] if started else '?'}\n{proc.stderr[-3000:]}")
    results = {Path(p).name: r for p, r in
               (json.loads(ln[len("RESULT "):]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))}
    assert len(results) == len(paths), proc.stdout[-3000:]
    return results


def test_crash_prone_inputs_fail_cleanly_in_a_child(good, damaged_dir, tmp_path):
    kinds = all_bad(good, damaged_dir)
    paths = {}
    for name, (data, _) in generated_bad(good).items():
        paths[f"{name}.jpg"] = tmp_path / f"{name}.jpg"
        paths[f"{name}.jpg"].write_bytes(data)
    for name in [*DAMAGED, PNG_NAMED]:
        paths[name] = damaged_dir / name
    # Every cut inside the header, and several inside the scan.
    start = sos_offset(good)
    cuts = list(range(1, start + 4)) + [start + k * (len(good) - start) // 8 for k in range(1, 8)]
    for cut in cuts:
        paths[f"cut_{cut}.jpg"] = tmp_path / f"cut_{cut}.jpg"
        paths[f"cut_{cut}.jpg"].write_bytes(good[:cut])
    results = run_child(list(paths.values()))

    for kind, (_, decodes_lenient) in kinds.items():
        name = kind if kind in DAMAGED else f"{kind}.jpg"
        r = results[name]
        path = str(paths[name])
        # strict: every kind here is an error, with a reason
        assert r["decode_strict"][0] == "DecodeError" and r["decode_strict"][2], (name, r)
        failed = r["skip_strict_True"]
        assert [f[0] for f in failed] == [3, 4], (name, failed)                 # both rows, by index
        assert failed[0][1] is None and failed[1][1] == path, (name, failed)    # path named for the str item
        if decodes_lenient:  # damaged-but-JPEG data decodes (warnings counted)
            assert r["decode_lenient"] == ["ok", [48, 64, 3]], (name, r)
            assert r["batch_bytes"] == ["ok", [1, 32, 32, 3]], (name, r)
            assert r["skip_strict_False"] == [], (name, r)
        else:  # the rest still fails, however it is asked for
            for key in ("decode_lenient", "batch_bytes", "batch_path"):
                assert r[key][0] == "DecodeError", (name, key, r[key])
            assert [f[0] for f in r["skip_strict_False"]] == [3, 4], (name, r)
            # raise mode names the path item with its dataset index
            assert "sample 5" in r["batch_path"][1] and name in r["batch_path"][1], (name, r["batch_path"])
        assert r["rss_growth_mb"] < 64, f"{name}: peak RSS grew {r['rss_growth_mb']:.0f} MB"
    for cut in cuts:  # damaged: strict always fails; lenient fails or gives a picture
        r = results[f"cut_{cut}.jpg"]
        assert r["decode_strict"][0] == "DecodeError" and len(r["skip_strict_True"]) == 2, (cut, r)
        assert r["decode_lenient"][0] in ("ok", "DecodeError"), (cut, r)
        assert r["rss_growth_mb"] < 64, (cut, r["rss_growth_mb"])
    r = results[PNG_NAMED]
    for key in ("decode_strict", "batch_bytes", "batch_path"):
        assert r[key][0] == "ok", (key, r)
    assert r["skip_strict_True"] == []
    assert r["probe"][0] == "DecodeError"  # probe is JPEG-only


# ------------------------------------------------------------------ messages and pixel limits

def test_messages_name_the_problem(good):
    cases = generated_bad(good)
    expect = {
        "empty": "empty",
        "12bit_sof1": "precision 12",
        "12bit_sof0": "precision 12",
        "60000x60000": "60000x60000",
        "zero_width": "Empty JPEG image",
        "zero_height": "Empty JPEG image",
    }
    for name, fragment in expect.items():
        with pytest.raises(fastdata.DecodeError) as e:
            fastdata.decode(cases[name][0])
        assert fragment in str(e.value), (name, str(e.value))
        assert isinstance(e.value, ValueError) and e.value.reason
    with pytest.raises(fastdata.DecodeError, match="limit"):
        fastdata.decode(cases["60000x60000"][0], strict=False)


def test_pixel_limit_boundary(good):
    n = 48 * 64
    assert fastdata.decode(good, max_pixels=n).shape == (48, 64, 3)
    with pytest.raises(fastdata.DecodeError, match="limit"):
        fastdata.decode(good, max_pixels=n - 1)
    _, failures = fastdata.decode_batch([good, good], RRC, on_error="skip", max_pixels=n - 1, threads=1)
    assert [f.index for f in failures] == [0, 1] and "limit" in failures[0].reason
    # The same limit guards the Pillow fallback.
    png = encode_other(photo_like(48, 64), "PNG")
    assert fastdata.decode(png, max_pixels=n).shape == (48, 64, 3)
    with pytest.raises(fastdata.DecodeError, match="limit"):
        fastdata.decode(png, max_pixels=n - 1)
    _, failures = fastdata.decode_batch([png], RRC, on_error="skip", max_pixels=n - 1)
    assert len(failures) == 1 and "limit" in failures[0].reason


def test_pixel_limit_refuses_before_decoding(good):
    # A 1 KB file claiming 4000x4000: refused by max_pixels, decodable (as grey) above it.
    data = patch_sof(good, height=4000, width=4000)
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(data, strict=False, max_pixels=1_000_000)
    assert fastdata.decode(data, strict=False, max_pixels=16_000_000).shape == (4000, 4000, 3)
    _, failures = fastdata.decode_batch([data], RRC, max_pixels=1_000_000, on_error="skip")
    assert len(failures) == 1
    _, failures = fastdata.decode_batch([data], RRC, max_pixels=16_000_000, on_error="skip")
    assert failures == []


def test_raising_the_pixel_limit_lets_a_large_header_through(good):
    # A header claiming 10000x10000 (1e8 px, over the 89.5 MP default) with only 2 KB of data.
    big = patch_sof(good, height=10_000, width=10_000)
    assert fastdata.DEFAULT_MAX_PIXELS < 10**8
    with fastdata.Engine(1) as engine:
        out = np.zeros((1, 32, 32, 3), np.uint8)
        refused = engine.run([big], fastdata.CenterCrop(32), out)
        assert len(refused.failures) == 1 and "limit" in refused.failures[0].reason
        allowed = engine.run([big], fastdata.CenterCrop(32), out, max_pixels=2 * 10**8)
        # past the limit now; the missing scan data is what libjpeg complains about
        assert not allowed.failures and allowed.warnings > 0
        strict = engine.run([big], fastdata.CenterCrop(32), out, max_pixels=2 * 10**8, strict=True)
        assert len(strict.failures) == 1 and "limit" not in strict.failures[0].reason


def test_default_max_pixels_is_pillows():
    assert fastdata.DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS


# ------------------------------------------------------------------ damaged JPEGs: strict vs lenient

def test_strict_and_lenient_truncated(damaged_dir, good):
    data = (damaged_dir / "truncated.jpg").read_bytes()
    with pytest.raises(fastdata.DecodeError, match="(?i)premature|corrupt"):
        fastdata.decode(data, strict=True)
    img = fastdata.decode(data, strict=False)
    assert img.shape == (48, 64, 3)
    # The upper part (before the cut) is the picture.
    ref = fastdata.decode(good)
    assert np.abs(img[:8].astype(int) - ref[:8]).mean() < 1.0
    assert psnr(img[:12], ref[:12]) >= 40.0
    with fastdata.Engine(threads=1) as engine:
        out = np.zeros((1, 48, 64, 3), np.uint8)
        report = engine.run([data], WHOLE, out, strict=False)
        assert report.failures == [] and report.warnings >= 1
        report = engine.run([data], WHOLE, out, strict=True)
        assert [f.index for f in report.failures] == [0] and report.failed_rows == [0]
        assert not out.any()  # the failed row is zero-filled


@pytest.mark.parametrize("kind", ["asset", "restart_intervals"])
def test_corrupt_entropy(damaged_dir, good, kind):
    if kind == "asset":
        data, source = (damaged_dir / "corrupt_entropy.jpg").read_bytes(), good
    else:
        data = generated_bad(good)["corrupt_restart_intervals"][0]
        source = encode_jpeg(photo_like(48, 64, index=5), quality=85, restart_blocks=4)
    # The oracle is Pillow's libjpeg-turbo: it decodes the damaged bytes (it does not report
    # libjpeg's warnings) to pixels far from the undamaged source's, so the data really is corrupt.
    pillow = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    pillow_source = np.asarray(Image.open(io.BytesIO(source)).convert("RGB"))
    assert np.abs(pillow.astype(int) - pillow_source.astype(int)).mean() > 10
    # strict decode reports the damage; lenient decode returns what libjpeg does, with a warning
    with pytest.raises(fastdata.DecodeError, match="Corrupt JPEG data"):
        fastdata.decode(data, strict=True)
    np.testing.assert_array_equal(fastdata.decode(data, strict=False), pillow)
    with fastdata.Engine(1) as engine:
        report = engine.run([data], WHOLE, np.zeros((1, 48, 64, 3), np.uint8))
    assert report.warnings > 0 and not report.failures


# ------------------------------------------------------------------ batches with bad items

def test_batch_error_names_every_failure(good, damaged_dir, tmp_path):
    bad = generated_bad(good)
    missing = str(tmp_path / "does_not_exist.jpg")
    zero_width = tmp_path / "zero_width.jpg"
    zero_width.write_bytes(bad["zero_width"][0])
    html = (damaged_dir / "html_page.JPEG").read_bytes()
    items = [good, html, good, missing, bad["12bit_sof1"][0], good, str(zero_width)] + [b""] * 9
    indices = list(range(100, 100 + len(items)))
    with pytest.raises(fastdata.BatchDecodeError) as e:
        fastdata.decode_batch(items, RRC, indices=indices, threads=2)
    err = e.value
    assert isinstance(err, fastdata.DecodeError) and isinstance(err, ValueError)
    assert [f.index for f in err.failures] == [101, 103, 104, 106] + list(range(107, 116))
    named = {f.index: f.name for f in err.failures}
    assert named[103] == missing and named[106] == str(zero_width) and named[101] is None
    for f in err.failures:
        assert isinstance(f, fastdata.DecodeError) and f.reason
    # the message lists the first 8 failures by sample index (with paths) and counts the rest
    for f in err.failures[:8]:
        assert f"sample {f.index}" in str(err)
    assert "sample 111" not in str(err) and "(+5 more)" in str(err)
    assert "does_not_exist.jpg" in str(err) and str(zero_width) in str(err)


def test_skip_zero_fills_and_keeps_good_rows(good, damaged_dir):
    bad = generated_bad(good)
    other = encode_jpeg(photo_like(100, 80, 2))
    items = [good, (damaged_dir / "random_bytes.jpg").read_bytes(), other, bad["zero_width"][0], good,
             bad["60000x60000"][0], (damaged_dir / "html_page.JPEG").read_bytes(), b""]
    out = np.full((len(items), 32, 32, 3), 0xAB, np.uint8)
    got, failures = fastdata.decode_batch(items, RRC, out, seed=2, threads=2, on_error="skip")
    assert got is out
    assert sorted(f.index for f in failures) == [1, 3, 5, 6, 7]
    for row in (1, 3, 5, 6, 7):
        assert not out[row].any()
    clean = fastdata.decode_batch([good, other, good], RRC, seed=2, indices=[0, 2, 4], threads=1)
    assert np.array_equal(out[[0, 2, 4]], clean)


def test_valid_after_garbage(good, damaged_dir):
    bad = all_bad(good, damaged_dir)
    valid = [good, encode_jpeg(photo_like(90, 120, 1), progressive=True)]
    with fastdata.Engine(threads=2) as fresh:
        want = np.zeros((2, 32, 32, 3), np.uint8)
        fresh.run(valid, RRC, want, seed=1, indices=[3, 4])
    # One thread: the same libjpeg decoder object handles every sample in turn; two threads:
    # the garbage reaches both threads' decoders.
    for threads in (1, 2):
        with fastdata.Engine(threads=threads) as engine:
            for name, (data, lenient) in bad.items():
                out = np.zeros((4, 32, 32, 3), np.uint8)
                report = engine.run([data] * 4, RRC, out, strict=True)
                if not lenient:  # (a random crop may end above the damage of the lenient kinds)
                    assert len(report.failures) == 4, name
                got = np.zeros_like(want)
                report = engine.run(valid, RRC, got, seed=1, indices=[3, 4])
                assert report.failures == [], name
                assert np.array_equal(got, want), f"wrong output right after {name} ({threads} threads)"
    # interleaved within one batch
    items = [x for data, _ in bad.values() for x in (data, good)]
    with fastdata.Engine(threads=1) as engine:
        out = np.zeros((len(items), 32, 32, 3), np.uint8)
        engine.run(items, RRC, out, seed=1, indices=[3] * len(items), strict=True)
    for row in range(1, len(items), 2):
        assert np.array_equal(out[row], want[0]), row
    # the single-image path reuses a per-thread decoder too
    for name, (data, lenient) in bad.items():
        if lenient:
            fastdata.decode(data, strict=False)
        with pytest.raises(fastdata.DecodeError):
            fastdata.decode(data, strict=True)
        assert np.array_equal(fastdata.decode(good), pillow_rgb(good)), name


# ------------------------------------------------------------------ other formats

def test_png_named_jpeg_asset(damaged_dir):
    path = damaged_dir / PNG_NAMED
    data = path.read_bytes()
    assert np.array_equal(fastdata.decode(data), pillow_rgb(data))
    out = fastdata.decode_batch([str(path), data], RRC, indices=[1, 1])
    assert np.array_equal(out[0], out[1])
    im = pillow_oriented(data)
    box = fastdata._C.sample_crop_boxes(im.height, im.width, RRC.scale, RRC.ratio, RRC.hflip, 0, 0,
                                        np.array([1], np.int64))[0]
    assert psnr(out[0], pillow_crop_resize(im, box, RRC.output_size)) >= 40.0
    with fastdata.Engine(threads=1) as engine:
        report = engine.run([str(path)], RRC, np.zeros((1, 32, 32, 3), np.uint8))
    assert report.fallbacks == 1 and report.failures == []


def test_unreadable_other_formats_fail_cleanly():
    png = encode_other(photo_like(40, 50), "PNG")
    truncated_png = png[: len(png) // 2]
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(truncated_png)
    _, failures = fastdata.decode_batch([truncated_png], RRC, on_error="skip")
    assert len(failures) == 1
