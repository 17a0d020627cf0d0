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
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _C
from ..errors import DecodeError
from .encoded import Item
from .host import usable_cores
from .normalization import scale_bias_for
from .pillow_fallback import decode_with_pillow
from .transforms import CenterCrop, RandomResizedCrop, Transform

# Pillow's own default Image.MAX_IMAGE_PIXELS: ~89.5 MP (a 3-channel image of 1/4 GiB).
DEFAULT_MAX_PIXELS = 89_478_485

# Input files above this size are refused from their size, before a byte is read. 256 MiB is
# the raw RGB pixels of an image at DEFAULT_MAX_PIXELS (89.5 MP x 3 B): a compressed image
# that is larger is beyond the pixel limit or mostly not image data (real photos at that pixel
# count are 10-60 MB as JPEGs). Without a cap a 3 GB sparse .jpg was read whole, twice for a
# non-JPEG (#16 item 9). Each native thread holds at most one file of this size.
DEFAULT_MAX_FILE_BYTES = 256 << 20


def _check_max_file_bytes(max_file_bytes: int) -> int:
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 0:
        raise ValueError(f"max_file_bytes must be an int >= 0 (0: no limit), got {max_file_bytes!r}")
    return max_file_bytes


def read_file(path: Union[str, "os.PathLike[str]"], max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> np.ndarray:
    """A whole file as a uint8 array, read the way the native threads read inputs (the one place
    fastdata opens an input file): regular files only (a named pipe or a device is refused, never
    waited on), at most ``max_file_bytes`` (0: no limit; checked from the size before reading).
    Raises DecodeError naming the file."""
    path = os.fspath(path)
    array, reason = _C.read_file(path, _check_max_file_bytes(max_file_bytes))
    if reason is not None:
        raise DecodeError(reason, name=path)
    return array


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
    wall_seconds: float = 0.0  # the run's own duration (a started run: its share of the native threads' time, BatchTimes)
    warnings: int = 0
    fallbacks: int = 0


@dataclass
class CropPlan:
    """Per sample: source box (x0, y0, x1, y1) in EXIF-oriented pixels (float64 [N, 4]; the
    output samples it with Pillow's pixel-centre convention), flip (bool [N]), oriented size
    (int32 [N, 2] as height, width), EXIF orientation (int32 [N]), and from the header the
    native reader parsed: components (int32 [N]), bits per sample (int32 [N]) and whether the
    entropy coding is arithmetic (bool [N]) and progressive (bool [N]), the chroma subsampling
    (int32 [N], an index into ``SUBSAMPLING_NAMES``: "other", "gray", "4:4:4", ...), and whether
    three components are RGB-coded (bool [N]: libjpeg reads them as RGB, not YCbCr). Rows in
    ``failed_rows`` or ``not_jpeg_rows`` hold zeros."""

    boxes: np.ndarray
    flips: np.ndarray
    sizes: np.ndarray
    orientations: np.ndarray
    components: np.ndarray
    precisions: np.ndarray
    arithmetic: np.ndarray
    progressive: np.ndarray
    subsamplings: np.ndarray
    rgb_coded: np.ndarray
    failures: List[DecodeError] = field(default_factory=list)
    failed_rows: List[int] = field(default_factory=list)
    not_jpeg_rows: List[int] = field(default_factory=list)


def _split_prefailed(items: Sequence[Item]) -> Tuple[Sequence[Item], Dict[int, DecodeError]]:
    """The items a source already found bad (``DecodeError`` items: a cache record failing its
    checksum) by row, and the items with empty bytes in their place: the native side fails an
    empty item, and the caller reports the source's reason for that row instead."""
    prefailed = {row: item for row, item in enumerate(items) if isinstance(item, DecodeError)}
    if prefailed:
        items = [b"" if row in prefailed else item for row, item in enumerate(items)]
    return items, prefailed


# What a normalized ``out`` may hold: float32, float16, or bfloat16 as its bits in uint16 (numpy
# has no bfloat16: fastdata.loader.pinned_ring.engine_array gives a torch bfloat16 tensor's bits).
NORMALIZED_OUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint16))


