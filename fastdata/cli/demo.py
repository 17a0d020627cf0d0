"""A deterministic, photo-like demo ImageFolder, so `fastdata-bench` needs no download.

The images imitate what makes real photos expensive to decode: realistic sizes (shorter
side 200-600 px, camera aspect ratios, some portrait), natural-image statistics (a
1/f amplitude spectrum, correlated colour channels, a few smooth shapes and gradients,
sensor-like fine grain), about 0.5-1 byte per pixel at JPEG quality 90, and the mix of
kinds found in ImageNet-like folders: a few grayscale, CMYK, progressive, EXIF-rotated
(orientations 2..8), 4:4:4 / 4:2:2 and restart-marked (one marker per MCU row, as many cameras
write) files among the usual baseline 4:2:0 ones.

Everything comes from ``numpy.random.Generator(PCG64(SeedSequence([seed, index])))``, so
image ``index`` does not depend on the build order or the number of worker threads, and
two builds on one machine are byte-identical.

The set is cached under the user's cache dir (``$FASTDATA_CACHE_DIR``, else
``$XDG_CACHE_HOME/fastdata``, else ``~/.cache/fastdata``) and written atomically: it is
built in a temporary sibling directory and renamed into place once complete, so an
interrupted build is never taken for a finished one.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from ..io.host import usable_cores

# 2 (2026-12-07): 5% of the files carry restart markers, which the GPU proof's mixed set needs
# (issue 14); a new version is a new cache folder, so a set built by an older version is not reused.
DEMO_VERSION = 2
DEFAULT_COUNT = 500
DEFAULT_CLASSES = 8
DEFAULT_SEED = 0
QUALITY = 90
MANIFEST = "fastdata-demo.json"

# Kinds repeat every len(_KIND_CYCLE) images so that even a small set holds each of them
# (5% gray, 5% CMYK, 10% progressive, 10% EXIF-rotated, 5% 4:4:4, 5% 4:2:2, 5% restart markers).
_KIND_CYCLE = ("gray", "cmyk", "progressive", "exif", "444", "baseline", "baseline",
               "baseline", "progressive", "baseline", "restart", "exif", "422",
               "baseline", "baseline", "baseline", "baseline", "baseline", "baseline",
               "baseline")
KINDS = ("baseline", "gray", "cmyk", "progressive", "exif", "444", "422", "restart")

# (aspect ratio long/short, weight): camera and ImageNet-typical shapes.
_ASPECTS = ((4 / 3, 0.50), (3 / 2, 0.25), (1.0, 0.08), (5 / 4, 0.09), (16 / 9, 0.08))
_SUBSAMPLING = {"444": 0, "422": 1}  # Pillow's codes; everything else is 4:2:0 (2)


@dataclass(frozen=True)
class DemoImage:
    """One file of the demo set (as listed in its manifest)."""

    path: str  # relative to the set's root: "<class>/<index>.jpg"
    label: int
    kind: str  # one of KINDS
    width: int  # as stored (before EXIF orientation)
    height: int
    orientation: int  # EXIF orientation 1..8 (1 = none)
    nbytes: int


def cache_root() -> Path:
    """The directory fastdata caches generated data in (not created here)."""
    override = os.environ.get("FASTDATA_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "fastdata"


def demo_dir(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED,
             classes: int = DEFAULT_CLASSES, root: Optional[Path] = None) -> Path:
    """Where the demo set with these parameters lives (or will live)."""
    base = Path(root) if root is not None else cache_root()
    if (count, seed, classes) == (DEFAULT_COUNT, DEFAULT_SEED, DEFAULT_CLASSES):
        return base / f"demo-v{DEMO_VERSION}"
    return base / f"demo-v{DEMO_VERSION}-n{count}-s{seed}-c{classes}"


def class_names(classes: int) -> List[str]:
    return [f"class_{k:02d}" for k in range(classes)]


# ---------------------------------------------------------------------------------------
# Pixels


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, index])))


def _pink_field(rng: np.random.Generator, h: int, w: int, alpha: float) -> np.ndarray:
    """float32 [h, w] noise with a 1/f^alpha amplitude spectrum, zero mean, unit std."""
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f2 = fy * fy + fx * fx
    f2[0, 0] = 1.0
    amp = f2 ** np.float32(-alpha / 2)
    amp[0, 0] = 0.0
    spec = np.empty((h, w // 2 + 1), np.complex64)
    spec.real = rng.standard_normal(spec.shape, dtype=np.float32)
    spec.imag = rng.standard_normal(spec.shape, dtype=np.float32)
    spec *= amp
    # numpy's FFT is single-threaded, which suits the builder (it parallelises over images).
    x = np.fft.irfft2(spec, s=(h, w)).astype(np.float32, copy=False)
    x /= np.float32(x.std() + 1e-12)
    return x


def _upsample(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear upsampling of a float32 field (for chroma, which photos carry at low detail)."""
    return np.asarray(Image.fromarray(x, mode="F").resize((w, h), Image.BILINEAR), np.float32)


