"""fastdata.decode: full decode equals Pillow's exif_transpose(...).convert("RGB").

The issue's bound is a mean absolute difference of at most 1.0 per channel value (libjpeg
versions may differ in IDCT rounding). CMYK/YCCK use the same bound: measured 0.0 against
Pillow 13 (the engine uses Pillow's own CMYK->RGB formula), so 1.0 leaves room for IDCT
rounding only, not for a different conversion. Where the encoded picture is known, the
result is also compared with it (loosely: JPEG loss only), so an orientation bug shared by
both decoders would still be caught.
"""
from __future__ import annotations

import io
from typing import Optional

import numpy as np
import pytest
from PIL import Image

import fastdata
from imagegen import (adobe_transform, encode_jpeg, encode_oriented, encode_other, has_marker, icc_profile_bytes,
                      mean_abs_diff, opencv_jpeg, patch_sof, photo_like, pillow_rgb, read_index, sos_offset)

H, W = 97, 131  # odd: partial MCUs (and half chroma blocks) at the right and bottom edges
MAX_MAD = 1.0
JPEG_LOSS = 6.0  # vs the encoded picture at quality 90; measured 3.9 (4:4:4) .. 5.3 (4:2:0)


@pytest.fixture(scope="module")
def img() -> Image.Image:
    return photo_like(H, W, index=37)


def check_matches_pillow(data: bytes, original: Optional[Image.Image] = None, *, strict: bool = True,
                         jpeg_loss: float = JPEG_LOSS) -> np.ndarray:
    """Decode ``data``; it must match Pillow's decode and (when given) the encoded picture."""
    got = fastdata.decode(data, strict=strict)
    want = pillow_rgb(data)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.uint8
    assert got.shape == want.shape
    assert got.flags.c_contiguous
    assert mean_abs_diff(got, want) <= MAX_MAD
    if original is not None:  # the right picture, the right way up
        assert mean_abs_diff(got, np.asarray(original.convert("RGB"))) <= jpeg_loss
    return got


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("progressive", [False, True])
def test_rgb(img, subsampling, progressive):
    data = encode_jpeg(img, subsampling=subsampling, progressive=progressive)
    assert fastdata.probe(data).subsampling == subsampling
    got = check_matches_pillow(data, img)
    assert read_index(got) == 37


@pytest.mark.parametrize("kind,hv", [("4:4:0", (0, 0x12)), ("4:1:1", (0, 0x41))])
def test_rare_subsamplings_relabelled(kind, hv):
    # Pillow cannot write them: relabel the luma factors of a file with whole MCUs (the
    # picture changes, but Pillow decodes the same bytes as the oracle).
    base = "4:2:2" if kind == "4:4:0" else "4:2:0"
    data = patch_sof(encode_jpeg(photo_like(96, 128, 2), subsampling=base), sampling=hv)
    assert fastdata.probe(data).subsampling == kind
    check_matches_pillow(data)


@pytest.mark.parametrize("subsampling", ["4:1:1", "4:4:0"])
def test_rare_subsamplings_written_by_opencv(img, subsampling):
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2, "IMWRITE_JPEG_SAMPLING_FACTOR"):
        pytest.skip("OpenCV too old to choose JPEG subsampling")
    data = opencv_jpeg(img, subsampling)
    assert fastdata.probe(data).subsampling == subsampling
    check_matches_pillow(data, img, jpeg_loss=8.0)


@pytest.mark.parametrize("progressive", [False, True])
def test_gray_is_replicated(img, progressive):
    gray = img.convert("L")
    got = check_matches_pillow(encode_jpeg(gray, progressive=progressive), gray)
    assert np.array_equal(got[..., 0], got[..., 1]) and np.array_equal(got[..., 0], got[..., 2])