def check_out(out: np.ndarray, n: int, hw: tuple, normalized: bool = False) -> None:
    """Raise unless ``out`` is a writable C-contiguous array of shape [n, h, w, 3]: uint8,
    or one of NORMALIZED_OUT_DTYPES when ``normalized``."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array (use tensor.numpy() for torch), got {type(out).__name__}")
    if normalized and out.dtype not in NORMALIZED_OUT_DTYPES:
        raise TypeError(f"a normalized out must have dtype float32, float16 or uint16 (bfloat16 bits), got {out.dtype}")
    if not normalized and out.dtype != np.uint8:
        raise TypeError(f"out must have dtype uint8, got {out.dtype}")
    if out.shape != (n, hw[0], hw[1], 3):
        raise ValueError(f"out must have shape {(n, hw[0], hw[1], 3)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out must be writable")


class _RunCall:
    """One ``Engine.run``/``start`` call: its arguments checked and converted for the native
    engine, and the report made from what the native pass returned (names, the sources' own
    failures, and the Pillow fallback for non-JPEG rows, on the caller's thread)."""

    def __init__(self, engine: "Engine", items: Sequence[Item], transform: Transform, out: np.ndarray, seed: int,
                 epoch: int, indices: Optional[Sequence[int]], strict: bool, max_pixels: int,
                 names: Optional[Sequence[str]], roi: bool,
                 normalize: Optional[Tuple[Sequence[float], Sequence[float]]], max_file_bytes: int):
        engine._check_process()
        self.spec = native_spec(transform, roi)
        _check_max_file_bytes(max_file_bytes)
        n = len(items)
        check_out(out, n, transform.output_size, normalized=normalize is not None)
        self.scale_bias = None if normalize is None else scale_bias_for(*normalize)
        index_arr = None
        if indices is not None:
            index_arr = np.ascontiguousarray(indices, dtype=np.int64)
            if index_arr.shape != (n,):
                raise ValueError(f"indices must have {n} entries, got shape {index_arr.shape}")
            if n and index_arr.min() < 0:
                raise ValueError("indices must be non-negative")
        if seed < 0 or epoch < 0:
            raise ValueError("seed and epoch must be non-negative")
        self.items, self.prefailed = _split_prefailed(items)
        self.out, self.seed, self.epoch, self.index_arr, self.names = out, seed, epoch, index_arr, names
        self.max_pixels = max_pixels
        self.args = (self.items, self.spec, out, seed, epoch, index_arr, strict, max_pixels, max_file_bytes,
                     self.scale_bias)

    def report(self, native: Optional["_C.Engine"], raw: "_C.BatchReport") -> BatchReport:
        """``native``: the engine for the Pillow fallback's crop (None: closed before a started
        run was finished; its non-JPEG rows then fail, named)."""
        report = BatchReport(read_seconds=raw.read_seconds, decode_seconds=raw.decode_seconds,
                             wall_seconds=raw.wall_seconds, warnings=raw.warnings)
        index_arr, items, out = self.index_arr, self.items, self.out
        for failure in raw.failures:
            row, message = failure.row, failure.message
            index = int(index_arr[row]) if index_arr is not None else row
            item = items[row]
            name = self.names[row] if self.names is not None else (item if isinstance(item, str) else None)
            if row in self.prefailed:
                message, name = self.prefailed[row].reason, self.prefailed[row].name or name
            elif failure.status == _C.SampleStatus.NOT_JPEG and native is None:
                message = "not a JPEG, and the engine was closed before its batch was finished"
            elif failure.status == _C.SampleStatus.NOT_JPEG:
                try:  # a path's bytes come back from the native read: the file is read once
                    pixels = decode_with_pillow(item if failure.file_bytes is None else failure.file_bytes,
                                                self.max_pixels)
                    native.transform_pixels(pixels, self.spec, out, row, self.seed, self.epoch, index,
                                            self.scale_bias)
                    report.fallbacks += 1
                    continue
                except DecodeError as e:
                    message = e.reason
                    out[row] = 0
            report.failures.append(DecodeError(message, index=index, name=name))
            report.failed_rows.append(row)
        return report


class EngineRun:
    """A batch queued by ``Engine.start``: ``finish()`` waits for it and returns its
    ``BatchReport`` (once); ``done()`` says whether it has finished. Dropped unfinished, it
    waits for its run first (the run writes into memory the caller owns)."""

    def __init__(self, call: _RunCall, engine: "Engine", pending: "_C.PendingRun"):
        # The Python engine, not its native one: closing the engine must destroy the native
        # side (which runs what is queued, then joins its threads) while handles live on.
        self._call, self._engine, self._pending = call, engine, pending

    def done(self) -> bool:
        return self._pending.done()

    def finish(self) -> BatchReport:
        raw = self._pending.wait()
        with self._engine._lock:
            return self._call.report(self._engine._native, raw)


class Engine:
    """A persistent pool of ``threads`` native threads (the calling thread counts as one).

    ``run`` releases the GIL while it works, so it can run on a Python background thread
    while the training step runs. Synchronous calls on one engine are serialized; ``start``
    queues a batch on the engine's threads instead and returns at once.

    ``nice`` > 0: the native threads run that many nice steps below the thread that made the
    engine (Linux thread priority), so other threads of the process (the ones feeding a GPU,
    the training loop) get a core the moment they need one; ``priority_lowered`` says
    whether they could. The calling thread of ``run`` keeps its own priority.
    ``idle``: the native threads run under SCHED_IDLE instead (Linux; ``nice`` is then moot): a
    waking thread of any other policy takes their core at once, and beside busy threads they get
    a weight of 3 against nice 0's 1024 (nice 10: 110). Where the kernel refuses it they run at
    nice 19 and ``priority_lowered`` is False.
    ``thread_name``: the native threads' OS name (``top -H``, fastdata-bench's per-thread CPU),
    at most 15 characters.
    """

    def __init__(self, threads: Optional[int] = None, nice: int = 0, thread_name: str = "fastdata-native",
                 idle: bool = False):
        if threads is None:
            threads = usable_cores()
        if not isinstance(threads, int) or threads < 1 or threads > 1024:
            raise ValueError(f"threads must be an int in 1..1024, got {threads!r}")
        if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
            raise ValueError(f"nice must be an int in 0..19, got {nice!r}")
        if not isinstance(thread_name, str) or not 0 < len(thread_name) <= 15:
            raise ValueError(f"thread_name must be a string of 1 to 15 characters, got {thread_name!r}")
        self._native: Optional[_C.Engine] = _C.Engine(threads, _C.IDLE_PRIORITY if idle else nice, thread_name)
        self._idle = bool(idle)
        self._nice = nice
        self._threads = threads
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _check_process(self) -> None:
        """fork() copies only the calling thread: in a child this engine's native threads (and
        perhaps a lock another thread held) are the parent's, and a run would wait forever."""
        if os.getpid() != self._pid:
            raise RuntimeError(f"this fastdata Engine was created before fork (in process {self._pid}); its native "
                               f"threads do not exist in process {os.getpid()}: create a new Engine here "
                               "(decode_batch does so by itself)")

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def nice(self) -> int:
        """The nice steps the native threads run below their creator (0: the same priority)."""
        return self._nice

    @property
    def idle(self) -> bool:
        """Whether the native threads were asked to run under SCHED_IDLE."""
        return self._idle

    @property
    def priority_lowered(self) -> bool:
        """False when a native thread could not lower its priority as ``nice`` asked."""
        with self._lock:
            return self._open_native().priority_lowered

    def run(self, items: Sequence[Item], transform: Transform, out: np.ndarray, *, seed: int = 0,
            epoch: int = 0, indices: Optional[Sequence[int]] = None, strict: bool = False,
            max_pixels: int = DEFAULT_MAX_PIXELS, names: Optional[Sequence[str]] = None,
            roi: bool = True, normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
            max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> BatchReport:
        """Decode + transform ``items[i]`` into ``out[i]`` (uint8 [N, H, W, 3]).

        With ``normalize=(mean, std)``, ``out`` is float32, float16 or uint16 (bfloat16's bits)
        [N, H, W, 3] and receives (x / 255 - mean) / std per channel, computed by the native
        threads in float32 and rounded to nearest even into the 16-bit types (as torch casts).

        ``items`` are file paths (``str``, read by native threads) or encoded buffers; an
        item that is a ``DecodeError`` is a sample its source already found bad (e.g. an
        LMDB record failing its checksum): its row fails with that error.
        Sample i's crop and flip come from (seed, epoch, indices[i]) (default indices: 0..N-1).
        Failed rows are zero-filled and listed in the report; nothing is raised for bad data.
        ``names`` label samples in errors (defaults to the path for ``str`` items).
        ``roi=False`` turns off region-of-interest and DCT-scaled decoding (benchmarks only).
        ``max_file_bytes``: files above it fail unread (see ``read_file``).
        The calling thread decodes too (it is one of ``threads``).
        """
        call = _RunCall(self, items, transform, out, seed, epoch, indices, strict, max_pixels, names, roi, normalize,
                        max_file_bytes)
        with self._lock:
            native = self._open_native()
            return call.report(native, native.run(*call.args))

    def start(self, items: Sequence[Item], transform: Transform, out: np.ndarray, *, seed: int = 0,
              epoch: int = 0, indices: Optional[Sequence[int]] = None, strict: bool = False,
              max_pixels: int = DEFAULT_MAX_PIXELS, names: Optional[Sequence[str]] = None,
              roi: bool = True, normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
              max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> "EngineRun":
        """``run``, queued: the engine's threads decode it while the caller goes on, its rows
        claimed once the runs started before it have none left to claim (no barrier between
        runs: the last rows of one batch do not idle the other threads; ``_C._set_overlap_runs``
        puts the barrier back, for A/B runs), and it finishes after them. ``finish()`` on the
        result waits and returns the report. ``out`` (and the items' buffers) must stay
        untouched until then. The Loader starts batch n + 1 this way while it hands out batch
        n, so the native threads never wait for its Python. A synchronous call (``run``,
        ``plan``) on the same engine meanwhile starts on its rows at once on the calling
        thread, and the native threads join it once the started runs' rows are claimed: use a
        second engine for work needed at once."""
        call = _RunCall(self, items, transform, out, seed, epoch, indices, strict, max_pixels, names, roi, normalize,
                        max_file_bytes)
        with self._lock:
            native = self._open_native()
            return EngineRun(call, self, native.start_run(*call.args))

    def _open_native(self) -> "_C.Engine":
        """The native engine (under ``_lock``); RuntimeError once closed."""
        if self._native is None:
            raise RuntimeError("Engine is closed")
        return self._native

    def plan(self, items: Sequence[Item], transform: Transform, *, seed: int = 0, epoch: int = 0,
             indices: Optional[Sequence[int]] = None,
             max_pixels: int = DEFAULT_MAX_PIXELS, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> "CropPlan":
        """Where each sample's output comes from, reading headers only (for GPU decoders).

        Same crops and flips as ``run`` for the same (seed, epoch, indices). Samples whose
        header cannot be read are listed in ``failures`` (non-JPEGs among them, with
        ``not_jpeg_rows`` set so a caller can fall back to ``run`` for them).
        """
        self._check_process()
        spec = native_spec(transform)
        index_arr = None if indices is None else np.ascontiguousarray(indices, dtype=np.int64)
        _check_max_file_bytes(max_file_bytes)
        items, prefailed = _split_prefailed(items)
        with self._lock:
            if self._native is None:
                raise RuntimeError("Engine is closed")
            raw = self._native.plan(items, spec, seed, epoch, index_arr, max_pixels, max_file_bytes)
        plan = CropPlan(boxes=raw.boxes, flips=raw.flips, sizes=raw.sizes, orientations=raw.orientations,
                        components=raw.components, precisions=raw.precisions, arithmetic=raw.arithmetic,
                        progressive=raw.progressive, subsamplings=raw.subsamplings, rgb_coded=raw.rgb_coded)
        for failure in raw.failures:
            row = failure.row
            if failure.status == _C.SampleStatus.NOT_JPEG and row not in prefailed:
                plan.not_jpeg_rows.append(row)
            else:
                index = int(index_arr[row]) if index_arr is not None else row
                item = items[row]
                name = item if isinstance(item, str) else None
                message = failure.message
                if row in prefailed:
                    message, name = prefailed[row].reason, prefailed[row].name
                plan.failures.append(DecodeError(message, index=index, name=name))
                plan.failed_rows.append(row)
        return plan

    def read_files(self, paths: Sequence[str],
                   max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Tuple[List[np.ndarray], List[Optional[str]]]:
        """Read whole files on the native threads (as ``read_file`` does): a uint8 array per path
        (empty when it could not be read) and, per path, None or the reason it could not be read."""
        self._check_process()
        _check_max_file_bytes(max_file_bytes)
        with self._lock:
            if self._native is None:
                raise RuntimeError("Engine is closed")
            return self._native.read_files([os.fspath(p) for p in paths], max_file_bytes)

    def close(self) -> None:
        """Join the native threads. Idempotent."""
        if os.getpid() != self._pid:  # a forked child: nothing to join (the native side forgets the threads)
            self._native = None
            return
        with self._lock:
            native, self._native = self._native, None
        del native  # the native destructor joins its threads with the GIL released

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
