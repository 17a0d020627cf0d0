"""Bad input: a clear DecodeError naming the sample, never a crash, never a silent pass.

The crash-prone kinds run first in a child interpreter: a segfault or abort() (or libjpeg's
default error_exit, which calls exit()) shows up as a non-zero / negative return code
instead of killing pytest. The checked-in files live in tests/assets/bad/ (README.txt).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import fastdata
from imagegen_native import (encode, good_small_jpeg, photo, pil_crop_resize, pil_oriented, psnr, scan_start,
                             with_sof)

BAD_DIR = Path(__file__).resolve().parent.parent / "assets" / "bad"
ASSETS = ["truncated.jpg", "random_bytes.jpg", "html_page.JPEG", "corrupt_entropy.jpg", "png_named.JPEG"]
RRC = fastdata.RandomResizedCrop(32)
# A crop of the whole 128x96 picture: the decoder must read every row, so it reaches the
# damage wherever it is (a random crop of the top rows might legitimately never see it).
WHOLE = fastdata.CenterCrop((96, 128), resize=96)


@pytest.fixture(scope="module")
def good() -> bytes:
    return good_small_jpeg()


def generated_bad(good: bytes) -> Dict[str, bytes]:
    """The kinds that are cheaper to make than to check in (header surgery on ``good``)."""
    return {
        "empty": b"",
        "soi_then_random": b"\xff\xd8\xff" + np.random.default_rng(4).integers(0, 256, 3000, np.uint8).tobytes(),
        "truncated_in_header": good[:scan_start(good) - 20],
        "12bit_sof1": with_sof(good, marker=0xC1, precision=12),
        "12bit_sof0": with_sof(good, precision=12),
        "60000x60000": with_sof(good, height=60000, width=60000),
        "zero_width": with_sof(good, width=0),
        "zero_height": with_sof(good, height=0),
    }


def test_assets_are_small_and_as_described() -> None:
    for name in ASSETS:
        data = (BAD_DIR / name).read_bytes()
        assert 0 < len(data) < 10_000, name
    assert (BAD_DIR / "README.txt").is_file()
    assert (BAD_DIR / "png_named.JPEG").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (BAD_DIR / "truncated.jpg").read_bytes()[:3] == b"\xff\xd8\xff"
    assert not (BAD_DIR / "truncated.jpg").read_bytes().endswith(b"\xff\xd9")


# ----------------------------------------------------------------- crash-prone: child process

CHILD = textwrap.dedent("""
    import json, resource, sys
    import fastdata
    for path in sys.argv[1:]:
        data = open(path, "rb").read()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        res = {}
        def attempt(key, fn):
            try:
                fn()
                res[key] = "ok"
            except fastdata.DecodeError as e:
                res[key] = "DecodeError: " + str(e)
        attempt("probe", lambda: fastdata.probe(data))
        attempt("decode_strict", lambda: fastdata.decode(data, strict=True))
        attempt("decode_lenient", lambda: fastdata.decode(data, strict=False))
        attempt("batch_bytes", lambda: fastdata.decode_batch([data], fastdata.RandomResizedCrop(32), threads=1))
        attempt("batch_path", lambda: fastdata.decode_batch([path], fastdata.CenterCrop(32), threads=1, indices=[5]))
        attempt("batch_strict", lambda: fastdata.decode_batch([data], fastdata.CenterCrop(32), threads=1, strict=True))
        res["rss_growth_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
        print("RESULT " + json.dumps([path, res]), flush=True)
""")


def run_child(paths: List[Path]) -> Dict[str, dict]:
    """Run CHILD over ``paths`` in one fresh interpreter; file name -> results."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"child died with {proc.returncode} (negative = signal)\n{proc.stderr[-3000:]}"
    results = {Path(p).name: r for p, r in
               (json.loads(ln[len("RESULT "):]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))}
    assert len(results) == len(paths), proc.stdout[-3000:]
    return results


def test_crash_prone_inputs_fail_cleanly_in_a_child(good: bytes, tmp_path: Path) -> None:
    cases = generated_bad(good)
    paths = []
    for name, data in cases.items():
        paths.append(tmp_path / f"{name}.jpg")
        paths[-1].write_bytes(data)
    # Every cut inside the header, and several inside the scan.
    start = scan_start(good)
    cuts = list(range(1, start + 4)) + [start + k * (len(good) - start) // 8 for k in range(1, 8)]
    for cut in cuts:
        paths.append(tmp_path / f"cut_{cut}.jpg")
        paths[-1].write_bytes(good[:cut])
    paths += [BAD_DIR / name for name in ASSETS]
    results = run_child(paths)

    must_fail = [f"{n}.jpg" for n in cases] + ["random_bytes.jpg", "html_page.JPEG"]
    for name in must_fail:
        r = results[name]
        for key in ("decode_strict", "decode_lenient", "batch_bytes", "batch_path", "batch_strict"):
            assert r[key].startswith("DecodeError"), (name, key, r[key])
        # the path item is named, with its dataset index
        assert "sample 5" in r["batch_path"] and name in r["batch_path"], r["batch_path"]
        assert r["rss_growth_kb"] < 200_000, (name, r["rss_growth_kb"])  # nothing huge was allocated
    for name in ["truncated.jpg", "corrupt_entropy.jpg"] + [f"cut_{c}.jpg" for c in cuts]:
        r = results[name]  # damaged: strict always fails; lenient fails or gives a picture
        assert r["decode_strict"].startswith("DecodeError") and r["batch_strict"].startswith("DecodeError"), (name, r)
        assert r["decode_lenient"] == "ok" or r["decode_lenient"].startswith("DecodeError"), (name, r)
    for name in ("truncated.jpg", "corrupt_entropy.jpg"):  # damaged but has a picture
        assert results[name]["decode_lenient"] == "ok" and results[name]["batch_bytes"] == "ok", results[name]
    r = results["png_named.JPEG"]
    assert r["decode_strict"] == r["batch_bytes"] == r["batch_path"] == "ok", r
    assert r["probe"].startswith("DecodeError")  # probe is JPEG-only


# ----------------------------------------------------------------- in-process checks

def test_messages_name_the_problem(good: bytes) -> None:
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
            fastdata.decode(cases[name])
        assert fragment in str(e.value), (name, str(e.value))
        assert isinstance(e.value, ValueError) and e.value.reason
    with pytest.raises(fastdata.DecodeError, match="limit"):
        fastdata.decode(cases["60000x60000"])


def test_pixel_limit_is_configurable(good: bytes) -> None:
    n = 96 * 128
    assert fastdata.decode(good, max_pixels=n).shape == (96, 128, 3)
    with pytest.raises(fastdata.DecodeError, match="limit"):
        fastdata.decode(good, max_pixels=n - 1)
    out, failures = fastdata.decode_batch([good, good], RRC, on_error="skip", max_pixels=n - 1, threads=1)
    assert [f.index for f in failures] == [0, 1] and "limit" in failures[0].reason
    # The same limit guards the Pillow fallback.
    png = encode(photo(96, 128, seed=3), "PNG")
    with pytest.raises(fastdata.DecodeError, match="limit"):
        fastdata.decode(png, max_pixels=n - 1)
    _, failures = fastdata.decode_batch([png], RRC, on_error="skip", max_pixels=n - 1)
    assert len(failures) == 1 and "limit" in failures[0].reason


def test_raising_the_pixel_limit_lets_a_large_header_through(good: bytes) -> None:
    # A header claiming 10000x10000 (1e8 px, over the 89.5 MP default) with only 3 KB of data.
    big = with_sof(good, height=10_000, width=10_000)
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


def test_strict_and_lenient_truncated() -> None:
    data = (BAD_DIR / "truncated.jpg").read_bytes()
    with pytest.raises(fastdata.DecodeError, match="(?i)premature|corrupt"):
        fastdata.decode(data, strict=True)
    img = fastdata.decode(data, strict=False)
    assert img.shape == (96, 128, 3)
    # The upper part (before the cut) is the picture.
    ref = fastdata.decode(good_small_jpeg())
    assert psnr(img[:24], ref[:24]) >= 40.0
    with fastdata.Engine(1) as engine:
        out = np.zeros((1, 96, 128, 3), np.uint8)
        report = engine.run([data], WHOLE, out)
        assert not report.failures and report.warnings > 0
        report = engine.run([data], WHOLE, out, strict=True)
        assert report.failed_rows == [0] and not out.any()  # failed row zero-filled


def test_corrupt_entropy_warns() -> None:
    data = (BAD_DIR / "corrupt_entropy.jpg").read_bytes()
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(data, strict=True)
    assert fastdata.decode(data, strict=False).shape == (96, 128, 3)
    with fastdata.Engine(1) as engine:
        report = engine.run([data], WHOLE, np.zeros((1, 96, 128, 3), np.uint8))
    assert report.warnings > 0 and not report.failures


def test_valid_image_right_after_garbage(good: bytes) -> None:
    # One thread: the same libjpeg decoder object handles every sample in turn.
    garbage = list(generated_bad(good).values()) + [(BAD_DIR / n).read_bytes() for n in ASSETS[:4]]
    ref = fastdata.decode_batch([good], RRC, seed=1, indices=[3], threads=1)
    with fastdata.Engine(1) as engine:
        for bad in garbage:
            out = np.zeros((1, 32, 32, 3), np.uint8)
            engine.run([bad], RRC, out, strict=True)
            engine.run([good], RRC, out, seed=1, indices=[3])
            assert np.array_equal(out, ref)
        # interleaved within one batch
        items = [x for bad in garbage for x in (bad, good)]
        out = np.zeros((len(items), 32, 32, 3), np.uint8)
        engine.run(items, RRC, out, seed=1, indices=[3] * len(items), strict=True)
        for row in range(1, len(items), 2):
            assert np.array_equal(out[row], ref[0]), row
    for bad in garbage:  # and the functional API's per-thread decoder
        with pytest.raises(fastdata.DecodeError):
            fastdata.decode(bad, strict=True)
        assert np.array_equal(fastdata.decode(good), fastdata.decode(bytes(good)))


def test_on_error_raise_lists_every_failed_index(good: bytes, tmp_path: Path) -> None:
    bad = generated_bad(good)
    path = tmp_path / "zero_width.jpg"
    path.write_bytes(bad["zero_width"])
    items = [good, bad["empty"], good, str(path), bad["12bit_sof1"], good]
    indices = [100, 101, 102, 103, 104, 105]
    with pytest.raises(fastdata.BatchDecodeError) as e:
        fastdata.decode_batch(items, RRC, indices=indices, threads=2)
    err = e.value
    assert isinstance(err, fastdata.DecodeError) and isinstance(err, ValueError)
    assert [f.index for f in err.failures] == [101, 103, 104]
    named = {f.index: f.name for f in err.failures}
    assert named[103] == str(path) and named[101] is None
    for f in err.failures:
        assert isinstance(f, fastdata.DecodeError) and f.reason
        assert f"sample {f.index}" in str(err)
    assert str(path) in str(err)


def test_on_error_skip_zero_fills_and_keeps_good_rows(good: bytes) -> None:
    bad = generated_bad(good)
    items = [good, bad["60000x60000"], good, (BAD_DIR / "html_page.JPEG").read_bytes(), good, b""]
    out = np.full((len(items), 32, 32, 3), 77, np.uint8)
    got, failures = fastdata.decode_batch(items, RRC, out, seed=2, threads=2, on_error="skip")
    assert got is out
    assert sorted(f.index for f in failures) == [1, 3, 5]
    for row in (1, 3, 5):
        assert not out[row].any()
    clean = fastdata.decode_batch([good, good, good], RRC, seed=2, indices=[0, 2, 4], threads=1)
    assert np.array_equal(out[[0, 2, 4]], clean)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP", "asset"])
def test_non_jpeg_in_a_batch_goes_through_the_same_crop(fmt: str, good: bytes) -> None:
    if fmt == "asset":
        data = (BAD_DIR / "png_named.JPEG").read_bytes()
    else:
        data = encode(photo(100, 140, seed=5), fmt)
    ref_img = pil_oriented(data)
    t = fastdata.RandomResizedCrop(40)
    n = 6
    items: List[object] = [data] * n
    items.insert(2, good)  # a JPEG among them keeps its own row
    indices = np.array([10, 11, 50, 12, 13, 14, 15])
    with fastdata.Engine(2) as engine:
        out = np.zeros((n + 1, 40, 40, 3), np.uint8)
        report = engine.run(items, t, out, seed=3, indices=indices)
    assert not report.failures and report.fallbacks == n
    boxes = fastdata._C.sample_crop_boxes(ref_img.height, ref_img.width, t.scale, t.ratio, t.hflip, 3, 0, indices)
    for row in range(n + 1):
        if row == 2:
            continue
        top, left, h, w, flip = (int(v) for v in boxes[row])
        ref = pil_crop_resize(ref_img, top, left, h, w, (40, 40), bool(flip))
        assert psnr(out[row], ref) >= 40.0, row  # no DCT scaling on this path: near-exact
    jpeg_row = fastdata.decode_batch([good], t, seed=3, indices=[50], threads=1)[0]
    assert np.array_equal(out[2], jpeg_row)
    # decode_batch (raise mode) accepts it too
    assert fastdata.decode_batch([data], t, seed=3, indices=[10])[0].tolist() == out[0].tolist()
