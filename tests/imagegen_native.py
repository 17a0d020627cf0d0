"""Test-image helpers for the native engine tests (tests/unit/test_native_*.py).

Everything is deterministic (seeded) and in memory. Images are photo-like (smooth
gradients + hard-edged shapes + mild grain) so JPEG bit rates are realistic, and the red
channel rises left->right and green top->bottom, so a wrong flip or rotation shows.
Header surgery walks the marker segments (never byte-pattern searches in entropy data).
"""
from __future__ import annotations

import io
import struct
from typing import Iterator, Optional, Tuple

import numpy as np
from PIL import Image, ImageOps

# Pillow's `subsampling=` codes.
PIL_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}

# What ImageOps.exif_transpose applies for each orientation; storing the inverse of it
# makes a viewer (and exif_transpose) show the original picture.
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_INVERSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 RGB [height, width, 3], photo-like, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    ph = rng.uniform(0, 2 * np.pi, 3)
    r = 30 + 180 * x + 15 * np.sin(11 * y + ph[0])
    g = 30 + 180 * y + 15 * np.sin(13 * x + ph[1])
    b = 120 + 70 * np.sin(6 * (x - y) + ph[2])
    img = np.stack(np.broadcast_arrays(r, g, b), axis=-1).astype(np.float64)
    yy, xx = np.arange(height)[:, None], np.arange(width)[None, :]
    for _ in range(5):  # hard edges stress chroma upsampling and resampling
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        rad = rng.uniform(0.05, 0.25) * min(height, width)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < rad ** 2] = rng.uniform(0, 255, 3)
    img += rng.normal(0.0, 4.0, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def stored_for(oriented: Image.Image, orientation: int) -> Image.Image:
    """The pixels to store under EXIF ``orientation`` so that exif_transpose gives ``oriented``."""
    if orientation == 1:
        return oriented.copy()
    stored = oriented.transpose(_INVERSE[orientation])
    # Guard the table: the round trip must give the picture back.
    if stored.transpose(_TRANSPOSE[orientation]).tobytes() != oriented.tobytes():
        raise RuntimeError(f"orientation table wrong for {orientation}")
    return stored


def jpeg(pixels: np.ndarray | Image.Image, *, quality: int = 90, subsampling: str = "4:2:0",
         progressive: bool = False, orientation: Optional[int] = None, restart_blocks: int = 0,
         icc_profile: Optional[bytes] = None) -> bytes:
    """Encode with Pillow. ``orientation``: the stored pixels are transposed so the *oriented*
    image equals ``pixels`` (and the EXIF tag is written)."""
    img = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    kwargs: dict = {"quality": quality, "progressive": progressive}
    if img.mode == "RGB":
        kwargs["subsampling"] = PIL_SUBSAMPLING[subsampling]
    if orientation is not None:
        img = stored_for(img, orientation)
        kwargs["exif"] = exif_bytes(orientation)
    if restart_blocks:
        kwargs["restart_marker_blocks"] = restart_blocks
    if icc_profile is not None:
        kwargs["icc_profile"] = icc_profile
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kwargs)
    return buf.getvalue()


def encode(pixels: np.ndarray, fmt: str) -> bytes:
    """PNG / WEBP (lossless) / GIF / BMP bytes."""
    buf = io.BytesIO()
    img = Image.fromarray(pixels)
    if fmt == "WEBP":
        img.save(buf, fmt, lossless=True)
    else:
        img.save(buf, fmt)
    return buf.getvalue()


def pil_oriented(data: bytes) -> Image.Image:
    """The oracle: Pillow decode, EXIF orientation applied, RGB."""
    with Image.open(io.BytesIO(data)) as im:
        out = ImageOps.exif_transpose(im).convert("RGB")
        out.load()
    return out


def pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(pil_oriented(data))


