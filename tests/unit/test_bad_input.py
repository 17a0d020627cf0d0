"""Bad input never crashes the process and never passes as a good image.

Crash-prone kinds run in a child interpreter first: a segfault or abort() (libjpeg's
default error_exit calls exit()) shows as a non-zero return code instead of killing
pytest. The child prints one JSON line; the parent checks it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fastdata
from imagegen import (corrupt_entropy, encode_jpeg, encode_other, make_12bit, patch_sof, photo_like, pillow_rgb,
                      sos_offset, truncate_scan)

RRC = fastdata.RandomResizedCrop(32)
# (48, 64) output of a 48x64 image with resize 48: the region is the whole image, so the
# decoder must read every row (and reach the damage wherever it is).
WHOLE = fastdata.CenterCrop((48, 64), resize=48)


@pytest.fixture(scope="module")
def good() -> bytes:
    return encode_jpeg(photo_like(48, 64, index=5), quality=85)


def bad_inputs(good: bytes) -> dict:
    """name -> (bytes, decodes when not strict)"""
    sos = sos_offset(good)
    mid = sos + (len(good) - sos) // 2
    return {
        "empty": (b"", False),
        "truncated": (truncate_scan(good, 0.5), True),
        "truncated_in_header": (good[:sos - 10], False),
        "random_bytes": (np.random.default_rng(3).integers(0, 256, 3000, dtype=np.uint8).tobytes(), False),
        "soi_then_random": (b"\xff\xd8\xff" + np.random.default_rng(4).integers(0, 256, 3000, dtype=np.uint8).tobytes(),
                            False),
        "html": (b"<!DOCTYPE html><html><head><title>404 Not Found</title></head><body></body></html>", False),
        "corrupt_entropy": (corrupt_entropy(good, seed=7), True),
        "marker_in_scan": (good[:mid] + b"\xff\xd3" + good[mid:], True),
        "12bit": (make_12bit(good), False),
        "60000x60000": (patch_sof(good, height=60000, width=60000), False),
        "zero_width": (patch_sof(good, width=0), False),
        "zero_height": (patch_sof(good, height=0), False),
    }


CHILD = textwrap.dedent("""
    import json, resource, sys
    import fastdata
    path = sys.argv[1]
    data = open(path, "rb").read()
    result = {}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for strict in (True, False):
        try:
            result[f"decode_strict_{strict}"] = ["ok", list(fastdata.decode(data, strict=strict).shape)]
        except fastdata.DecodeError as e:
            result[f"decode_strict_{strict}"] = ["DecodeError", e.reason]
    try:
        fastdata.probe(data)
        result["probe"] = "ok"
    except fastdata.DecodeError:
        result["probe"] = "DecodeError"
    spec = fastdata.CenterCrop((48, 64), resize=48)
    for strict in (True, False):
        _, failures = fastdata.decode_batch([data, path], spec, strict=strict, on_error="skip", indices=[3, 4])
        result[f"batch_strict_{strict}"] = [[f.index, f.name, f.reason] for f in failures]
    result["rss_growth_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(json.dumps(result))
""")


BAD_NAMES = ["empty", "truncated", "truncated_in_header", "random_bytes", "soi_then_random", "html",
             "corrupt_entropy", "marker_in_scan", "12bit", "60000x60000", "zero_width", "zero_height"]


def test_bad_names_cover_all(good):
    assert sorted(bad_inputs(good)) == sorted(BAD_NAMES)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_in_subprocess(good, tmp_path, name):
    data, decodes_lenient = bad_inputs(good)[name]
    path = tmp_path / f"{name}.jpg"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, f"child died (rc={proc.returncode}): {proc.stderr[-2000:]}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    # strict: every kind here is an error
    assert r["decode_strict_True"][0] == "DecodeError", r
    assert r["decode_strict_True"][1], "DecodeError without a reason"
    failed = r["batch_strict_True"]
    assert [f[0] for f in failed] == [3, 4], failed                 # both rows, named by index
    assert failed[0][1] is None and failed[1][1] == str(path), failed  # path named for the str item
    # lenient: damaged-but-JPEG data decodes (warnings counted); the rest still fails
    if decodes_lenient:
        assert r["decode_strict_False"] == ["ok", [48, 64, 3]], r
        assert r["batch_strict_False"] == [], r
    else:
        assert r["decode_strict_False"][0] == "DecodeError", r
        assert [f[0] for f in r["batch_strict_False"]] == [3, 4], r
    assert r["rss_growth_mb"] < 64, f"{name}: peak RSS grew {r['rss_growth_mb']:.0f} MB"


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
    # the default limit is Pillow's: 60000x60000 is far above it
    with pytest.raises(fastdata.DecodeError) as e:
        fastdata.decode(patch_sof(good, height=60000, width=60000), strict=False)
    assert "60000" in str(e.value)


def test_strict_and_lenient_truncated(good):
    data = truncate_scan(good, 0.5)
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(data, strict=True)
    img = fastdata.decode(data, strict=False)
    assert img.shape == (48, 64, 3)
    # the top rows (before the cut) are the real image
    ref = fastdata.decode(good)
    assert np.abs(img[:8].astype(int) - ref[:8]).mean() < 1.0
    with fastdata.Engine(threads=1) as engine:
        out = np.zeros((1, 48, 64, 3), np.uint8)
        report = engine.run([data], WHOLE, out, strict=False)
        assert report.failures == [] and report.warnings >= 1
        report = engine.run([data], WHOLE, out, strict=True)
        assert [f.index for f in report.failures] == [0] and report.failed_rows == [0]
        assert not out.any()  # the failed row is zero-filled


def test_corrupt_entropy_strict_is_an_error(good):
    """libjpeg-turbo reports this file's damage (simplejpeg strict mode raises
    'Corrupt JPEG data: N extraneous bytes before marker 0xd9'); strict full decode must too."""
    data = corrupt_entropy(good, seed=7)
    simplejpeg = pytest.importorskip("simplejpeg")
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        simplejpeg.decode_jpeg(data, strict=True)  # the oracle agrees the data is corrupt
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(data, strict=True)


def test_batch_error_names_every_failure(good, tmp_path):
    bad = bad_inputs(good)
    missing = str(tmp_path / "does_not_exist.jpg")
    items = [good, bad["html"][0], good, missing, bad["12bit"][0], good] + [b""] * 9
    indices = list(range(100, 100 + len(items)))
    with pytest.raises(fastdata.BatchDecodeError) as e:
        fastdata.decode_batch(items, RRC, indices=indices)
    err = e.value
    assert isinstance(err, fastdata.DecodeError) and isinstance(err, ValueError)
    failed = [f.index for f in err.failures]
    assert failed == [101, 103, 104] + list(range(106, 115))
    named = {f.index: f.name for f in err.failures}
    assert named[103] == missing and named[101] is None
    assert all(f.reason for f in err.failures)
    assert "101" in str(err) and "does_not_exist.jpg" in str(err)


def test_skip_zero_fills_and_keeps_good_rows(good):
    bad = bad_inputs(good)
    items = [good, bad["random_bytes"][0], encode_jpeg(photo_like(100, 80, 2)), bad["zero_width"][0]]
    out = np.full((4, 32, 32, 3), 0xAB, np.uint8)
    got, failures = fastdata.decode_batch(items, RRC, out, seed=2, on_error="skip")
    assert got is out
    assert [f.index for f in failures] == [1, 3]
    assert not out[1].any() and not out[3].any()
    clean = fastdata.decode_batch([items[0], items[2]], RRC, seed=2, indices=[0, 2])
    assert np.array_equal(out[0], clean[0]) and np.array_equal(out[2], clean[1])


def test_valid_after_garbage(good):
    bad = bad_inputs(good)
    items = [good, encode_jpeg(photo_like(90, 120, 1), progressive=True)]
    with fastdata.Engine(threads=2) as fresh:
        want = np.zeros((2, 32, 32, 3), np.uint8)
        fresh.run(items, RRC, want)
    with fastdata.Engine(threads=2) as engine:
        for name, (data, lenient) in bad.items():
            if name == "60000x60000":
                continue  # refused before decoding: exercises nothing in the decoder state
            out = np.zeros((4, 32, 32, 3), np.uint8)
            report = engine.run([data] * 4, RRC, out, strict=True)
            if not lenient:  # (a random crop may end above the damage of the lenient kinds)
                assert len(report.failures) == 4, name
            got = np.zeros_like(want)
            report = engine.run(items, RRC, got)
            assert report.failures == [], name
            assert np.array_equal(got, want), f"wrong output right after {name}"
    # the single-image path reuses a per-thread decoder too
    for data, lenient in bad.values():
        if lenient:
            fastdata.decode(data, strict=False)
        else:
            with pytest.raises(fastdata.DecodeError):
                fastdata.decode(data, strict=True)
        assert np.array_equal(fastdata.decode(good), pillow_rgb(good))


def test_missing_file_named(tmp_path):
    missing = str(tmp_path / "nope.JPEG")
    with pytest.raises(fastdata.BatchDecodeError) as e:
        fastdata.decode_batch([missing], RRC, indices=[42])
    (f,) = e.value.failures
    assert f.index == 42 and f.name == missing and f.reason


# ------------------------------------------------------------------ checked-in regression files

DAMAGED = {
    # file -> (strict decode fails, lenient decode gives an image)
    "truncated.jpg": (True, True),
    "random_bytes.jpg": (True, False),
    "html_page.JPEG": (True, False),
    "corrupt_entropy.jpg": (True, True),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_assets(damaged_dir, name):
    data = (damaged_dir / name).read_bytes()
    assert len(data) < 10_000
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(data, strict=True)
    if DAMAGED[name][1]:
        assert fastdata.decode(data, strict=False).shape == (48, 64, 3)
    else:
        with pytest.raises(fastdata.DecodeError):
            fastdata.decode(data, strict=False)
    path = str(damaged_dir / name)
    _, failures = fastdata.decode_batch([path], WHOLE, strict=True, on_error="skip", indices=[9])
    assert [(f.index, f.name) for f in failures] == [(9, path)]


def test_png_named_jpeg_asset(damaged_dir):
    path = damaged_dir / "png_named.JPEG"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.array_equal(fastdata.decode(data), pillow_rgb(data))
    out = fastdata.decode_batch([str(path), data], RRC, indices=[1, 1])
    assert np.array_equal(out[0], out[1])
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
