"""In-memory test images and the Pillow oracles the decode engine is checked against.

Everything here is deterministic (seeded) and returns encoded ``bytes``, PIL images or uint8
arrays, so tests need no files on disk (except the damaged regression files that
``write_damaged_assets`` made once). Header surgery (``patch_sof``, ``make_12bit`` ...) walks
the JPEG marker segments instead of searching for byte patterns, so it never hits entropy data.
"""
from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image, ImageOps

from fastdata.cli.demo import photo_like_jpeg

# Pillow's `subsampling=` codes
SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}


def photo_like(height: int, width: int, index: int = 0, seed: int = 0) -> Image.Image:
    """RGB image with smooth gradients, edges, mild texture and the index encoded in its corner.

    Red rises left→right and green top→bottom, so any wrong flip/rotation is visible;
    noise (sigma ~5 levels) gives realistic JPEG bit rates. The top-left strip holds
    ``index`` as 8 black/white cells (bit 0 first), readable with ``read_index``.
    Not the library's ``fastdata.cli.demo.photo_like``: tests that need only realistic photos use
    that one (``photo_like_jpeg``); this one exists for the index and the orientation cues.
    """
    rng = np.random.default_rng(seed * 1_000_003 + index)
    y = np.linspace(0.0, 1.0, height, dtype=np.float64)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float64)[None, :]
    phase = rng.uniform(0, 2 * np.pi, 3)
    r = 40 + 170 * x + 20 * np.sin(9 * y + phase[0])
    g = 40 + 170 * y + 20 * np.sin(7 * x + phase[1])
    b = 128 + 60 * np.sin(5 * (x + y) + phase[2])
    img = np.stack(np.broadcast_arrays(r, g, b), axis=-1)
    # A few hard-edged discs: real photos have edges, which stress upsampling and resizing.
    for _ in range(4):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        rad = rng.uniform(0.05, 0.2) * min(height, width)
        mask = (np.arange(height)[:, None] - cy) ** 2 + (np.arange(width)[None, :] - cx) ** 2 < rad ** 2
        img[mask] = rng.uniform(0, 255, 3)
    img += rng.normal(0.0, 5.0, img.shape)
    pixels = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    cell = max(2, min(height, width) // 16)
    for bit in range(8):
        if bit * cell + cell > width:
            break
        pixels[:cell, bit * cell:(bit + 1) * cell] = 255 if (index >> bit) & 1 else 0
    return Image.fromarray(pixels, "RGB")


def read_index(pixels: np.ndarray) -> int:
    """Recover the index written by ``photo_like`` from an RGB [H, W, 3] array (unflipped)."""
    height, width = pixels.shape[:2]
    cell = max(2, min(height, width) // 16)
    value = 0
    for bit in range(8):
        if bit * cell + cell > width:
            break
        c = pixels[cell // 4: cell - cell // 4, bit * cell + cell // 4: (bit + 1) * cell - cell // 4]
        if c.mean() > 127:
            value |= 1 << bit
    return value


def encode_jpeg(img: Image.Image, *, quality: int = 90, subsampling: str = "4:2:0", progressive: bool = False,
                restart_blocks: int = 0, restart_rows: int = 0, orientation: Optional[int] = None,
                icc_profile: Optional[bytes] = None, optimize: bool = False) -> bytes:
    """Encode ``img`` as stored pixels with Pillow (libjpeg-turbo); ``orientation`` only writes
    the EXIF tag (see ``encode_oriented`` for "shows ``img`` once oriented"); ``optimize``: image-specific
    Huffman tables instead of the standard ones.
    Grayscale/CMYK images ignore ``subsampling``."""
    kwargs: dict = {"quality": quality, "progressive": progressive, "optimize": optimize}
    if img.mode == "RGB":
        kwargs["subsampling"] = SUBSAMPLING[subsampling]
    if restart_blocks:
        kwargs["restart_marker_blocks"] = restart_blocks
    if restart_rows:
        kwargs["restart_marker_rows"] = restart_rows
    if orientation is not None:
        kwargs["exif"] = exif_bytes(orientation)
    if icc_profile is not None:
        kwargs["icc_profile"] = icc_profile
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kwargs)
    return buf.getvalue()


# What ImageOps.exif_transpose applies for each orientation, and its inverse (what to store so
# that a viewer shows the original picture).
_EXIF_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_UNDO_ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def stored_for_orientation(oriented: Image.Image, orientation: int) -> Image.Image:
    """The pixels to store with EXIF ``orientation`` so that a viewer shows ``oriented``."""
    if orientation == 1:
        return oriented.copy()
    stored = oriented.transpose(_UNDO_ORIENTATION[orientation])
    # Guard the tables: the round trip must give the picture back.
    if stored.transpose(_EXIF_TRANSPOSE[orientation]).tobytes() != oriented.tobytes():
        raise RuntimeError(f"orientation table wrong for {orientation}")
    return stored


def encode_oriented(oriented: Image.Image, orientation: int, **kwargs) -> bytes:
    """A JPEG with EXIF ``orientation`` whose stored pixels are transposed so that the oriented
    image (what exif_transpose and the engine return) is ``oriented``. ``kwargs``: encode_jpeg's."""
    return encode_jpeg(stored_for_orientation(oriented, orientation), orientation=orientation, **kwargs)


def encode_other(img: Image.Image, fmt: str) -> bytes:
    """PNG / WEBP (lossless) / GIF / BMP bytes."""
    buf = io.BytesIO()
    if fmt == "WEBP":
        img.save(buf, fmt, lossless=True)
    else:
        img.save(buf, fmt)
    return buf.getvalue()


def opencv_jpeg(img: Image.Image, subsampling: str, quality: int = 90) -> bytes:
    """4:1:1 / 4:4:0 (which Pillow cannot write) through OpenCV's libjpeg; needs cv2 >= 4.5.5.
    The caller skips its test when OpenCV is absent or too old."""
    import cv2

    factors = {"4:1:1": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, "4:4:0": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
               "4:2:0": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420}
    bgr = np.ascontiguousarray(np.asarray(img.convert("RGB"))[:, :, ::-1])
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality,
                                         cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factors[subsampling]])
    if not ok:
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()