def pil_crop_resize(img: Image.Image, top: int, left: int, h: int, w: int, out_hw: Tuple[int, int],
                    flip: bool) -> np.ndarray:
    """torchvision-on-PIL RandomResizedCrop + flip of one box: crop, antialiased bilinear, flip."""
    out = img.crop((left, top, left + w, top + h)).resize((out_hw[1], out_hw[0]), Image.BILINEAR)
    arr = np.asarray(out)
    return arr[:, ::-1] if flip else arr


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def mad(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two same-shape uint8 arrays."""
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    return float(np.mean(np.abs(a.astype(np.int16) - b.astype(np.int16))))


# ------------------------------------------------------------------ marker surgery

def segments(data: bytes) -> Iterator[Tuple[int, int, int]]:
    """(marker, offset of its 0xFF, length field) for header segments after SOI, through SOS."""
    if data[:2] != b"\xff\xd8":
        raise ValueError("no SOI")
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise ValueError(f"no marker at {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        yield marker, pos, length
        if marker == 0xDA:
            return
        pos += 2 + length


def scan_start(data: bytes) -> int:
    """Offset of the first entropy-coded byte."""
    for marker, pos, length in segments(data):
        if marker == 0xDA:
            return pos + 2 + length
    raise ValueError("no SOS")


def has_marker(data: bytes, marker: int) -> bool:
    return any(m == marker for m, _, _ in segments(data))


def with_sof(data: bytes, *, height: Optional[int] = None, width: Optional[int] = None,
             precision: Optional[int] = None, marker: Optional[int] = None,
             sampling: Optional[Tuple[int, int]] = None) -> bytes:
    """Rewrite fields of the SOF0/1/2 segment: FF Cx len(2) P(1) Y(2) X(2) Nf(1) (id,HV,Tq)*."""
    for m, pos, _ in segments(data):
        if m in (0xC0, 0xC1, 0xC2):
            break
    else:
        raise ValueError("no SOF")
    out = bytearray(data)
    if marker is not None:
        out[pos + 1] = marker
    if precision is not None:
        out[pos + 4] = precision
    if height is not None:
        out[pos + 5:pos + 7] = struct.pack(">H", height)
    if width is not None:
        out[pos + 7:pos + 9] = struct.pack(">H", width)
    if sampling is not None:
        comp, hv = sampling
        out[pos + 10 + 3 * comp + 1] = hv
    return bytes(out)


def with_adobe_transform(data: bytes, transform: int) -> bytes:
    """Set the Adobe APP14 transform byte (0 none, 1 YCbCr, 2 YCCK)."""
    for m, pos, _ in segments(data):
        if m == 0xEE and data[pos + 4:pos + 9] == b"Adobe":
            out = bytearray(data)
            out[pos + 4 + 11] = transform  # 'Adobe' version(2) flags0(2) flags1(2) transform(1)
            return bytes(out)
    raise ValueError("no Adobe APP14 segment")


def corrupt_scan(data: bytes, seed: int = 0, count: int = 60) -> bytes:
    """Overwrite ``count`` bytes in the middle half of the scan with values 0..254 (no markers)."""
    rng = np.random.default_rng(seed)
    start, end = scan_start(data), len(data) - 2
    q = (end - start) // 4
    out = bytearray(data)
    for pos in rng.integers(start + q, end - q, count):
        out[int(pos)] = int(rng.integers(0, 255))
    return bytes(out)


def truncate_scan(data: bytes, fraction: float = 0.5) -> bytes:
    start = scan_start(data)
    return data[:start + int((len(data) - start) * fraction)]



# ------------------------------------------------------------------ checked-in damaged files

def good_small_jpeg() -> bytes:
    """The 128x96 baseline 4:2:0 JPEG (quality 85) the damaged assets are cut from."""
    return jpeg(photo(96, 128, seed=1), quality=85)


def bad_assets() -> dict:
    """name -> bytes of tests/assets/bad/ (how each file was made; see its README.txt)."""
    good = good_small_jpeg()
    html = (b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
            b"<body><h1>Not Found</h1><p>The requested URL was not found on this server.</p></body></html>\n")
    return {
        "truncated.jpg": truncate_scan(good, 0.5),
        "random_bytes.jpg": np.random.default_rng(1).integers(0, 256, 2048, dtype=np.uint8).tobytes(),
        "html_page.JPEG": html,
        # Restart markers make the damage detectable: libjpeg warns when RSTn is out of step.
        "corrupt_entropy.jpg": corrupt_scan(jpeg(photo(96, 128, seed=1), quality=85, restart_blocks=4), seed=0),
        "png_named.JPEG": encode(photo(48, 64, seed=2), "PNG"),
    }


def write_bad_assets(directory: str) -> None:
    """Regenerate tests/assets/bad/ (run by hand; the files are checked in)."""
    import os
    os.makedirs(directory, exist_ok=True)
    for name, data in bad_assets().items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def opencv_jpeg(pixels: np.ndarray, subsampling: str, quality: int = 90) -> bytes:
    """4:1:1 / 4:4:0 (which Pillow cannot write) through OpenCV's libjpeg; needs cv2 >= 4.5.5."""
    import cv2  # the caller skips the test when OpenCV is absent
    factors = {"4:1:1": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, "4:4:0": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
               "4:2:0": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420}
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(pixels[:, :, ::-1]),
                           [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factors[subsampling]])
    if not ok:
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()