@pytest.mark.parametrize("blocks,rows", [(1, 0), (3, 0), (0, 1)])
def test_restart_markers(img, blocks, rows):
    data = encode_jpeg(img, restart_blocks=blocks, restart_rows=rows)
    # The generator really wrote them: a DRI segment, and one RSTn between every two
    # restart intervals of the 9 x 7 MCUs (16x16 for 4:2:0).
    assert has_marker(data, 0xDD)
    scan = data[sos_offset(data):]
    interval = blocks or rows * 9
    assert sum(scan.count(bytes([0xFF, 0xD0 + k])) for k in range(8)) == -(-63 // interval) - 1
    check_matches_pillow(data, img)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("variant", ["4:4:4", "4:2:2", "4:2:0", "progressive"])
def test_orientation(img, orientation, variant):
    kwargs = dict(progressive=True) if variant == "progressive" else dict(subsampling=variant)
    # stored as encoded, tagged: the oriented size swaps for 5..8
    got = check_matches_pillow(encode_jpeg(img, orientation=orientation, **kwargs))
    assert got.shape[:2] == ((W, H) if orientation >= 5 else (H, W))
    # stored pre-rotated the other way: comes out upright, the encoded picture
    upright = check_matches_pillow(encode_oriented(img, orientation, **kwargs), img)
    assert upright.shape == (H, W, 3)
    assert read_index(upright) == 37


def test_icc_profile(img):
    plain = fastdata.decode(encode_jpeg(img))
    small = icc_profile_bytes()
    big = small + bytes(70_000)  # > 64 KB: Pillow splits it over several APP2 segments
    for icc in (small, big):
        data = encode_jpeg(img, icc_profile=icc)
        assert has_marker(data, 0xE2)  # APP2 ICC_PROFILE
        got = check_matches_pillow(data, img)
        assert np.array_equal(got, plain)  # the profile is ignored: same pixels as without it


def test_trailing_bytes(img):
    data = encode_jpeg(img)
    ref = fastdata.decode(data)
    # including garbage that looks like markers (another SOI, an EOI) after the real EOI
    for tail in (b"\x00" * 100, b"\xff\xd9junk after EOI" * 10, bytes(range(256)),
                 b"\x00" * 100 + b"\xff\xd8\xff\xe0junk\xff\xd9" + bytes(range(256))):
        got = check_matches_pillow(data + tail, img)
        assert np.array_equal(got, ref)


def test_cmyk(img):
    # Pillow writes CMYK JPEGs the way Photoshop does: Adobe APP14, inverted ink values.
    data = encode_jpeg(img.convert("CMYK"))
    assert fastdata.probe(data).color_space == "cmyk"
    got = check_matches_pillow(data)
    # Measured: identical (MAD 0.0, max 0): the engine uses Pillow's cmyk2rgb arithmetic.
    assert int(np.abs(got.astype(np.int16) - pillow_rgb(data)).max()) <= 2
    # And it is the picture (RGB -> CMYK -> JPEG -> RGB through Pillow's naive CMYK model).
    assert mean_abs_diff(got, np.asarray(img)) <= 8.0


def test_ycck(img):
    # Pillow cannot write YCCK; flipping the Adobe transform flag of a CMYK file gives a
    # valid YCCK file (its colours differ, but Pillow decodes the same bytes as the oracle).
    data = adobe_transform(encode_jpeg(img.convert("CMYK")), 2)
    assert fastdata.probe(data).color_space == "ycck"
    check_matches_pillow(data)


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
    with pytest.raises(TypeError):
        fastdata.decode("not/bytes.jpg")  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_non_jpeg_fallback(img, fmt):
    data = encode_other(img, fmt)
    got = fastdata.decode(data)
    assert got.dtype == np.uint8 and got.shape == (H, W, 3)
    assert np.array_equal(got, pillow_rgb(data))  # the fallback *is* Pillow
    if fmt != "GIF":  # GIF is palettised: lossy
        assert np.array_equal(got, np.asarray(img))


def test_non_jpeg_orientation(img):
    # EXIF orientation applies to the fallback too
    exif = img.getexif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, "PNG", exif=exif.tobytes())
    got = fastdata.decode(buf.getvalue())
    assert got.shape == (W, H, 3)
    assert np.array_equal(got, pillow_rgb(buf.getvalue()))