def icc_profile_bytes() -> bytes:
    """A real sRGB ICC profile (via LittleCMS) when available; else a syntactically plausible blob."""
    try:
        from PIL import ImageCms
        return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    except (ImportError, OSError):
        body = bytes(range(256)) * 4
        return struct.pack(">I", 128 + len(body)) + b"\0" * 124 + body


def exif_bytes(orientation: int) -> bytes:
    """An EXIF block holding only the orientation tag (Pillow's ``exif=`` argument)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def two_colour_classes(root: Path, per_class: int, size: Optional[Tuple[int, int]] = None) -> Path:
    """An ImageFolder of noisy red (c0/) and blue (c1/) JPEGs: a model that sees them with their
    right labels reaches high accuracy in a few dozen steps. ``size`` (h, w), or random sides
    in 40..71 per image. Returns ``root``."""
    rng = np.random.default_rng(0)
    for c, colour in enumerate([(220, 40, 40), (40, 40, 220)]):
        (root / f"c{c}").mkdir()
        for i in range(per_class):
            h, w = size if size is not None else (int(rng.integers(40, 72)), int(rng.integers(40, 72)))
            img = np.clip(np.array(colour) + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / f"c{c}" / f"{i:03d}.jpg", quality=90)
    return root


def with_each_exif_orientation(base: Image.Image, quality: int = 95) -> Tuple[List[bytes], List[Image.Image]]:
    """``base`` saved with EXIF orientations 1..8 (the stored pixels are the same in each), and
    Pillow's oriented RGB image of each: what a decoder must return for it."""
    datas = [encode_jpeg(base, quality=quality, orientation=o) for o in range(1, 9)]
    return datas, [pillow_oriented(d) for d in datas]


def photo_folder(root: Path, *, classes: int, per_class: int, width: int, height: int, seed: int) -> Path:
    """An ImageFolder of photo-like baseline JPEGs: root/c{class}/{i:02d}.jpg, image k of the
    set is ``photo_like_jpeg(seed, k, width, height)``."""
    for c in range(classes):
        (root / f"c{c}").mkdir()
        for i in range(per_class):
            (root / f"c{c}" / f"{i:02d}.jpg").write_bytes(photo_like_jpeg(seed, per_class * c + i, width, height))
    return root


