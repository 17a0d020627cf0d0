"""What every decoding backend shares: reading items, the crop plan, routing, CPU fallback.

A batch goes through ``BatchBackend.run`` in four steps, all on the caller's (producer) thread:
1. items (paths or buffers) become encoded bytes (paths read by the native engine's threads);
2. ``Engine.plan`` gives each sample's crop box and flip from (seed, epoch, index), exactly
   the native engine's, plus header failures;
3. samples a GPU decoder handles are decoded and resampled by the subclass (``_start`` /
   ``_finish``); the others (non-JPEG, CMYK/YCCK, 12-bit, truncated files in strict mode,
   and anything the GPU decoder rejects) go through the native engine, are uploaded and
   normalized the same way, so a batch is never lost;
4. rows are assembled into one [B, H, W, 3] tensor and returned as an NCHW view.

``run`` is ``collect(submit(...))``. A backend whose decoder works asynchronously (DALI)
has ``pipeline_depth`` > 1: the Loader then submits that many batches ahead and collects
them in order, so steps 1-2 of the next batches overlap the decoder's work on this one.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import DecodeError
from ..io.engine import DEFAULT_MAX_PIXELS, CropPlan, Engine
from ..io.transforms import CenterCrop, RandomResizedCrop, Transform
from ..loader.cuda import GpuNormalizer, to_device

Item = Union[str, bytes, bytearray, memoryview, np.ndarray]

_SOF_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


@dataclass(frozen=True)
class FrameInfo:
    """A JPEG frame header: sample precision (bits), components and SOF marker."""

    precision: int
    components: int
    marker: int

    @property
    def progressive(self) -> bool:
        return self.marker in _SOF_PROGRESSIVE

    @property
    def baseline_like(self) -> bool:
        """8-bit Huffman DCT (baseline, extended or progressive) with 1 or 3 components:
        what nvJPEG and DALI's GPU decoder take. 4 components (CMYK/YCCK, often Adobe-
        inverted), 12-bit, lossless and arithmetic-coded frames go to the native decoder."""
        return self.precision == 8 and self.components in (1, 3) and self.marker in (0xC0, 0xC1, 0xC2)


def frame_info(data: Union[bytes, memoryview, np.ndarray]) -> Optional[FrameInfo]:
    """Walk the JPEG markers up to the frame header (a few segments; no pixel data read).

    Returns None when no frame header is found (not a JPEG, or damaged headers).
    ``fastdata.probe`` says the same but costs ~40 us per image; this costs a few.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(view)
    if n < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if view[i] != 0xFF:
            return None
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # segments without a length
            i += 2
            continue
        length = (view[i + 2] << 8) | view[i + 3]
        if marker in _SOF:
            if i + 10 > n:
                return None
            return FrameInfo(precision=view[i + 4], components=view[i + 9], marker=marker)
        if marker in (0xDA, 0xD9) or length < 2:  # scan or end before any frame header
            return None
        i += 2 + length
    return None


def ends_with_eoi(data: Union[bytes, memoryview, np.ndarray]) -> bool:
    """True when the JPEG ends with its EOI marker (trailing zero padding allowed).

    A file without EOI (the common truncation) goes to the native decoder: GPU decoders do
    not report libjpeg's corrupt-data warnings (strict mode) and DALI fails whole batches.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    end = len(view)
    limit = max(0, end - 4096)
    while end > limit and view[end - 1] == 0:
        end -= 1
    return end >= 2 and view[end - 2] == 0xFF and view[end - 1] == 0xD9


def read_items(items: Sequence[Item], engine: Engine) -> Tuple[List[np.ndarray], List[Optional[str]], List[Optional[str]]]:
    """Encoded bytes of each item as a writable uint8 numpy array, its name (path or None),
    and why it could not be read (None when it was).

    Paths are read by the engine's native threads (GIL released, no Python per file: a
    Python thread pool cost ~125 us per file on the 2-core box, more than the read); buffers are copied
    once so the result owns its memory (torch refuses read-only arrays, and LMDB views die
    with their transaction). An unreadable or empty item gives an empty array.
    """
    names: List[Optional[str]] = [it if isinstance(it, str) else None for it in items]
    datas: List[Optional[np.ndarray]] = [None] * len(items)
    reasons: List[Optional[str]] = [None] * len(items)
    rows = [i for i, it in enumerate(items) if isinstance(it, str)]
    if rows:
        arrays, errors = engine.read_files([items[i] for i in rows])
        for i, array, error in zip(rows, arrays, errors):
            datas[i] = array
            reasons[i] = error if error is not None else ("empty file" if array.size == 0 else None)
    for i, it in enumerate(items):
        if datas[i] is None:
            datas[i] = np.frombuffer(it, dtype=np.uint8).copy()
            if datas[i].size == 0:
                reasons[i] = "empty buffer"
    return datas, names, reasons  # type: ignore[return-value]


def check_transform(transform: Transform) -> Tuple[int, int]:
    if not isinstance(transform, (RandomResizedCrop, CenterCrop)):
        raise TypeError(f"transform must be fastdata.RandomResizedCrop or fastdata.CenterCrop, "
                        f"got {type(transform).__name__}")
    return transform.output_size


def resolve_dtype(dtype: Union[torch.dtype, str, None]) -> Optional[torch.dtype]:
    """torch dtype of the output; None or torch.uint8 means raw uint8 NHWC."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype == torch.uint8:
        return None
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype must be torch.float16, torch.bfloat16, torch.float32 or torch.uint8, got {dtype!r}")
    return dtype