def photo_like(rng: np.random.Generator, height: int, width: int,
               tint: Optional[Tuple[float, float, float]] = None) -> np.ndarray:
    """A photo-like uint8 RGB image [height, width, 3].

    Luminance: multi-scale 1/f noise (a natural-image spectrum) plus a sky-like gradient and
    a few soft-edged ellipses; chroma: smoother, lower-resolution 1/f fields, correlated with
    luminance through a random colour mixing; fine sensor-like grain on top. ``tint`` shifts
    the mean colour (the demo uses it per class, so classes differ visibly).
    """
    h, w = int(height), int(width)
    if h < 8 or w < 8:
        raise ValueError(f"photo_like needs at least 8x8 pixels, got {h}x{w}")
    alpha = float(rng.uniform(0.7, 1.1))  # spectral slope varies between scenes
    contrast = float(rng.uniform(36.0, 66.0))
    lum = _pink_field(rng, h, w, alpha) * np.float32(contrast)

    yy = np.linspace(-1.0, 1.0, h, dtype=np.float32)[:, None]
    xx = np.linspace(-1.0, 1.0, w, dtype=np.float32)[None, :]
    angle = rng.uniform(0, 2 * np.pi)
    lum += np.float32(rng.uniform(10, 40)) * (np.float32(np.cos(angle)) * yy + np.float32(np.sin(angle)) * xx)
    for _ in range(int(rng.integers(1, 4))):
        cy, cx = rng.uniform(-0.8, 0.8, 2)
        ry, rx = rng.uniform(0.15, 0.6, 2)
        d = ((yy - np.float32(cy)) / np.float32(ry)) ** 2 + ((xx - np.float32(cx)) / np.float32(rx)) ** 2
        edge = np.float32(rng.uniform(0.02, 0.15))  # soft edges, like out-of-focus objects
        mask = np.clip((1.0 - d) / edge, 0.0, 1.0)
        lum += np.float32(rng.uniform(-60, 60)) * mask

    ch, cw = max(8, h // 4), max(8, w // 4)
    c1 = _upsample(_pink_field(rng, ch, cw, 1.4), h, w) * np.float32(rng.uniform(8, 20))
    c2 = _upsample(_pink_field(rng, ch, cw, 1.4), h, w) * np.float32(rng.uniform(8, 20))
    base = rng.uniform(70, 180, 3).astype(np.float32)
    if tint is not None:
        base = 0.5 * base + 0.5 * np.asarray(tint, np.float32)
    # Channels share luminance (strong inter-channel correlation, as in photos).
    mix = np.array([[1.0, 0.7, 0.1], [1.0, -0.3, 0.4], [1.0, -0.2, -0.8]], np.float32)
    mix[:, 0] += rng.uniform(-0.1, 0.1, 3).astype(np.float32)
    grain = float(rng.uniform(5.0, 13.0))
    out = np.empty((h, w, 3), np.uint8)
    for c in range(3):
        ch_val = base[c] + mix[c, 0] * lum + mix[c, 1] * c1 + mix[c, 2] * c2
        ch_val += rng.standard_normal((h, w), dtype=np.float32) * np.float32(grain)
        np.clip(ch_val, 0, 255, out=ch_val)
        out[..., c] = ch_val.astype(np.uint8)
    return out


def photo_like_jpeg(seed: int, index: int, width: int, height: int, quality: int = QUALITY) -> bytes:
    """A baseline 4:2:0 photo-like JPEG of exactly ``width`` x ``height`` (for benchmarks)."""
    rgb = photo_like(_rng(seed, index), height, width)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def _image_size(rng: np.random.Generator) -> Tuple[int, int]:
    """(width, height) with the shorter side in 200..600, mostly around ImageNet's 333-375."""
    short = int(round(rng.triangular(200, 375, 600)))
    ratios, weights = zip(*_ASPECTS)
    ratio = ratios[int(rng.choice(len(ratios), p=np.asarray(weights) / sum(weights)))]
    long = int(round(short * ratio))
    if rng.random() < 0.25:  # portrait
        return short, long
    return long, short


def _exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def exif_orientation(index: int) -> int:
    """EXIF orientation of sample ``index``: 1, or 2..8 in turn for the EXIF-rotated kind."""
    cycle = len(_KIND_CYCLE)
    if _KIND_CYCLE[index % cycle] != "exif":
        return 1
    slots = [k for k, kind in enumerate(_KIND_CYCLE) if kind == "exif"]
    occurrence = index // cycle * len(slots) + slots.index(index % cycle)
    return 2 + occurrence % 7


def has_restart_interval(data: bytes) -> bool:
    """True when the JPEG's headers (before its first scan) define a restart interval (a DRI
    marker, 0xFFDD). Searched only before the scan: headers are where DRI lives."""
    sos = data.find(b"\xff\xda")
    return b"\xff\xdd" in data[:sos if sos >= 0 else len(data)]


def demo_image(seed: int, index: int, classes: int) -> Tuple[DemoImage, bytes]:
    """Generate sample ``index`` of the set: its manifest entry and its encoded bytes."""
    rng = _rng(seed, index)
    label = index % classes
    kind = _KIND_CYCLE[index % len(_KIND_CYCLE)]
    width, height = _image_size(rng)
    hue = 2 * np.pi * label / classes
    tint = tuple(128 + 60 * np.cos(hue + k * 2 * np.pi / 3) for k in range(3))
    rgb = photo_like(rng, height, width, tint=tint)

    img = Image.fromarray(rgb)
    params: Dict[str, object] = {"quality": QUALITY, "subsampling": _SUBSAMPLING.get(kind, 2)}
    orientation = exif_orientation(index)
    if kind == "gray":
        img = img.convert("L")
    elif kind == "cmyk":
        img = img.convert("CMYK")
    elif kind == "progressive":
        params["progressive"] = True
    elif kind == "exif":
        params["exif"] = _exif_bytes(orientation)
    elif kind == "restart":
        params["restart_marker_rows"] = 1
    buf = io.BytesIO()
    img.save(buf, "JPEG", **params)
    data = buf.getvalue()
    if kind == "restart" and not has_restart_interval(data):
        kind = "baseline"  # a Pillow too old for restart_marker_rows ignores it: the manifest says so
    path = f"{class_names(classes)[label]}/{index:06d}.jpg"
    return DemoImage(path, label, kind, width, height, orientation, len(data)), data


# ---------------------------------------------------------------------------------------
# The cached folder


def is_complete(path: Path) -> bool:
    """True when ``path`` holds a finished demo set (its manifest is written last)."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: Path) -> Dict[str, object]:
    with open(Path(path) / MANIFEST, encoding="utf-8") as f:
        return json.load(f)


def build_demo(dst: Path, count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED,
               classes: int = DEFAULT_CLASSES, workers: Optional[int] = None,
               progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Build the demo set into ``dst`` atomically and return ``dst``.

    Images are generated on ``workers`` Python threads (default: usable cores); numpy,
    numpy's FFT and Pillow's encoder release the GIL for the heavy parts. ``progress(done,
    total)`` is called from the calling thread. If ``dst`` already holds a complete set
    (e.g. another process finished first) the new build is discarded.
    """
    if count < 1 or classes < 1:
        raise ValueError(f"count and classes must be >= 1, got count={count}, classes={classes}")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    workers = workers or usable_cores()
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        for name in class_names(classes):
            (tmp / name).mkdir()
        entries: List[DemoImage] = []

        def make(i: int) -> DemoImage:
            entry, data = demo_image(seed, i, classes)
            with open(tmp / entry.path, "wb") as f:
                f.write(data)
            return entry

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for done, entry in enumerate(pool.map(make, range(count)), 1):
                entries.append(entry)
                if progress is not None:
                    progress(done, count)
        manifest = {
            "format": "fastdata-demo", "version": DEMO_VERSION, "seed": seed, "count": count,
            "classes": class_names(classes), "quality": QUALITY,
            "images": [asdict(e) for e in entries],
        }
        # Completion record last, then one rename: a killed build leaves only a temp dir.
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, dst)
        except OSError:
            if is_complete(dst):  # lost a race with a concurrent build: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(dst, ignore_errors=True)  # an unfinished leftover without manifest
                os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def ensure_demo(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED, classes: int = DEFAULT_CLASSES,
                root: Optional[Path] = None, workers: Optional[int] = None,
                progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Return the path of the cached demo set, building it first if needed."""
    path = demo_dir(count, seed, classes, root)
    if is_complete(path):
        return path
    return build_demo(path, count, seed, classes, workers, progress)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m fastdata.cli.demo [--count N] [--seed S] [--classes C] [--out DIR]``: build and print the path."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fastdata.cli.demo", description=main.__doc__)
    p.add_argument("--count", type=int, default=DEFAULT_COUNT)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--classes", type=int, default=DEFAULT_CLASSES)
    p.add_argument("--out", type=Path, default=None, help="build exactly here instead of the cache dir")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.out is not None:
        path = args.out if is_complete(args.out) else build_demo(args.out, args.count, args.seed, args.classes)
    else:
        path = ensure_demo(args.count, args.seed, args.classes)
    print(f"{path}  ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
