"""fastdata.decode: full decode equals Pillow's exif_transpose(...).convert("RGB").

The issue's bound is a mean absolute difference of at most 1.0 per channel value (libjpeg
versions may differ in IDCT rounding). CMYK/YCCK use the same bound: measured 0.0 against
Pillow 13 (the engine uses Pillow's own CMYK->RGB formula), so 1.0 leaves room for IDCT
rounding only, not for a different conversion.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastdata
from imagegen import (adobe_transform, cmyk_jpeg, encode_jpeg, encode_other, icc_profile_bytes, mean_abs_diff,
                      patch_sof, photo_like, pillow_rgb, read_index, segments, sos_offset,
                      stored_for_orientation)

H, W = 97, 131
MAX_MAD = 1.0


@pytest.fixture(scope="module")
def img():
    return photo_like(H, W, index=37)


def check_matches_pillow(data: bytes, strict: bool = True) -> np.ndarray:
    got = fastdata.decode(data, strict=strict)
    want = pillow_rgb(data)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.uint8
    assert got.shape == want.shape
    assert got.flags.c_contiguous
    assert mean_abs_diff(got, want) <= MAX_MAD
    return got


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("progressive", [False, True])
def test_rgb(img, subsampling, progressive):
    got = check_matches_pillow(encode_jpeg(img, subsampling=subsampling, progressive=progressive))
    assert read_index(got) == 37


@pytest.mark.parametrize("kind,hv", [("4:4:0", (0, 0x12)), ("4:1:1", (0, 0x41))])
def test_rare_subsamplings(kind, hv):
    base = "4:2:2" if kind == "4:4:0" else "4:2:0"
    data = patch_sof(encode_jpeg(photo_like(96, 128, 2), subsampling=base), sampling=hv)
    check_matches_pillow(data)


def test_gray_is_replicated(img):
    got = check_matches_pillow(encode_jpeg(img.convert("L")))
    assert np.array_equal(got[..., 0], got[..., 1]) and np.array_equal(got[..., 0], got[..., 2])


@pytest.mark.parametrize("progressive", [False, True])
def test_gray_progressive(img, progressive):
    check_matches_pillow(encode_jpeg(img.convert("L"), progressive=progressive))


@pytest.mark.parametrize("blocks,rows", [(1, 0), (3, 0), (0, 1)])
def test_restart_markers(img, blocks, rows):
    data = encode_jpeg(img, restart_blocks=blocks, restart_rows=rows)
    # the generator really wrote them: a DRI segment and RSTn markers in the scan
    assert any(marker == 0xDD for marker, _, _ in segments(data))
    scan = data[sos_offset(data):]
    assert b"\xff\xd0" in scan and b"\xff\xd1" in scan
    check_matches_pillow(data)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("subsampling", ["4:2:0", "4:2:2"])
def test_orientation(img, orientation, subsampling):
    got = check_matches_pillow(encode_jpeg(img, orientation=orientation, subsampling=subsampling))
    assert got.shape[:2] == ((W, H) if orientation >= 5 else (H, W))
    # independent of the Pillow oracle: stored pixels pre-rotated the other way come out upright
    upright = check_matches_pillow(encode_jpeg(stored_for_orientation(img, orientation), orientation=orientation,
                                               subsampling=subsampling))
    assert upright.shape[:2] == (H, W)
    assert read_index(upright) == 37
    assert mean_abs_diff(upright, np.asarray(img)) < 8  # q90 loss measured ~4.7


def test_orientation_progressive(img):
    check_matches_pillow(encode_jpeg(img, orientation=6, progressive=True))


def test_icc_profile(img):
    small = icc_profile_bytes()
    check_matches_pillow(encode_jpeg(img, icc_profile=small))
    # > 64 KB: Pillow splits it over several APP2 segments
    big = small + bytes(70_000)
    check_matches_pillow(encode_jpeg(img, icc_profile=big))


def test_trailing_bytes(img):
    data = encode_jpeg(img)
    ref = fastdata.decode(data)
    for tail in (b"\x00" * 100, b"\xff\xd9junk after EOI" * 10, bytes(range(256))):
        got = fastdata.decode(data + tail)
        assert np.array_equal(got, ref)


def test_cmyk():
    check_matches_pillow(cmyk_jpeg(H, W, index=5))


def test_ycck():
    # Pillow cannot write YCCK; flipping the Adobe transform flag of a CMYK file gives a
    # valid YCCK file (its colours differ, but Pillow decodes the same bytes as the oracle).
    check_matches_pillow(adobe_transform(cmyk_jpeg(H, W, index=5), 2))


@pytest.mark.parametrize("size", [(1, 1), (1, 17), (17, 1), (8, 8), (16, 16), (600, 8)])
def test_tiny_and_thin(size):
    h, w = size
    check_matches_pillow(encode_jpeg(photo_like(h, w, 1)))


def test_buffer_kinds(img):
    data = encode_jpeg(img)
    ref = fastdata.decode(data)
    assert np.array_equal(fastdata.decode(memoryview(data)), ref)
    assert np.array_equal(fastdata.decode(bytearray(data)), ref)
    assert np.array_equal(fastdata.decode(np.frombuffer(data, dtype=np.uint8)), ref)
    # a slice of a larger buffer (not starting at offset 0 of its allocation)
    padded = np.frombuffer(b"xyz" + data + b"abc", dtype=np.uint8)[3:-3]
    assert np.array_equal(fastdata.decode(padded), ref)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_non_jpeg_fallback(img, fmt):
    data = encode_other(img, fmt)
    got = fastdata.decode(data)
    assert got.dtype == np.uint8 and got.shape == (H, W, 3)
    assert np.array_equal(got, pillow_rgb(data))


def test_non_jpeg_orientation(img):
    # EXIF orientation applies to the fallback too
    import io

    exif = img.getexif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, "PNG", exif=exif.tobytes())
    got = fastdata.decode(buf.getvalue())
    assert got.shape == (W, H, 3)
    assert np.array_equal(got, pillow_rgb(buf.getvalue()))


def test_max_pixels(img):
    data = encode_jpeg(img)
    assert fastdata.decode(data, max_pixels=H * W).shape == (H, W, 3)
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(data, max_pixels=H * W - 1)
    png = encode_other(img, "PNG")
    assert fastdata.decode(png, max_pixels=H * W).shape == (H, W, 3)
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(png, max_pixels=H * W - 1)


def test_default_max_pixels_is_pillows():
    from PIL import Image

    assert fastdata.DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS
