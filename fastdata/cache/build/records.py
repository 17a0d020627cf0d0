"""What the cache stores for one input (the worker side of a conversion).

:func:`stored_bytes` decides it in one place: the source bytes, a lossy re-encode
(``--max-side``, and non-JPEG inputs then), or a lossless rewrite (same DCT coefficients, so
identical pixels) as baseline JPEG with restart markers and a restart index, which the
Loader's crop decode serves by entropy-decoding only the restart intervals the crop needs
(progressive JPEGs: instead of entropy-decoding every scan of the whole image). :func:`process_one` reads, hashes and
stores one file and never raises for bad data; ``--workers`` forked processes run it.
"""
from __future__ import annotations

import hashlib
import io
import re
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ...io.decoding import decode, probe
from ...io.encoded import is_jpeg
from ...io.engine import DEFAULT_MAX_PIXELS, read_file
from .. import format as cf

DEFAULT_QUALITY = 90


def _target_size(w: int, h: int, max_side: int) -> Tuple[int, int]:
    scale = max_side / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def _encode_jpeg(img: Any, quality: int) -> bytes:
    """Baseline 4:2:0 JPEG of a Pillow RGB image, no metadata (orientation already applied)."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, subsampling="4:2:0", optimize=False, progressive=False)
    return buf.getvalue()


def oriented_size(data: bytes) -> Tuple[int, int]:
    """(width, height) of a JPEG after its EXIF orientation, from the header alone."""
    info = probe(data)
    return info.oriented_width, info.oriented_height


def validate(data: bytes) -> np.ndarray:
    """Decode once, strictly (JPEG natively, the raster formats through the Pillow fallback);
    DecodeError on any problem. Returns the pixels, uint8 RGB [H, W, 3]."""
    return decode(data, strict=True)


def _shrink(data: bytes, max_side: int, quality: int) -> bytes:
    """Decoded (oriented RGB), antialiased resize to ``max_side`` when larger, JPEG re-encode."""
    from PIL import Image

    img = Image.fromarray(validate(data))
    if max(img.size) > max_side:
        # reducing_gap: box-reduce first, then LANCZOS; antialiased and fast for big shrinks
        img = img.resize(_target_size(img.width, img.height, max_side), Image.LANCZOS, reducing_gap=3.0)
    return _encode_jpeg(img, quality)


class TranscodeError(ValueError):
    """A JPEG that decodes could not be rewritten losslessly; it is stored as it is."""


def _rewrite_kind(data: bytes, keep_progressive: bool) -> Optional[int]:
    """How a lossless restart-indexed rewrite of ``data`` would be recorded (cf.STORED_TRANSCODED
    for progressive JPEGs, cf.STORED_RESTART_INDEXED for baseline ones), or None where it is not
    made: CMYK/YCCK (rare, and an Adobe marker would have to be reproduced exactly), progressive
    files with ``keep_progressive``, and non-JPEGs."""
    if not is_jpeg(data):
        return None
    info = probe(data)
    if info.color_space not in ("gray", "ycbcr", "rgb") or (info.progressive and keep_progressive):
        return None
    return cf.STORED_TRANSCODED if info.progressive else cf.STORED_RESTART_INDEXED


def _transcode(data: bytes, pixels: np.ndarray) -> bytes:
    """Lossless rewrite as restart-indexed baseline JPEG, checked against the source's pixels.

    The rewrite keeps the DCT coefficients, so any difference would be a bug, not rounding:
    checking costs one fast (baseline) decode per file, once, at write time.
    """
    from ... import _C  # looked up at call time (tests stand a fake in for it)

    try:
        out = _C.transcode_restart_indexed(data, DEFAULT_MAX_PIXELS, cf.RESTART_INTERVAL_MCUS)
    except ValueError as exc:  # NativeDecodeError (corrupt data) is a ValueError too
        raise TranscodeError(f"lossless restart-indexed rewrite failed: {exc}") from None
    info = probe(out)
    if info.progressive or not info.restart_indexed:
        raise TranscodeError("lossless rewrite produced a progressive or unindexed file")
    if not np.array_equal(decode(out, strict=True), pixels):
        raise TranscodeError("lossless rewrite changed the decoded pixels")
    return out


def stored_bytes(data: bytes, max_side: Optional[int], quality: int, keep_progressive: bool) -> Tuple[bytes, int]:
    """What the cache stores for one input's bytes, and how it relates to them (cf.STORED_*).

    Raises for data that does not decode (strictly) or cannot be re-encoded as ``max_side`` asks.
    A file that decodes but cannot be rewritten exactly (e.g. a progressive one whose decode
    uses libjpeg's block smoothing, which a sequential rewrite does not get) is stored as it
    is: the rewrite is only a speed-up, and a good image is never dropped for it.
    """
    if max_side is not None and not (is_jpeg(data) and max(oriented_size(data)) <= max_side):
        shrunk = _shrink(data, max_side, quality)  # too large, or not a JPEG
        if _rewrite_kind(shrunk, keep_progressive) is not None:
            try:
                return _transcode(shrunk, validate(shrunk)), cf.STORED_REENCODED
            except TranscodeError:
                pass
        return shrunk, cf.STORED_REENCODED
    pixels = validate(data)
    kind = _rewrite_kind(data, keep_progressive)
    if kind is not None:
        try:
            return _transcode(data, pixels), kind
        except TranscodeError:
            pass
    return data, cf.STORED_ORIGINAL


# (input position, stored bytes or None, error reason or None, bytes read, sha256 of the input,
#  cf.STORED_*, sha256 of the stored bytes): both digests come from the worker processes, so the
# single writer process hashes nothing.
Result = Tuple[int, Optional[bytes], Optional[str], int, bytes, int, bytes]


def process_one(pos: int, path: str, max_side: Optional[int], quality: int, keep_progressive: bool = False) -> Result:
    """Read, hash, validate and store (:func:`stored_bytes`) one input. Never raises for bad data."""
    try:
        # the engine's reader: regular files only, never blocking on a named pipe, and at most
        # DEFAULT_MAX_FILE_BYTES (fastdata.io.engine.read_file)
        data = read_file(path).tobytes()
    except OSError as exc:
        return pos, None, f"cannot read: {exc.strerror or exc}", 0, b"", cf.STORED_ORIGINAL, b""
    except ValueError as exc:  # fastdata.DecodeError from the reader: not a regular file, too large
        return pos, None, f"cannot read: {getattr(exc, 'reason', exc)}", 0, b"", cf.STORED_ORIGINAL, b""
    digest = hashlib.sha256(data).digest()
    try:
        stored, kind = stored_bytes(data, max_side, quality, keep_progressive)
        stored_digest = digest if stored is data else hashlib.sha256(stored).digest()
        return pos, stored, None, len(data), digest, kind, stored_digest
    except Exception as exc:  # any decoder failure is this file's problem, reported by name
        return pos, None, f"invalid image: {_reason(exc)}", len(data), digest, cf.STORED_ORIGINAL, b""


def _reason(exc: Exception) -> str:
    """A deterministic message (stored in the cache, so a resumed run equals a clean one)."""
    reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
    return re.sub(r" at 0x[0-9a-f]+", "", str(reason))


# Set in each forked worker by worker_init (the pool's initializer), read by worker_chunk.
_WORKER_ARGS: Tuple[Optional[int], int, bool] = (None, DEFAULT_QUALITY, False)


def worker_init(max_side: Optional[int], quality: int, keep_progressive: bool) -> None:
    global _WORKER_ARGS
    _WORKER_ARGS = (max_side, quality, keep_progressive)


def worker_chunk(chunk: Sequence[Tuple[int, str]]) -> List[Result]:
    return [process_one(pos, path, *_WORKER_ARGS) for pos, path in chunk]
