"""fastdata.probe: header fields for every JPEG kind, DecodeError for everything else.

Oracle for sizes/orientation: what was encoded (and Pillow's own reading of the header).
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import fastdata
from imagegen_native import encode, jpeg, photo, scan_start, with_adobe_transform, with_sof

H, W = 72, 104


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return photo(H, W, seed=3)


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("progressive", [False, True])
def test_rgb_fields(pixels: np.ndarray, subsampling: str, progressive: bool) -> None:
    info = fastdata.probe(jpeg(pixels, subsampling=subsampling, progressive=progressive))
    assert (info.width, info.height) == (W, H)
    assert (info.oriented_width, info.oriented_height) == (W, H)
    assert info.color_space == "ycbcr"
    assert info.subsampling == subsampling
    assert info.progressive is progressive
    assert info.orientation == 1


def test_gray_fields(pixels: np.ndarray) -> None:
    info = fastdata.probe(jpeg(Image.fromarray(pixels).convert("L")))
    assert (info.color_space, info.subsampling, info.components) == ("gray", "gray", 1)
    assert (info.width, info.height) == (W, H)


def test_cmyk_and_ycck_fields(pixels: np.ndarray) -> None:
    data = jpeg(Image.fromarray(pixels).convert("CMYK"))
    info = fastdata.probe(data)
    assert (info.color_space, info.components) == ("cmyk", 4)
    assert fastdata.probe(with_adobe_transform(data, 2)).color_space == "ycck"


def test_sampling_factors_from_the_header(pixels: np.ndarray) -> None:
    # 4:4:0 and 4:1:1 cannot be written by Pillow: rewrite the luma sampling factors of a
    # 4:4:4 header (probe reads the header only, so the scan need not match).
    data = jpeg(pixels, subsampling="4:4:4")
    assert fastdata.probe(with_sof(data, sampling=(0, 0x12))).subsampling == "4:4:0"
    assert fastdata.probe(with_sof(data, sampling=(0, 0x41))).subsampling == "4:1:1"
    assert fastdata.probe(with_sof(data, sampling=(1, 0x22))).subsampling == "other"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_and_oriented_size(pixels: np.ndarray, orientation: int) -> None:
    data = jpeg(pixels, orientation=orientation)  # stored so that the oriented image is W x H
    info = fastdata.probe(data)
    with Image.open(io.BytesIO(data)) as im:
        stored = im.size
        exif_orientation = im.getexif().get(0x0112)
    assert exif_orientation == orientation
    assert (info.width, info.height) == stored
    assert info.orientation == orientation
    assert (info.oriented_width, info.oriented_height) == (W, H)
    transposed = orientation >= 5
    assert stored == ((H, W) if transposed else (W, H))


def test_probe_matches_decode_shape(pixels: np.ndarray) -> None:
    for orientation in (1, 6):
        data = jpeg(pixels, orientation=orientation)
        info = fastdata.probe(data)
        assert fastdata.decode(data).shape == (info.oriented_height, info.oriented_width, 3)


def test_probe_does_not_need_the_scan(pixels: np.ndarray) -> None:
    # Header only: a file cut right after SOS still probes.
    data = jpeg(pixels)
    info = fastdata.probe(data[:scan_start(data)])
    assert (info.width, info.height) == (W, H)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_non_jpeg_raises(pixels: np.ndarray, fmt: str) -> None:
    with pytest.raises(fastdata.DecodeError):
        fastdata.probe(encode(pixels, fmt))


@pytest.mark.parametrize("data", [b"", b"\xff\xd8", b"<html><body>Not found</body></html>",
                                  b"\xff\xd8\xff" + bytes(range(256)) * 4])
def test_garbage_raises(data: bytes) -> None:
    with pytest.raises(fastdata.DecodeError) as e:
        fastdata.probe(data)
    assert isinstance(e.value, ValueError) and e.value.reason


def test_probe_rejects_str() -> None:
    with pytest.raises(TypeError):
        fastdata.probe("image.jpg")  # type: ignore[arg-type]
