"""fastdata.decode (full decode, native path) against Pillow's decode + exif_transpose.

The oracle is ``ImageOps.exif_transpose(Image.open(f)).convert("RGB")``; the bound is the
issue's mean absolute difference <= 1.0. Each case also checks the result against the
pixels that were encoded (loose: JPEG loss only), so an orientation bug shared by both
decoders would still be caught.
"""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageCms

import fastdata
from imagegen_native import (encode, has_marker, jpeg, mad, photo, pil_rgb, scan_start, segments,
                             with_adobe_transform)

H, W = 120, 168  # not multiples of 16: partial MCUs at the right and bottom edges


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return photo(H, W, seed=11)


def check_against_pillow(data: bytes, original: np.ndarray, *, jpeg_loss: float = 6.0) -> np.ndarray:
    out = fastdata.decode(data)
    ref = pil_rgb(data)
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    assert out.shape == ref.shape
    assert mad(out, ref) <= 1.0
    assert mad(out, original) <= jpeg_loss  # the right picture, the right way up
    return out


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("progressive", [False, True])
def test_rgb_subsampling_and_progressive(pixels: np.ndarray, subsampling: str, progressive: bool) -> None:
    data = jpeg(pixels, subsampling=subsampling, progressive=progressive)
    assert fastdata.probe(data).subsampling == subsampling
    check_against_pillow(data, pixels)


@pytest.mark.parametrize("progressive", [False, True])
def test_grayscale_is_replicated(pixels: np.ndarray, progressive: bool) -> None:
    gray = Image.fromarray(pixels).convert("L")
    data = jpeg(gray, progressive=progressive)
    out = check_against_pillow(data, np.asarray(gray.convert("RGB")))
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 0], out[..., 2])


def test_restart_markers(pixels: np.ndarray) -> None:
    # Pillow >= 11 writes DRI + RSTn with restart_marker_blocks (libjpeg-turbo's restart_interval).
    data = jpeg(pixels, restart_blocks=3)
    assert has_marker(data, 0xDD)
    scan = data[scan_start(data):]
    assert sum(scan.count(bytes([0xFF, 0xD0 + k])) for k in range(8)) > 10
    check_against_pillow(data, pixels)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("progressive", [False, True])
def test_exif_orientations(pixels: np.ndarray, orientation: int, progressive: bool) -> None:
    data = jpeg(pixels, orientation=orientation, progressive=progressive)
    out = check_against_pillow(data, pixels)
    assert out.shape == (H, W, 3)  # oriented size, whatever was stored


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:0"])
def test_orientation_with_odd_sizes(subsampling: str) -> None:
    # 4:2:0 with odd sizes: the stored image has half chroma blocks at its edges.
    original = photo(37, 53, seed=4)
    for orientation in (3, 6, 7):
        check_against_pillow(jpeg(original, orientation=orientation, subsampling=subsampling), original,
                             jpeg_loss=8.0)


def test_embedded_icc_profile_is_ignored(pixels: np.ndarray) -> None:
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    data = jpeg(pixels, icc_profile=icc)
    assert has_marker(data, 0xE2)  # APP2 ICC_PROFILE
    out = check_against_pillow(data, pixels)
    assert np.array_equal(out, fastdata.decode(jpeg(pixels)))  # same pixels as without the profile


def test_trailing_bytes_after_eoi(pixels: np.ndarray) -> None:
    data = jpeg(pixels)
    # Garbage that even looks like markers (another SOI, an EOI) after the real EOI.
    padded = data + b"\x00" * 100 + b"\xff\xd8\xff\xe0junk\xff\xd9" + bytes(range(256))
    out = check_against_pillow(padded, pixels)
    assert np.array_equal(out, fastdata.decode(data))


def test_cmyk_adobe_inverted_matches_pillow(pixels: np.ndarray) -> None:
    # Pillow writes CMYK JPEGs the way Photoshop does: Adobe APP14, inverted ink values.
    cmyk = Image.fromarray(pixels).convert("CMYK")
    data = jpeg(cmyk)
    assert fastdata.probe(data).color_space == "cmyk"
    out = fastdata.decode(data)
    ref = pil_rgb(data)
    # Measured: identical (MAD 0.0, max 0): the engine uses Pillow's cmyk2rgb arithmetic.
    assert mad(out, ref) <= 1.0
    assert int(np.abs(out.astype(np.int16) - ref).max()) <= 2
    # And it is the picture (RGB -> CMYK -> JPEG -> RGB through Pillow's naive CMYK model).
    assert mad(out, pixels) <= 8.0


def test_ycck_matches_pillow(pixels: np.ndarray) -> None:
    # Adobe transform=2 makes libjpeg read the same 4 channels as YCCK (the colours change,
    # but both decoders must agree on them).
    data = with_adobe_transform(jpeg(Image.fromarray(pixels).convert("CMYK")), 2)
    assert fastdata.probe(data).color_space == "ycck"
    out = fastdata.decode(data)
    assert mad(out, pil_rgb(data)) <= 1.0


def test_buffer_kinds_give_the_same_pixels(pixels: np.ndarray) -> None:
    data = jpeg(pixels)
    ref = fastdata.decode(data)
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8)):
        assert np.array_equal(fastdata.decode(buf), ref)
    with pytest.raises(TypeError):
        fastdata.decode("not/bytes.jpg")  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_non_jpeg_decodes_through_pillow(pixels: np.ndarray, fmt: str) -> None:
    data = encode(pixels, fmt)
    out = fastdata.decode(data)
    assert np.array_equal(out, pil_rgb(data))  # the fallback *is* Pillow
    if fmt != "GIF":  # GIF is palettised: lossy
        assert np.array_equal(out, pixels)


def test_segments_walker_sees_the_exif_segment(pixels: np.ndarray) -> None:
    # Guards the helper the orientation tests rely on: the tag really is in the file.
    data = jpeg(pixels, orientation=6)
    assert any(m == 0xE1 for m, _, _ in segments(data))
    assert fastdata.probe(data).orientation == 6


@pytest.mark.parametrize("subsampling", ["4:1:1", "4:4:0"])
def test_opencv_written_411_and_440(pixels: np.ndarray, subsampling: str) -> None:
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2, "IMWRITE_JPEG_SAMPLING_FACTOR"):
        pytest.skip("OpenCV too old to choose JPEG subsampling")
    from imagegen_native import opencv_jpeg
    data = opencv_jpeg(pixels, subsampling)
    assert fastdata.probe(data).subsampling == subsampling
    check_against_pillow(data, pixels, jpeg_loss=8.0)