def hard_case_folder(root: Path) -> List[str]:
    """Paths of 6 distinct photo-like JPEGs (decoders must keep them apart and in order), then
    the cases a GPU decoder must hand to the native one: CMYK, progressive, grayscale, PNG, EXIF
    orientations 6 and 7, a truncated JPEG, garbage after a JPEG signature, a missing file."""
    paths = []
    for i in range(6):
        p = root / f"{i:02d}_plain.jpg"
        p.write_bytes(photo_like_jpeg(11, i, 180 + 7 * i, 140))
        paths.append(str(p))
    base = Image.open(io.BytesIO(photo_like_jpeg(11, 99, 160, 120)))
    cases = {
        "cmyk.jpg": lambda f: base.convert("CMYK").save(f, "JPEG", quality=92),
        "progressive.jpg": lambda f: base.save(f, "JPEG", quality=92, progressive=True),
        "gray.jpg": lambda f: base.convert("L").save(f, "JPEG", quality=92),
        "png.png": lambda f: base.save(f, "PNG"),
        "exif6.jpg": lambda f: base.save(f, "JPEG", quality=92, exif=exif_bytes(6)),
        "exif7.jpg": lambda f: base.save(f, "JPEG", quality=92, exif=exif_bytes(7)),
    }
    for name, save in cases.items():
        p = root / name
        with open(p, "wb") as f:
            save(f)
        paths.append(str(p))
    good = Path(paths[0]).read_bytes()
    (root / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "garbage.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg at all")
    paths += [str(root / "truncated.jpg"), str(root / "garbage.jpg"), str(root / "missing.jpg")]
    return paths


# ---------------------------------------------------------------- oracles

def pillow_oriented(data: bytes) -> Image.Image:
    """The oracle: Pillow's decode with EXIF orientation applied, as an RGB PIL image."""
    with Image.open(io.BytesIO(data)) as im:
        out = ImageOps.exif_transpose(im).convert("RGB")
        out.load()
        return out


def pillow_rgb(data: bytes) -> np.ndarray:
    """``pillow_oriented`` as uint8 RGB [H, W, 3]."""
    return np.asarray(pillow_oriented(data))


def pillow_crop_resize(img: Image.Image, box: Sequence[int], out_hw: Tuple[int, int]) -> np.ndarray:
    """torchvision-on-PIL RandomResizedCrop of one box (top, left, height, width, flip), as
    ``fastdata._C.sample_crop_boxes`` returns it: crop, BILINEAR resize (Pillow antialiases
    when reducing), horizontal flip. uint8 [out_h, out_w, 3]."""
    top, left, h, w, flip = (int(v) for v in box)
    out = img.crop((left, top, left + w, top + h)).resize((out_hw[1], out_hw[0]), Image.BILINEAR)
    arr = np.asarray(out)
    return np.ascontiguousarray(arr[:, ::-1]) if flip else arr


