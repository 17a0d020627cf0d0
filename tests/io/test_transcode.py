"""_C.transcode_to_baseline: lossless progressive -> baseline JPEG (fastdata-convert's default).

The oracle is fastdata's own decode of the progressive original: the transcode keeps the
DCT coefficients, so the pixels must be bit-identical, not merely close.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms

import fastdata
from fastdata import _C
from imagegen import corrupt_entropy, encode_jpeg, encode_oriented, photo_like, segments, truncate_scan


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.asarray(photo_like(height, width, seed=seed))


def jpeg(pixels, **kwargs) -> bytes:
    """``encode_jpeg`` for an array or an image."""
    return encode_jpeg(pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels), **kwargs)

H, W = 120, 168  # not multiples of 16: partial MCUs at the right and bottom edges

APP1, APP2, APP13, COM = 0xE1, 0xE2, 0xED, 0xFE
SOF0, SOF1, SOF2 = 0xC0, 0xC1, 0xC2


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return photo(H, W, seed=5)


def sof(data: bytes) -> int:
    return next(m for m, _, _ in segments(data) if 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC))


def check_lossless(data: bytes) -> bytes:
    """Transcode; the result is sequential and decodes to exactly the original's pixels."""
    before = fastdata.probe(data)
    assert before.progressive
    out = _C.transcode_to_baseline(data, 0)
    after = fastdata.probe(out)
    assert not after.progressive and sof(out) in (SOF0, SOF1)
    assert sum(1 for m, _, _ in segments(out) if m == 0xDA) == 1  # one interleaved scan
    assert (after.width, after.height, after.subsampling, after.color_space, after.orientation) == (
        before.width, before.height, before.subsampling, before.color_space, before.orientation)
    np.testing.assert_array_equal(fastdata.decode(out), fastdata.decode(data))
    return out


@pytest.mark.parametrize("subsampling", ["4:2:0", "4:2:2", "4:4:4"])
def test_rgb_bit_identical(pixels: np.ndarray, subsampling: str) -> None:
    check_lossless(jpeg(pixels, subsampling=subsampling, progressive=True))


def test_grayscale_bit_identical(pixels: np.ndarray) -> None:
    gray = Image.fromarray(pixels).convert("L")
    out = check_lossless(jpeg(gray, progressive=True))
    assert fastdata.probe(out).components == 1


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_kept(pixels: np.ndarray, orientation: int) -> None:
    data = encode_oriented(Image.fromarray(pixels), orientation, progressive=True)
    out = check_lossless(data)  # decode applies EXIF orientation: equal decodes = same orientation
    assert fastdata.probe(out).orientation == orientation
    assert fastdata.decode(out).shape[:2] == (H, W)  # the oriented image (stored transposed for 6, 8)


def test_icc_kept_other_markers_dropped(pixels: np.ndarray) -> None:
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    img = Image.fromarray(pixels)
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    img.save(buf, "JPEG", progressive=True, quality=90, icc_profile=icc, exif=exif.tobytes(),
             comment=b"dropped")
    data = buf.getvalue()
    assert any(m == COM for m, _, _ in segments(data))
    out = check_lossless(data)
    assert Image.open(io.BytesIO(out)).info.get("icc_profile") == icc
    assert Image.open(io.BytesIO(out)).getexif().get(0x0112) == 6
    assert not any(m == COM for m, _, _ in segments(out))


def test_restart_markers_and_baseline_input(pixels: np.ndarray) -> None:
    check_lossless(jpeg(pixels, progressive=True, restart_blocks=4))
    base = jpeg(pixels)  # a baseline input is rewritten too (the caller decides whether to ask)
    out = _C.transcode_to_baseline(base, 0)
    np.testing.assert_array_equal(fastdata.decode(out), fastdata.decode(base))


@pytest.mark.parametrize("damage", ["truncated", "corrupt0", "corrupt1", "corrupt2"])
def test_damaged_input_raises(pixels: np.ndarray, damage: str) -> None:
    good = jpeg(pixels, progressive=True)
    bad = truncate_scan(good, 0.5) if damage == "truncated" else corrupt_entropy(good, seed=int(damage[-1]), count=20)
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(bad)  # strict decode refuses it ...
    with pytest.raises(_C.NativeDecodeError):
        _C.transcode_to_baseline(bad, 0)  # ... and so does the transcode: never a clean-looking copy


def test_damaged_assets_and_non_jpeg(damaged_dir: Path) -> None:
    for name in ("truncated.jpg", "corrupt_entropy.jpg", "random_bytes.jpg", "html_page.JPEG", "png_named.JPEG"):
        with pytest.raises(_C.NativeDecodeError):
            _C.transcode_to_baseline((damaged_dir / name).read_bytes(), 0)
    with pytest.raises(_C.NativeDecodeError, match="empty"):
        _C.transcode_to_baseline(b"", 0)


def test_cmyk_refused(pixels: np.ndarray) -> None:
    cmyk = jpeg(Image.fromarray(pixels).convert("CMYK"), progressive=True)
    with pytest.raises(ValueError, match="CMYK"):
        _C.transcode_to_baseline(cmyk, 0)


def test_accepts_buffers(pixels: np.ndarray) -> None:
    data = jpeg(pixels, progressive=True)
    ref = _C.transcode_to_baseline(data, 0)
    assert _C.transcode_to_baseline(memoryview(data), 0) == ref
    assert _C.transcode_to_baseline(np.frombuffer(data, np.uint8), 0) == ref  # deterministic, any buffer


def test_large_output_grows_buffer() -> None:
    # Camera-like grain makes a file of ~100+ KB: the output buffer (started at half the
    # input) must grow while Huffman data is being written, mid-MCU.
    rng = np.random.default_rng(0)
    noisy = np.clip(photo(480, 640, seed=9) + rng.normal(0, 12, (480, 640, 3)), 0, 255).astype(np.uint8)
    data = jpeg(noisy, progressive=True, quality=95)
    assert len(data) > 100_000
    out = check_lossless(data)
    assert 0.8 < len(out) / len(data) < 1.25


def test_pixel_limit_refused_before_any_coefficient_allocation(pixels: np.ndarray) -> None:
    data = jpeg(pixels, progressive=True)
    with pytest.raises(_C.NativeDecodeError, match="above the limit"):
        _C.transcode_to_baseline(data, H * W - 1)
    assert _C.transcode_to_baseline(data, H * W) == _C.transcode_to_baseline(data, 0)