@dataclass
class PendingBatch:
    """A submitted batch: its bytes, plan and routing, and the decoder's handle for its GPU rows."""

    n: int
    index_arr: np.ndarray
    datas: List[np.ndarray]
    names: List[Optional[str]]
    plan: CropPlan
    epoch: int
    gpu_rows: List[int]
    cpu_rows: List[int]
    failures: List[Tuple[int, DecodeError]] = field(default_factory=list)  # (row, error)
    failed: set = field(default_factory=set)
    handle: Any = None  # what the subclass's _start returned (None when no GPU rows)


class BatchBackend:
    """Base of the GPU backends: plan, route, fall back, assemble. Subclasses implement ``_decode``.

    Not thread-safe: one producer thread calls ``run``. On CUDA, work is queued on
    ``self.stream``; the returned tensors are ready once the consumer's stream waits on it
    (``torch.cuda.current_stream().wait_stream(backend.stream)``, then ``record_stream``).
    """

    name = "base"
    pipeline_depth = 1  # batches the Loader may submit before collecting the first

    def __init__(self, transform: Transform, *, device: Union[str, torch.device] = "cuda",
                 dtype: Union[torch.dtype, str, None] = torch.float16,
                 mean: Sequence[float] = (0.485, 0.456, 0.406), std: Sequence[float] = (0.229, 0.224, 0.225),
                 channels_last: bool = True, seed: int = 0, strict: bool = False,
                 max_pixels: int = DEFAULT_MAX_PIXELS, threads: Optional[int] = None):
        self.out_hw = check_transform(transform)
        self.transform = transform
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
            raise ValueError(f"mean and std need 3 values, std positive; got {mean!r}, {std!r}")
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.channels_last = bool(channels_last)
        if seed < 0:
            raise ValueError("seed must be non-negative")
        self.seed = int(seed)
        self.strict = bool(strict)
        self.max_pixels = int(max_pixels)
        self.engine = Engine(threads)
        self.threads = self.engine.threads
        self._closed = False
        self.stream: Optional[torch.cuda.Stream] = None
        if self.device.type == "cuda":
            self.stream = torch.cuda.Stream(device=self.device)
        # Constants on the device once, not per batch (see fastdata.loader.cuda.GpuNormalizer).
        self._normalizer = (None if self.dtype is None else
                            GpuNormalizer(self.mean, self.std, self.dtype, True, self.device))
        self._pinned: Optional[torch.Tensor] = None
        self._pinned_free: Optional[torch.cuda.Event] = None
        self.stats = {"batches": 0, "gpu_decoded": 0, "native_fallbacks": 0, "gpu_rejected": 0}

    # -- subclass hooks -----------------------------------------------------------------
    def _decode(self, datas: List[np.ndarray], plan: CropPlan, rows: List[int],
                epoch: int) -> Tuple[Optional[torch.Tensor], List[int]]:
        """Decode + crop + resize + flip + normalize ``rows`` of the batch on the device.

        Returns ([len(ok rows), H, W, 3] tensor in the output dtype — normalized float, or
        uint8 when ``self.dtype`` is None — for the rows not rejected, in order) and the rows
        the decoder rejected (they go to the native path). Synchronous backends implement
        this; asynchronous ones implement ``_start`` and ``_finish`` instead.
        """
        raise NotImplementedError

    def _start(self, datas: List[np.ndarray], plan: CropPlan, rows: List[int], epoch: int) -> Any:
        """Queue the decode of ``rows``; returns a handle for ``_finish`` (here: the result)."""
        return self._decode(datas, plan, rows, epoch)

    def _finish(self, handle: Any) -> Tuple[Optional[torch.Tensor], List[int]]:
        """What ``_decode`` returns, for a handle from ``_start`` (called in submission order)."""
        return handle

    # -- the batch ----------------------------------------------------------------------
    def run(self, items: Sequence[Item], indices: Sequence[int],
            epoch: int) -> Tuple[torch.Tensor, List[DecodeError], List[int]]:
        """One batch. items: paths or encoded buffers; indices: int64 dataset indices (RNG keys).

        Returns images [B, 3, H, W] (normalized ``dtype``; channels_last memory when asked) on
        ``device`` — or uint8 [B, H, W, 3] when dtype is uint8 — the failures (DecodeError
        with .index = dataset index, .name = path) and the failed rows, which hold black
        (zero uint8 pixels, normalized like the others).
        """
        return self.collect(self.submit(items, indices, epoch))

    def submit(self, items: Sequence[Item], indices: Sequence[int], epoch: int) -> PendingBatch:
        """Read, plan and route a batch, and start decoding its GPU rows (see ``run``)."""
        n = len(items)
        index_arr = self._check_batch(items, indices, epoch)
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        datas, names, unreadable = read_items(items, self.engine)
        plan = self.engine.plan(datas, self.transform, seed=self.seed, epoch=epoch, indices=index_arr,
                                max_pixels=self.max_pixels)
        batch = PendingBatch(n, index_arr, datas, names, plan, epoch, [], [])
        for err, row in zip(plan.failures, plan.failed_rows):
            reason = unreadable[row] or err.reason
            batch.failures.append((row, DecodeError(reason, index=int(index_arr[row]), name=names[row])))
            batch.failed.add(row)
        not_jpeg = set(plan.not_jpeg_rows)
        for row in range(n):  # cheap header checks (a few us each): route each sample once
            if row in batch.failed:
                continue
            info = None if row in not_jpeg else frame_info(datas[row])
            # Files without EOI (truncated) decode natively: libjpeg reports or grey-fills them as
            # `strict` asks, while GPU decoders fail the whole batch or return garbage for them.
            if info is None or not info.baseline_like or not ends_with_eoi(datas[row]):
                batch.cpu_rows.append(row)
            else:
                batch.gpu_rows.append(row)
        if batch.gpu_rows:
            with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
                batch.handle = self._start(datas, plan, batch.gpu_rows, epoch)
        return batch

    def collect(self, batch: PendingBatch) -> Tuple[torch.Tensor, List[DecodeError], List[int]]:
        """The finished batch (as ``run`` returns it). Batches are collected in submission order."""
        n, cpu_rows, failures, failed = batch.n, list(batch.cpu_rows), list(batch.failures), set(batch.failed)
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            gpu_out, rejected = (None, [])
            if batch.gpu_rows:
                gpu_out, rejected = self._finish(batch.handle)
                batch.handle = None
            self.stats["gpu_rejected"] += len(rejected)
            if rejected:
                rej = set(rejected)
                ok_rows = [r for r in batch.gpu_rows if r not in rej]
                cpu_rows = sorted(cpu_rows + rejected)
            else:
                ok_rows = batch.gpu_rows
            cpu_out = None
            if cpu_rows:
                cpu_out, cpu_fail_rows, cpu_failures = self._native(batch.datas, batch.names, batch.index_arr,
                                                                    cpu_rows, batch.epoch)
                failures.extend(zip(cpu_fail_rows, cpu_failures))
                failed.update(cpu_fail_rows)
            self.stats["gpu_decoded"] += len(ok_rows)
            self.stats["native_fallbacks"] += len(cpu_rows)
            self.stats["batches"] += 1
            out = self._assemble(n, ok_rows, gpu_out, cpu_rows, cpu_out)
        return out, [err for _, err in sorted(failures, key=lambda pair: pair[0])], sorted(failed)

    def discard(self, batch: PendingBatch) -> None:
        """Drop a submitted batch nobody will collect (an epoch left early), keeping the
        decoder's queue in step. Never raises: the batch's errors no longer matter."""
        if batch.handle is None:
            return
        try:
            with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
                self._finish(batch.handle)
        except Exception:
            pass
        batch.handle = None

    @staticmethod
    def _check_batch(items: Sequence[Item], indices: Sequence[int], epoch: int) -> np.ndarray:
        """``indices`` as int64 [len(items)]; raises for a mismatch or a negative epoch."""
        index_arr = np.ascontiguousarray(indices, dtype=np.int64)
        if index_arr.shape != (len(items),):
            raise ValueError(f"indices must have {len(items)} entries, got shape {index_arr.shape}")
        if epoch < 0:
            raise ValueError("epoch must be non-negative")
        return index_arr

    def _native(self, datas: Sequence[Item], names: List[Optional[str]], index_arr: np.ndarray,
                rows: List[int], epoch: int) -> Tuple[torch.Tensor, List[int], List[DecodeError]]:
        """The native engine for ``rows``: uint8 into pinned memory, then to the device."""
        h, w = self.out_hw
        k = len(rows)
        host = self._host_buffer(k)
        report = self.engine.run([datas[r] for r in rows], self.transform, host.numpy(), seed=self.seed,
                                 epoch=epoch, indices=index_arr[rows], strict=self.strict,
                                 max_pixels=self.max_pixels, names=[names[r] for r in rows])
        fail_rows = [rows[i] for i in report.failed_rows]
        if self.device.type == "cuda":
            dev = host.to(self.device, non_blocking=True)
            # The pinned buffer is reused by the next batch: remember when this copy is done.
            self._pinned_free = torch.cuda.Event()
            self._pinned_free.record()
        else:
            dev = host.clone()
        return dev, fail_rows, list(report.failures)

    def _host_buffer(self, k: int) -> torch.Tensor:
        h, w = self.out_hw
        if self._pinned_free is not None:
            self._pinned_free.synchronize()  # the previous upload from this buffer has finished
            self._pinned_free = None
        if self._pinned is None or self._pinned.shape[0] < k:
            pin = self.device.type == "cuda"
            self._pinned = torch.empty((max(k, 8), h, w, 3), dtype=torch.uint8, pin_memory=pin)
        return self._pinned[:k]

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8/0..255 float NHWC -> the output dtype, still NHWC (contiguous)."""
        if self.dtype is None:
            return x if x.dtype == torch.uint8 else x.round().clamp_(0, 255).to(torch.uint8)
        return self._normalizer(x).permute(0, 2, 3, 1)  # NCHW view of NHWC memory -> back to NHWC

    def _assemble(self, n: int, ok_rows: List[int], gpu_out: Optional[torch.Tensor], cpu_rows: List[int],
                  cpu_out: Optional[torch.Tensor]) -> torch.Tensor:
        h, w = self.out_hw
        if gpu_out is not None and len(ok_rows) == n:
            nhwc = gpu_out
        elif cpu_out is not None and len(cpu_rows) == n:  # all native (failed rows are already zero)
            nhwc = self._normalize(cpu_out)
        else:
            out_dtype = torch.uint8 if self.dtype is None else self.dtype
            # Rows nobody writes (failures) hold black, normalized like every other row.
            black = self._normalize(torch.zeros((1, 1, 1, 3), dtype=torch.uint8, device=self.device))
            nhwc = black.expand(n, h, w, 3).to(out_dtype).contiguous()
            if ok_rows and gpu_out is not None:
                nhwc[to_device(torch.tensor(ok_rows), self.device)] = gpu_out
            if cpu_rows and cpu_out is not None:
                nhwc[to_device(torch.tensor(cpu_rows), self.device)] = self._normalize(cpu_out)
        if self.dtype is None:
            return nhwc
        nchw = nhwc.permute(0, 3, 1, 2)
        return nchw if self.channels_last else nchw.contiguous()

    def close(self) -> None:
        """Stop the native engine. Idempotent."""
        self._closed = True
        self.engine.close()
        self._pinned = None

    def __enter__(self) -> "BatchBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