def psnr(a, b) -> float:
    """PSNR in dB of two 8-bit images of the same shape: ``10 log10(255^2 / MSE)``, the mean
    over every element (all channels) in float64; ``inf`` when identical. ``a`` and ``b`` are
    numpy arrays or torch tensors (on any device), uint8 or float holding 0..255 values.
    The one PSNR of the test suite: every threshold in the tests means this."""
    a, b = _as_numpy(a), _as_numpy(b)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def _as_numpy(x) -> np.ndarray:
    """A numpy view/copy of a numpy array or a torch tensor (moved to the CPU)."""
    if hasattr(x, "detach"):  # a torch tensor; torch is not imported here
        return x.detach().cpu().numpy()
    return np.asarray(x)


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two same-shape uint8 arrays."""
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    return float(np.mean(np.abs(a.astype(np.int16) - b.astype(np.int16))))


# ---------------------------------------------------------------- marker surgery

def segments(data: bytes) -> Iterator[Tuple[int, int, int]]:
    """Yield (marker, offset of the 0xFF byte, segment length incl. the 2 length bytes)
    for each header segment after SOI, up to and including SOS."""
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no SOI)")
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise ValueError(f"expected a marker at offset {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        yield marker, pos, length
        if marker == 0xDA:  # SOS: entropy data follows
            return
        pos += 2 + length


def has_marker(data: bytes, marker: int) -> bool:
    """Whether the header (through SOS) has a segment with this marker."""
    return any(m == marker for m, _, _ in segments(data))


def _sof_offset(data: bytes) -> int:
    for marker, pos, _ in segments(data):
        if marker in (0xC0, 0xC1, 0xC2):
            return pos
    raise ValueError("no SOF0/1/2 segment")


def sos_offset(data: bytes) -> int:
    """Offset of the first byte of entropy-coded data."""
    for marker, pos, length in segments(data):
        if marker == 0xDA:
            return pos + 2 + length
    raise ValueError("no SOS segment")


def patch_sof(data: bytes, *, height: Optional[int] = None, width: Optional[int] = None,
              precision: Optional[int] = None, marker: Optional[int] = None,
              sampling: Optional[Tuple[int, int]] = None) -> bytes:
    """Rewrite SOF fields: dimensions, sample precision, marker (0xC0 baseline, 0xC1 extended),
    or (component, H<<4|V) sampling factors."""
    out = bytearray(data)
    pos = _sof_offset(data)
    # SOF layout: FF Cx | len(2) | precision(1) | height(2) | width(2) | ncomp(1) | (id, HV, tq)*
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


def make_12bit(data: bytes) -> bytes:
    """A JPEG whose SOF1 header declares 12-bit samples (libjpeg-turbo's 8-bit API must refuse it)."""
    return patch_sof(data, marker=0xC1, precision=12)


def adobe_transform(data: bytes, transform: int) -> bytes:
    """Set the Adobe APP14 transform flag (0: CMYK/RGB, 1: YCbCr, 2: YCCK)."""
    for marker, pos, length in segments(data):
        if marker == 0xEE and data[pos + 4:pos + 9] == b"Adobe":
            out = bytearray(data)
            # APP14 'Adobe' body: 'Adobe'(5) version(2) flags0(2) flags1(2) transform(1)
            out[pos + 4 + 11] = transform
            return bytes(out)
    raise ValueError("no Adobe APP14 segment")


def corrupt_entropy(data: bytes, seed: int = 0, count: int = 40) -> bytes:
    """Overwrite ``count`` bytes in the middle half of the scan with random non-0xFF values."""
    rng = np.random.default_rng(seed)
    start, end = sos_offset(data), len(data) - 2
    out = bytearray(data)
    lo = start + (end - start) // 4
    for pos in rng.integers(lo, end - (end - start) // 4, count):
        out[int(pos)] = int(rng.integers(0, 255))  # 0..254: never creates a marker
    return bytes(out)


def truncate_scan(data: bytes, fraction: float = 0.5) -> bytes:
    """Cut the file ``fraction`` of the way through its entropy-coded data (header intact)."""
    start = sos_offset(data)
    return data[:start + int((len(data) - start) * fraction)]


# ---------------------------------------------------------------- checked-in damaged files

def damaged_source_jpeg() -> bytes:
    """The 48x64 baseline 4:2:0 JPEG (quality 85) that tests/assets/damaged/ was cut from."""
    return encode_jpeg(photo_like(48, 64, index=5), quality=85)


def damaged_assets() -> dict:
    """file name -> bytes of tests/assets/damaged/ (its README.txt says what each one is)."""
    good = damaged_source_jpeg()
    html = (b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>\n"
            b"<body><h1>Forbidden</h1><p>You don't have permission to access this resource.</p></body></html>\n")
    return {
        "truncated.jpg": truncate_scan(good, 0.5),
        "random_bytes.jpg": np.random.default_rng(1234).integers(0, 256, 2048, dtype=np.uint8).tobytes(),
        "html_page.JPEG": html,
        "corrupt_entropy.jpg": corrupt_entropy(good, seed=7, count=40),
        "png_named.JPEG": encode_other(photo_like(24, 32, index=9), "PNG"),
    }


def write_damaged_assets(directory: Union[str, Path]) -> None:
    """Regenerate tests/assets/damaged/ (run by hand; the files are checked in)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in damaged_assets().items():
        (directory / name).write_bytes(data)
