"""The functional API over the native decoder: probe, decode, decode_batch."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np

from .. import _C
from ..errors import BatchDecodeError, DecodeError
from .encoded import Item, is_jpeg
from .engine import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, Engine, native_spec
from .host import usable_cores
from .pillow_fallback import decode_with_pillow
from .transforms import Transform

__all__ = ["ImageInfo", "probe", "decode", "decode_batch", "DEFAULT_MAX_PIXELS", "DEFAULT_MAX_FILE_BYTES"]


@dataclass(frozen=True)
class ImageInfo:
    """Header facts of a JPEG. ``width``/``height`` as stored; ``oriented_*`` after EXIF rotation."""

    width: int
    height: int
    oriented_width: int
    oriented_height: int
    color_space: str  # "gray", "ycbcr", "rgb", "cmyk", "ycck" or "other"
    subsampling: str  # "4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "gray" or "other"
    progressive: bool
    orientation: int  # EXIF orientation 1..8 (1 when absent)
    components: int
    # Carries fastdata's restart index (fastdata-convert): crop decodes entropy-decode only
    # the restart intervals the crop needs. Defaulted so older callers building one still work.
    restart_indexed: bool = False


def _as_bytes_like(data: object) -> memoryview:
    if isinstance(data, str):
        raise TypeError("data must be encoded bytes (bytes, memoryview, numpy uint8), not str; "
                        "read the file first or use decode_batch, which accepts paths")
    try:
        return memoryview(data).cast("B")  # type: ignore[arg-type]
    except TypeError as e:
        raise TypeError(f"data must support the buffer protocol, got {type(data).__name__}") from e


def probe(data: Union[bytes, memoryview, np.ndarray]) -> ImageInfo:
    """Read a JPEG's header only (no pixel decode). Raises DecodeError for non-JPEG data."""
    view = _as_bytes_like(data)
    try:
        return ImageInfo(**_C.probe(view))
    except _C.NativeDecodeError as e:
        raise DecodeError(str(e)) from None


def decode(data: Union[bytes, memoryview, np.ndarray], *, strict: bool = True,
           max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode to uint8 RGB [H, W, 3] with EXIF orientation applied.

    JPEGs decode natively (grayscale replicated, CMYK/YCCK converted); other formats go
    through Pillow. ``strict``: libjpeg's corrupt-data warnings raise DecodeError; otherwise
    the (possibly partly grey) image is returned.
    """
    view = _as_bytes_like(data)
    if view.nbytes == 0 or is_jpeg(view):
        try:
            pixels, _warnings = _C.decode_full(view, strict, max_pixels)
        except _C.NativeDecodeError as e:
            raise DecodeError(str(e)) from None
        return pixels
    return decode_with_pillow(view, max_pixels)


_engines: Dict[int, Engine] = {}
_engines_lock = threading.Lock()


def _forget_engines_after_fork() -> None:
    """In a forked child (a DataLoader worker, say) the shared engines' native threads do not
    exist, and the lock may have been held by a parent thread: start afresh, lazily. The old
    engines are dropped without joining anything (their native side knows it is in a child)."""
    global _engines, _engines_lock
    _engines = {}
    _engines_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_engines_after_fork)


def _shared_engine(threads: Optional[int]) -> Engine:
    """One process-wide engine per thread count, kept for reuse (like a BLAS pool)."""
    n = usable_cores() if threads is None else threads
    with _engines_lock:
        engine = _engines.get(n)
        if engine is None:
            engine = _engines[n] = Engine(n)
        return engine


@overload
def decode_batch(datas: Sequence[Item], transform: Transform, out: Optional[np.ndarray] = ..., *,
                 seed: int = ..., epoch: int = ..., indices: Optional[Sequence[int]] = ...,
                 threads: Optional[int] = ..., strict: bool = ..., on_error: Literal["raise"] = ...,
                 max_pixels: int = ..., max_file_bytes: int = ...) -> np.ndarray: ...


@overload
def decode_batch(datas: Sequence[Item], transform: Transform, out: Optional[np.ndarray] = ..., *,
                 seed: int = ..., epoch: int = ..., indices: Optional[Sequence[int]] = ...,
                 threads: Optional[int] = ..., strict: bool = ..., on_error: Literal["skip"],
                 max_pixels: int = ..., max_file_bytes: int = ...) -> Tuple[np.ndarray, List[DecodeError]]: ...


def decode_batch(datas, transform, out=None, *, seed=0, epoch=0, indices=None, threads=None, strict=False,
                 on_error="raise", max_pixels=DEFAULT_MAX_PIXELS, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Decode and transform a batch on native threads (GIL released) into ``out``.

    datas: encoded buffers (bytes, memoryview, numpy uint8) or file paths (str).
    out: uint8 [N, H, W, 3] C-contiguous (e.g. ``pinned_tensor.numpy()``); allocated if None.
    Row i's random crop/flip depends only on (seed, epoch, indices[i]); indices default to 0..N-1.
    on_error="raise": BatchDecodeError naming every failed sample (after the whole batch ran).
    on_error="skip": returns (out, failures); failed rows are zero-filled.
    strict: libjpeg corrupt-data warnings count as failures (default: decode and count them).
    max_file_bytes: a file above it fails without being read (0: no limit); only regular
    files are read (a named pipe or device fails, never blocks).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    native_spec(transform)  # TypeError for anything but a fastdata transform, before using it
    h, w = transform.output_size
    if out is None:
        out = np.empty((len(datas), h, w, 3), dtype=np.uint8)
    report = _shared_engine(threads).run(datas, transform, out, seed=seed, epoch=epoch, indices=indices,
                                         strict=strict, max_pixels=max_pixels, max_file_bytes=max_file_bytes)
    if on_error == "skip":
        return out, report.failures
    if report.failures:
        raise BatchDecodeError(report.failures)
    return out
