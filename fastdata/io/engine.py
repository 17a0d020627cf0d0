"""The batch engine: native threads decode, crop, resize and flip a batch into caller memory.

``Engine.run`` is the one place where a batch is decoded; ``decode_batch`` and the Loader
both go through it. Non-JPEG samples come back from the native pass untouched, are decoded
here with Pillow, and go through the same native crop/resize/flip (native threads never
call Python).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _C
from ..errors import DecodeError
from .pillow_fallback import decode_with_pillow
from .transforms import CenterCrop, RandomResizedCrop, Transform

# Pillow's own default Image.MAX_IMAGE_PIXELS: ~89.5 MP (a 3-channel image of 1/4 GiB).
DEFAULT_MAX_PIXELS = 89_478_485

Item = Union[str, bytes, bytearray, memoryview, np.ndarray]


def default_threads() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def scale_bias_for(mean: Sequence[float], std: Sequence[float]) -> Tuple[List[float], List[float]]:
    """(x / 255 - mean) / std as x * scale + bias, per channel."""
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f"mean and std need 3 values each, std > 0; got {mean}, {std}")
    return [1.0 / (255.0 * s) for s in std], [-m / s for m, s in zip(mean, std)]


# The last spec built, by transform identity: transforms are frozen, and a training loop passes
# the same one every batch, so this keeps building a spec (~2 us of keyword parsing) out of
# the per-batch cost. A tuple is replaced whole, so a reader on another thread sees either
# the old entry or the new one.
_last_spec: Tuple[object, bool, Optional[_C.TransformSpec]] = (object(), True, None)


def native_spec(transform: Transform, roi: bool = True) -> _C.TransformSpec:
    """The engine's spec of a fastdata transform (validated again, in C++, on construction)."""
    global _last_spec
    last_transform, last_roi, spec = _last_spec
    if transform is last_transform and roi == last_roi:
        return spec
    if isinstance(transform, RandomResizedCrop):
        h, w = transform.output_size
        spec = _C.TransformSpec(kind=_C.TransformKind.RANDOM_RESIZED_CROP, out_h=h, out_w=w,
                                scale_lo=float(transform.scale[0]), scale_hi=float(transform.scale[1]),
                                ratio_lo=float(transform.ratio[0]), ratio_hi=float(transform.ratio[1]),
                                hflip=float(transform.hflip), roi=bool(roi))
    elif isinstance(transform, CenterCrop):
        h, w = transform.output_size
        spec = _C.TransformSpec(kind=_C.TransformKind.CENTER_CROP, out_h=h, out_w=w, hflip=0.0,
                                resize_to=transform.resize_to, roi=bool(roi))
    else:
        raise TypeError("transform must be fastdata.RandomResizedCrop or fastdata.CenterCrop, "
                        f"got {type(transform).__name__}")
    _last_spec = (transform, roi, spec)
    return spec


@dataclass
class BatchReport:
    """What happened in one ``Engine.run``. Times are summed over native threads."""

    failures: List[DecodeError] = field(default_factory=list)
    failed_rows: List[int] = field(default_factory=list)
    read_seconds: float = 0.0
    decode_seconds: float = 0.0
    warnings: int = 0
    fallbacks: int = 0


@dataclass
class CropPlan:
    """Per sample: source box (x0, y0, x1, y1) in EXIF-oriented pixels (float64 [N, 4]; the
    output samples it with Pillow's pixel-centre convention), flip (bool [N]), oriented size
    (int32 [N, 2] as height, width) and EXIF orientation (int32 [N])."""

    boxes: np.ndarray
    flips: np.ndarray
    sizes: np.ndarray
    orientations: np.ndarray
    failures: List[DecodeError] = field(default_factory=list)
    failed_rows: List[int] = field(default_factory=list)
    not_jpeg_rows: List[int] = field(default_factory=list)


