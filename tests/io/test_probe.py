"""fastdata.probe: header fields for every JPEG kind; DecodeError for anything else.

Oracle for sizes/orientation: what was encoded, and Pillow's own reading of the header.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import fastdata
from imagegen import (adobe_transform, encode_jpeg, encode_other, make_12bit, patch_sof, photo_like, sos_offset,
                      truncate_scan)

H, W = 97, 131  # odd sizes: partial MCUs on both edges, and H != W to catch swapped axes


@pytest.fixture(scope="module")
def img() -> Image.Image:
    return photo_like(H, W, index=3)


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("progressive", [False, True])
def test_rgb_fields(img, subsampling, progressive):
    info = fastdata.probe(encode_jpeg(img, subsampling=subsampling, progressive=progressive))
    assert isinstance(info, fastdata.ImageInfo)
    assert (info.width, info.height) == (W, H)
    assert (info.oriented_width, info.oriented_height) == (W, H)
    assert info.color_space == "ycbcr"
    assert info.subsampling == subsampling
    assert info.progressive is progressive
    assert info.orientation == 1


def test_rare_subsamplings():
    # Pillow cannot write 4:4:0 or 4:1:1; relabelling the luma sampling factors of a 4:2:2
    # (or 4:2:0) file whose size is a whole number of MCUs gives a valid file of that kind.
    base = photo_like(96, 128, index=1)
    info = fastdata.probe(patch_sof(encode_jpeg(base, subsampling="4:2:2"), sampling=(0, 0x12)))
    assert info.subsampling == "4:4:0"
    info = fastdata.probe(patch_sof(encode_jpeg(base, subsampling="4:2:0"), sampling=(0, 0x41)))
    assert info.subsampling == "4:1:1"
    # Chroma sampled finer than luma has no name: reported as "other".
    info = fastdata.probe(patch_sof(encode_jpeg(base, subsampling="4:4:4"), sampling=(1, 0x22)))
    assert info.subsampling == "other"


def test_gray(img):
    info = fastdata.probe(encode_jpeg(img.convert("L")))
    assert (info.width, info.height) == (W, H)
    assert (info.color_space, info.subsampling, info.components) == ("gray", "gray", 1)
    assert info.progressive is False


def test_cmyk_and_ycck(img):
    data = encode_jpeg(img.convert("CMYK"))
    info = fastdata.probe(data)
    assert (info.color_space, info.components) == ("cmyk", 4)
    assert (info.width, info.height) == (W, H)
    assert fastdata.probe(adobe_transform(data, 2)).color_space == "ycck"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation(img, orientation):
    data = encode_jpeg(img, orientation=orientation)  # stored as W x H, tagged
    info = fastdata.probe(data)
    with Image.open(io.BytesIO(data)) as im:  # the tag really is in the file
        assert im.getexif().get(0x0112) == orientation
        assert im.size == (W, H)
    assert info.orientation == orientation
    assert (info.width, info.height) == (W, H)  # as stored
    # 5..8 transpose the axes
    want = (H, W) if orientation >= 5 else (W, H)
    assert (info.oriented_width, info.oriented_height) == want


def test_probe_matches_decode_shape(img):
    for orientation in (1, 6):
        data = encode_jpeg(img, orientation=orientation)
        info = fastdata.probe(data)
        assert fastdata.decode(data).shape == (info.oriented_height, info.oriented_width, 3)


def test_buffer_kinds(img):
    data = encode_jpeg(img)
    want = fastdata.probe(data)
    assert fastdata.probe(memoryview(data)) == want
    assert fastdata.probe(bytearray(data)) == want
    assert fastdata.probe(np.frombuffer(data, dtype=np.uint8)) == want


def test_header_only(img):
    # The entropy data is not read: a file cut right after SOS or partway through its scan
    # still probes, and so does one whose header claims a size far beyond any pixel limit.
    data = encode_jpeg(img)
    assert fastdata.probe(data[:sos_offset(data)]) == fastdata.probe(data)
    assert fastdata.probe(truncate_scan(data, 0.3)) == fastdata.probe(data)
    info = fastdata.probe(patch_sof(data, height=60000, width=60000))
    assert (info.width, info.height) == (60000, 60000)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_non_jpeg_raises(img, fmt):
    with pytest.raises(fastdata.DecodeError):
        fastdata.probe(encode_other(img, fmt))


@pytest.mark.parametrize("data", [b"", b"\xff", b"\xff\xd8", b"<!DOCTYPE html><html><body>404</body></html>",
                                  bytes(range(256)) * 4, b"\xff\xd8\xff" + bytes(range(256)) * 4],
                         ids=["empty", "one_byte", "soi_only", "html", "ramp", "soi_then_ramp"])
def test_garbage_raises(data):
    with pytest.raises(fastdata.DecodeError) as e:
        fastdata.probe(data)
    assert isinstance(e.value, ValueError) and e.value.reason


def test_12bit_header_is_reported_or_refused(img):
    # A header probe may report a 12-bit file (its fields are readable) or refuse it; it
    # must not crash or report a wrong size.
    data = make_12bit(encode_jpeg(img))
    try:
        info = fastdata.probe(data)
    except fastdata.DecodeError:
        return
    assert (info.width, info.height) == (W, H)


def test_str_is_rejected(tmp_path, img):
    path = tmp_path / "a.jpg"
    path.write_bytes(encode_jpeg(img))
    with pytest.raises(TypeError):
        fastdata.probe(str(path))