def check_out(out: np.ndarray, n: int, hw: tuple, normalized: bool = False) -> None:
    """Raise unless ``out`` is a writable C-contiguous array of shape [n, h, w, 3]: uint8,
    or float32 when ``normalized``."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array (use tensor.numpy() for torch), got {type(out).__name__}")
    want = np.float32 if normalized else np.uint8
    if out.dtype != want:
        raise TypeError(f"out must have dtype {np.dtype(want).name}, got {out.dtype}")
    if out.shape != (n, hw[0], hw[1], 3):
        raise ValueError(f"out must have shape {(n, hw[0], hw[1], 3)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out must be writable")


class Engine:
    """A persistent pool of ``threads`` native threads (the calling thread counts as one).

    ``run`` releases the GIL while it works, so it can run on a Python background thread
    while the training step runs. Calls on one engine are serialized.
    """

    def __init__(self, threads: Optional[int] = None):
        if threads is None:
            threads = default_threads()
        if not isinstance(threads, int) or threads < 1 or threads > 1024:
            raise ValueError(f"threads must be an int in 1..1024, got {threads!r}")
        self._native: Optional[_C.Engine] = _C.Engine(threads)
        self._threads = threads
        self._lock = threading.Lock()

    @property
    def threads(self) -> int:
        return self._threads

    def run(self, items: Sequence[Item], transform: Transform, out: np.ndarray, *, seed: int = 0,
            epoch: int = 0, indices: Optional[Sequence[int]] = None, strict: bool = False,
            max_pixels: int = DEFAULT_MAX_PIXELS, names: Optional[Sequence[str]] = None,
            roi: bool = True, normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None) -> BatchReport:
        """Decode + transform ``items[i]`` into ``out[i]`` (uint8 [N, H, W, 3]).

        With ``normalize=(mean, std)``, ``out`` is float32 [N, H, W, 3] and receives
        (x / 255 - mean) / std per channel, computed by the native threads.

        ``items`` are file paths (``str``, read by native threads) or encoded buffers.
        Sample i's crop and flip come from (seed, epoch, indices[i]) (default indices: 0..N-1).
        Failed rows are zero-filled and listed in the report; nothing is raised for bad data.
        ``names`` label samples in errors (defaults to the path for ``str`` items).
        ``roi=False`` turns off region-of-interest and DCT-scaled decoding (benchmarks only).
        """
        spec = native_spec(transform, roi)
        n = len(items)
        check_out(out, n, transform.output_size, normalized=normalize is not None)
        scale_bias = None if normalize is None else scale_bias_for(*normalize)
        index_arr = None
        if indices is not None:
            index_arr = np.ascontiguousarray(indices, dtype=np.int64)
            if index_arr.shape != (n,):
                raise ValueError(f"indices must have {n} entries, got shape {index_arr.shape}")
            if n and index_arr.min() < 0:
                raise ValueError("indices must be non-negative")
        if seed < 0 or epoch < 0:
            raise ValueError("seed and epoch must be non-negative")
        with self._lock:
            native = self._native
            if native is None:
                raise RuntimeError("Engine is closed")
            raw = native.run(items, spec, out, seed, epoch, index_arr, strict, max_pixels, scale_bias)
            report = BatchReport(read_seconds=raw.read_seconds, decode_seconds=raw.decode_seconds,
                                 warnings=raw.warnings)
            for failure in raw.failures:
                row, message = failure.row, failure.message
                index = int(index_arr[row]) if index_arr is not None else row
                item = items[row]
                name = names[row] if names is not None else (item if isinstance(item, str) else None)
                if failure.status == _C.SampleStatus.NOT_JPEG:
                    try:
                        pixels = decode_with_pillow(item, max_pixels)
                        native.transform_pixels(pixels, spec, out, row, seed, epoch, index, scale_bias)
                        report.fallbacks += 1
                        continue
                    except DecodeError as e:
                        message = e.reason
                        out[row] = 0
                report.failures.append(DecodeError(message, index=index, name=name))
                report.failed_rows.append(row)
        return report

    def plan(self, items: Sequence[Item], transform: Transform, *, seed: int = 0, epoch: int = 0,
             indices: Optional[Sequence[int]] = None,
             max_pixels: int = DEFAULT_MAX_PIXELS) -> "CropPlan":
        """Where each sample's output comes from, reading headers only (for GPU decoders).

        Same crops and flips as ``run`` for the same (seed, epoch, indices). Samples whose
        header cannot be read are listed in ``failures`` (non-JPEGs among them, with
        ``not_jpeg_rows`` set so a caller can fall back to ``run`` for them).
        """
        spec = native_spec(transform)
        index_arr = None if indices is None else np.ascontiguousarray(indices, dtype=np.int64)
        with self._lock:
            if self._native is None:
                raise RuntimeError("Engine is closed")
            raw = self._native.plan(items, spec, seed, epoch, index_arr, max_pixels)
        plan = CropPlan(boxes=raw.boxes, flips=raw.flips, sizes=raw.sizes, orientations=raw.orientations)
        for failure in raw.failures:
            row = failure.row
            if failure.status == _C.SampleStatus.NOT_JPEG:
                plan.not_jpeg_rows.append(row)
            else:
                index = int(index_arr[row]) if index_arr is not None else row
                item = items[row]
                plan.failures.append(DecodeError(failure.message, index=index,
                                                 name=item if isinstance(item, str) else None))
                plan.failed_rows.append(row)
        return plan

    def read_files(self, paths: Sequence[str]) -> Tuple[List[np.ndarray], List[Optional[str]]]:
        """Read whole files on the native threads: a uint8 array per path (empty when it could
        not be read) and, per path, None or the reason it could not be read."""
        with self._lock:
            if self._native is None:
                raise RuntimeError("Engine is closed")
            return self._native.read_files([os.fspath(p) for p in paths])

    def close(self) -> None:
        """Join the native threads. Idempotent."""
        with self._lock:
            native, self._native = self._native, None
        del native  # the native destructor joins its threads with the GIL released

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
