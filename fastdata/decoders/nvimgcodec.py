"""GPU decoder "gpu": NVIDIA nvImageCodec on the GPU's hardware JPEG engines, then one batched resample.

Per batch, on this decoder's own three worker threads (so the native threads decode their
share of the same batch meanwhile): stage 1, encoded bytes -> nvImageCodec code streams
(header parsing); stage 2, ``nvimgcodec.Decoder.decode`` (stored orientation, HWC uint8 RGB
on the GPU) and nothing else, so the engines get the next batch as soon as they finish one:
one call per decoder instance, each on its own thread and stream with a slice of the batch
(the call is host-bound), each filling the images of a batch already resampled; stage 3 checks the images and ``resample_batch`` (the Triton
kernels: crop + antialiased resize + flip, EXIF orientation folded into the gather) reads
them where nvImageCodec put them (``ImageLayout.of_arrays``: their pointers and strides).
The stages overlap across batches. Crops come from the native engine's plan, so they equal
the native path's for the same (seed, epoch, index).

Which rows: 8-bit Huffman JPEGs with 3 components that end with EOI (routing.py's
``gpu_decodable``; gray files go native, see ``accepts``), and not progressive: the hardware engines decode baseline scans only, and
a progressive file on them comes back refused after the batch (a serial native re-decode),
so it is routed to the native threads up front. Rows the engines still refuse (nvImageCodec
returns None for them) or that decode to an unexpected size are handed back to the native
decoder (``DecodedRows.rejected``), counted in ``Loader.stats().gpu_rejected``.

Why the hardware backend alone: nvImageCodec's CUDA (``GPU_ONLY``) and hybrid backends burn
CPU cores on Huffman decoding (12-13 cores for 7,600-10,700 img/s on the H200 box, #14), and
the native engine spends those cores better; the engines decode with ~1.3 cores.
"""
from __future__ import annotations

import importlib.util
import threading
import time
from dataclasses import dataclass, field
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..io.transforms import RandomResizedCrop, Transform
from .base import DecodedRows, PlannedBatch
from .gpu_resize import ImageLayout, resample_batch
from .routing import gpu_decodable

GPU_MISSING = ("backend='gpu' needs NVIDIA nvImageCodec: pip install fastdata[gpu] "
               "(nvidia-nvimgcodec-cu13 and nvidia-nvjpeg)")


# nvImageCodec backend kinds the gpu decoder uses: the hardware engines alone (see above).
ENGINE_KINDS = ("HW_GPU_ONLY",)
# Largest image (pixels) the engines are given: 16 MP, 48 MB decoded; ImageNet-like photos are
# ~0.2 MP. Larger ones are decoded (and cropped before they are expanded) by the native threads.
MAX_GPU_PIXELS = 4096 * 4096
# nvImageCodec decoder instances per gpu decoder, each called from its own thread (see
# NvImageCodecDecoder's decode_threads), by backend. Measured on the H200 box (docs/results.md,
# third pass): decode only, two instances ran 24,045 img/s against one's 17,181 (three:
# 21,026), and gpu-only gained from the second (13,922 vs 11,214). In "hybrid" the second
# caller shares the host with the native threads (and the GIL, which nvImageCodec's call takes
# back for every image); two short runs disagreed (12,739 vs 15,360, then 16,309 vs 14,721),
# so hybrid keeps the one caller, the fewer threads, until a longer A/B decides.
DECODE_THREADS = {"gpu": 2, "hybrid": 1}


def gpu_extra_installed() -> bool:
    """Whether nvImageCodec is installed, without importing it (its import loads the CUDA
    codec libraries and prints errors for those missing, e.g. on a machine without a GPU)."""
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ImportError:  # no "nvidia" package at all
        return False


def nvimgcodec_module() -> Any:
    """``nvidia.nvimgcodec``, or None when the ``gpu`` extra is not installed."""
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return None
    return nvimgcodec


class NvImageCodecDecoder:
    """Batched JPEG decode on the hardware engines (nvImageCodec), crop/resize/flip batched on the GPU.

    ``start`` queues the batch on the worker threads and returns at once; ``finish`` waits for
    it and returns float32 [k, H, W, 3] pixels (values 0..255) on ``device``, complete (the
    worker waited for its kernels), plus the rows handed back, and ``seconds``: its slowest
    stage's wall time for the batch (the hybrid split's GPU rate).

    cpu_threads: nvImageCodec's host threads (parsing, engine submission), per decoder instance.
    decode_threads: nvImageCodec decoder instances, each called from a thread of its own on its
    own CUDA stream with a slice of the batch: the call is host-bound (its calling thread is
    busy 83-99% of the call), so one caller caps the engines at one thread's rate.
    Each instance gets the images (device buffers) of a batch whose resample has finished back
    to decode into (``reuse_images``): without that, nvImageCodec allocates and wraps a new
    buffer per image per batch (decode only: 22,377 img/s with reuse, 17,181 without).
    backend_kinds: nvImageCodec backend kinds to allow, by name (default: the hardware
    engines only). The tests pass ``("CPU_ONLY",)`` to run the decoder's assembly on a
    machine without a GPU (``_allow_cpu``).
    """

    name = "gpu"
    # Two batches in flight: the worker decodes batch N+1 while the producer finishes batch N
    # (its native rows, the upload), so the engines do not idle while the next batch is planned.
    depth = 2
    reuse_images = True
    _allow_cpu = False

    def __init__(self, transform: Transform, *, device: torch.device, cpu_threads: int = 4,
                 decode_threads: Optional[int] = None,
                 backend_kinds: Tuple[str, ...] = ENGINE_KINDS) -> None:
        nvimgcodec = nvimgcodec_module()
        if nvimgcodec is None:
            raise ImportError(GPU_MISSING)
        device = torch.device(device)
        if not self._allow_cpu:
            if device.type != "cuda":
                raise ValueError(f"backend='gpu' decodes on a CUDA device; got device={device}. "
                                 "Use backend='native' for CPU output.")
            if not torch.cuda.is_available():
                raise RuntimeError("backend='gpu' needs CUDA, but torch.cuda.is_available() is False")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        if cpu_threads < 1:
            raise ValueError("cpu_threads must be at least 1")
        decode_threads = DECODE_THREADS["gpu"] if decode_threads is None else decode_threads
        if isinstance(decode_threads, bool) or not isinstance(decode_threads, int) or decode_threads < 1:
            raise ValueError(f"decode_threads must be an int of at least 1, got {decode_threads!r}")
        self.transform = transform
        self.out_hw = transform.output_size
        self.device = device
        self.hardware_only = tuple(backend_kinds) == ENGINE_KINDS
        kinds = []
        for kind in backend_kinds:
            value = getattr(nvimgcodec.BackendKind, kind, None)
            if value is None:
                raise ValueError(f"unknown nvImageCodec backend kind {kind!r}")
            kinds.append(nvimgcodec.Backend(value))
        device_id = device.index if device.type == "cuda" else nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
        try:
            self._decoders = [nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=int(cpu_threads),
                                                 backends=kinds) for _ in range(decode_threads)]
        except Exception as e:  # nvImageCodec raises its own exception types
            raise RuntimeError(f"backend='gpu': nvImageCodec could not create a decoder for {list(backend_kinds)} "
                               f"on {device}: {e}") from e
        # Stored orientation (the resample folds EXIF in, as for the native plan), interleaved RGB.
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                               sample_format=nvimgcodec.SampleFormat.I_RGB)
        self._code_stream = nvimgcodec.CodeStream
        self._parse_worker = ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-parse")
        self._decode_worker = ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-decode")
        # The other instances' callers: the decode stage calls instance 0 itself.
        self._decode_helpers = (ThreadPoolExecutor(decode_threads - 1, thread_name_prefix="fastdata-gpu-decode")
                                if decode_threads > 1 else None)
        self._resample_worker = ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-resample")
        self._decode_streams = ([torch.cuda.Stream(device) for _ in range(decode_threads)]
                                if device.type == "cuda" else [None] * decode_threads)
        self._closed = False
        self._lock = threading.Lock()
        # Per decoder instance, the images of batches whose resample has finished (GPU work
        # included): the next decode calls fill them again. At most depth + 1 sets and
        # SPARE_BYTES each (see ``reusable`` for what a set keeps); they stay allocated while
        # the decoder lives (also between epochs), outside torch's allocator.
        self._spare_images: List[List[List[Any]]] = [[] for _ in range(decode_threads)]
        self._spare_bytes: List[List[int]] = [[] for _ in range(decode_threads)]  # each set's capacity, summed once
        # Where the workers' time goes, summed over batches (seconds of wall time): code streams
        # (header parsing), the nvImageCodec calls (wall time of the stage, and decode_cpu: the
        # CPU time of every calling thread, summed over the instances: near decode_threads x
        # the wall time means the calls work or spin on the host, near zero that they sleep
        # while the engines decode), checking the images and reading their array interfaces,
        # queueing the resample, and waiting for the stream (the GPU work left).
        self.stage_seconds = {"parse": 0.0, "decode": 0.0, "decode_cpu": 0.0, "assemble": 0.0, "resample": 0.0,
                              "gpu_wait": 0.0}

    # ---- the Decoder protocol ----
    def accepts(self, batch: PlannedBatch, row: int) -> bool:
        if not gpu_decodable(batch, row):
            return False
        # Gray JPEGs go native: decoded on the H200's engines (nvImageCodec 0.9) the demo set's
        # gray files came back 11-14 dB off the native decode, 5 of 5 (2026-12-02), though a
        # synthetic gray file matched Pillow; until that is understood, no wrong pixels.
        if batch.plan.components[row] != 3:
            return False
        # Very large images go native: nvImageCodec's outputs live on the training GPU outside
        # torch's allocator, whole (not cropped): the batches in flight, plus the spare sets.
        if int(batch.plan.sizes[row, 0]) * int(batch.plan.sizes[row, 1]) > MAX_GPU_PIXELS:
            return False
        return not (self.hardware_only and bool(batch.plan.progressive[row]))

    def start(self, batch: PlannedBatch, rows: List[int]) -> "Future[DecodedRows]":
        with self._lock:
            if self._closed:
                raise RuntimeError("the gpu decoder is closed")
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            parsed = self._parse_worker.submit(self._parse_stage, batch, list(rows))
            decoded = self._decode_worker.submit(self._decode_stage, parsed)
            return self._resample_worker.submit(self._resample_stage, batch, decoded, stream)

    def finish(self, handle: "Future[DecodedRows]", host: Optional[np.ndarray]) -> DecodedRows:
        return handle.result()

    def discard(self, handle: "Future[DecodedRows]") -> None:
        try:
            handle.result()  # finishes on its own; waiting keeps the stream's queue in order
        except Exception:
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for worker in (self._parse_worker, self._decode_worker, self._decode_helpers, self._resample_worker):
            if worker is not None:
                worker.shutdown(wait=True)  # in stage order: each later stage's queue is complete
        self._decoders = []
        self._spare_images, self._spare_bytes = [], []  # their device buffers go now, not when this object does

    # ---- the three stages ----
    # Each stage has its own thread, so the ``depth`` batches in flight overlap: while batch N
    # is resampled (stage 3, the pipeline's stream, after an event from stage 2), batch N+1 is
    # parsed (stage 1) and decoded on the engines (stage 2, its own stream): the engines wait
    # neither for the parsing nor for the resample's host work. (Depth 3, one batch per stage,
    # ran no faster on the H200: docs/results.md.)
    def _parse_stage(self, batch: PlannedBatch, rows: List[int]) -> _Decoded:
        t0 = time.perf_counter()
        datas = batch.datas
        streams, kept, rejected = [], [], []
        for r in rows:
            try:
                streams.append(self._code_stream(datas[r]))
                kept.append(r)
            except Exception:  # a header nvImageCodec cannot parse: the native decoder names the problem
                rejected.append(r)
        seconds = time.perf_counter() - t0
        self.stage_seconds["parse"] += seconds
        return _Decoded(kept, streams, rejected, parse_seconds=seconds)

    def _decode_stage(self, pending: "Future[_Decoded]") -> _Decoded:
        """Stage 2: the batch's code streams in contiguous slices, one per decoder instance; this
        thread calls instance 0 while the helpers call the others."""
        decoded = pending.result()
        t0 = time.perf_counter()
        slices = decode_slices(len(decoded.streams), len(self._decoders))
        calls = [self._decode_helpers.submit(self._decode_slice, k, decoded.streams[lo:hi])
                 for k, (lo, hi) in enumerate(slices) if k > 0]
        results, error = [], None
        if slices:
            try:
                results.append(self._decode_slice(0, decoded.streams[slices[0][0]:slices[0][1]]))
            except Exception as e:
                error = e
        for call in calls:  # every helper is waited for, also after a failure: they use the streams
            try:
                results.append(call.result())
            except Exception as e:
                error = error or e
        if error is not None:
            raise error
        decoded.images = [img for part in results for img in part.images]  # slice order = row order
        decoded.ready = [part.ready for part in results if part.ready is not None]
        decoded.by_instance = results
        decoded.streams = []
        decoded.seconds = time.perf_counter() - t0
        self.stage_seconds["decode"] += decoded.seconds
        self.stage_seconds["decode_cpu"] += sum(part.cpu_seconds for part in results)
        return decoded

    def _decode_slice(self, k: int, streams: List[Any]) -> _Slice:
        """Decoder instance ``k`` on its own stream."""
        c0 = time.thread_time()
        stream = self._decode_streams[k]
        if stream is None:
            part = self._decode(k, streams, 0)
        else:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                part = self._decode(k, streams, stream.cuda_stream)
                part.ready = torch.cuda.Event()  # waited on by the GPU only (wait_event)
                part.ready.record(stream)
        part.cpu_seconds = time.thread_time() - c0
        return part

    def _decode(self, k: int, streams: List[Any], cuda_stream: int) -> _Slice:
        if not streams:
            return _Slice([])
        spare = self._take_spare(k, len(streams))
        if spare is None:
            return _Slice(self._decoders[k].decode(streams, params=self._params, cuda_stream=cuda_stream))
        return _Slice(self._decoders[k].decode(streams, images=spare, params=self._params, cuda_stream=cuda_stream))

    def _take_spare(self, k: int, n: int) -> Optional[List[Optional[Any]]]:
        """``n`` images of instance ``k`` to decode into (None where a new one is needed:
        nvImageCodec allocates it), or None when it has none spare."""
        if not self.reuse_images:
            return None
        with self._lock:
            if not self._spare_images[k]:
                return None
            spare = self._spare_images[k].pop()
            self._spare_bytes[k].pop()
        return spare[:n] + [None] * (n - len(spare))

    def _give_back(self, decoded: _Decoded) -> None:
        """After the batch's resample has finished on the GPU: its images may be decoded into again
        (by the instance that made them, on the stream they were made on)."""
        with self._lock:
            for k, part in enumerate(decoded.by_instance):
                kept = reusable(part.images)
                nbytes = sum(img.capacity for img in kept)
                if kept and len(self._spare_images[k]) <= self.depth and sum(self._spare_bytes[k]) + nbytes <= SPARE_BYTES:
                    self._spare_images[k].append(kept)
                    self._spare_bytes[k].append(nbytes)
        decoded.by_instance = []

    def _resample_stage(self, batch: PlannedBatch, pending: "Future[_Decoded]",
                        stream: Optional[torch.cuda.Stream]) -> DecodedRows:
        decoded = pending.result()
        t0 = time.perf_counter()
        if stream is None:
            result = self._resample_rows(batch, self._assemble(batch, decoded))
        else:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                for ready in decoded.ready:
                    stream.wait_event(ready)
                try:
                    result = self._resample_rows(batch, self._assemble(batch, decoded))
                finally:  # also when the resample raised after queueing kernels: they read the images
                    done = torch.cuda.Event(blocking=True)  # the worker sleeps on it instead of spinning a core
                    done.record(stream)
                    t1 = time.perf_counter()
                    done.synchronize()  # complete before the images go and before finish hands the pixels on
                    self.stage_seconds["gpu_wait"] += time.perf_counter() - t1
        self._give_back(decoded)  # the resample's kernels are done with the images (synchronized above)
        # Pipelined, the slowest stage sets the rate: the hybrid split's GPU time for the batch.
        result.seconds = max(decoded.parse_seconds, decoded.seconds, time.perf_counter() - t0)
        return result

    def _assemble(self, batch: PlannedBatch, decoded: _Decoded) -> _Decoded:
        """Keep the images the plan expects; hand the rest back. The resample reads them where
        nvImageCodec put them (their array interfaces: pointer, shape, strides): no per-image
        tensor, no copy into one buffer."""
        t0 = time.perf_counter()
        plan = batch.plan
        kept, images, rejected = decoded.rows, decoded.images, list(decoded.rejected)
        cuda = self.device.type == "cuda"
        good_rows: List[int] = []
        good: List[Any] = []
        interfaces: List[Dict[str, Any]] = []
        # The stored (H, W, 3) each image must have: the plan's size is oriented.
        sizes = plan.sizes[kept]
        turned = plan.orientations[kept] >= 5
        stored = np.stack([np.where(turned, sizes[:, 1], sizes[:, 0]), np.where(turned, sizes[:, 0], sizes[:, 1]),
                           np.full(len(kept), 3)], axis=1).tolist()
        for r, img, want in zip(kept, images, stored):
            if img is None:  # refused by the engines (an unsupported sampling, damaged data)
                rejected.append(r)
                continue
            iface = img.__cuda_array_interface__ if cuda else img.__array_interface__  # CPU: the tests' stand-in
            if list(iface["shape"]) != want or iface["typestr"][1:] != "u1":
                rejected.append(r)  # not the header's image: the plan's box would be wrong
                continue
            good_rows.append(r)
            good.append(img)
            interfaces.append(iface)
        decoded.rows, decoded.images, decoded.rejected = good_rows, good, sorted(rejected)
        if good:  # a one-element tensor at the first image: the kernels' address origin
            first = torch.as_tensor(good[0], device=self.device) if cuda else torch.from_numpy(np.asarray(good[0]))
            decoded.origin = first.as_strided((1,), (1,))
            decoded.layout = ImageLayout.of_arrays(decoded.origin.data_ptr(), interfaces)
        self.stage_seconds["assemble"] += time.perf_counter() - t0
        return decoded

    def _resample_rows(self, batch: PlannedBatch, decoded: _Decoded) -> DecodedRows:
        if decoded.origin is None:
            return DecodedRows(rejected=decoded.rejected)
        plan = batch.plan
        t0 = time.perf_counter()
        sel = np.asarray(decoded.rows, np.int64)
        pixels = resample_batch(decoded.origin, decoded.layout, plan.boxes[sel], plan.flips[sel],
                                plan.orientations[sel], self.out_hw,
                                clip_to_box=isinstance(self.transform, RandomResizedCrop))
        self.stage_seconds["resample"] += time.perf_counter() - t0
        return DecodedRows(pixels=pixels, rejected=decoded.rejected)


def decode_slices(n: int, parts: int) -> List[Tuple[int, int]]:
    """``n`` rows in at most ``parts`` contiguous, near-equal, non-empty slices (start, end)."""
    parts = max(1, min(parts, n))
    bounds = [n * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts)] if n else []


# A reused image's buffer keeps the largest image it has held (nvImageCodec grows it, never
# shrinks it; ``Image.capacity`` says how large it is), so a set handed back keeps only
# buffers at most this many times its batch's median image: without that bound every slot
# would end up holding the largest image of the dataset (up to MAX_GPU_PIXELS, 48 MB).
REUSE_SLACK = 2
# And the spare sets of one decoder instance hold at most this many bytes together: a set that
# would go over is not kept (its images are freed; the next batch allocates). 512 MB holds
# three sets of 128 photo-like 500x375 images (72 MB each) with room to spare.
SPARE_BYTES = 512 * 2**20


def image_bytes(image: Any) -> int:
    """Bytes of a decoded HWC uint8 image."""
    h, w, c = image.shape
    return int(h) * int(w) * int(c)


def reusable(images: List[Optional[Any]]) -> List[Any]:
    """The images of a decoded slice worth decoding into again: those whose buffer (capacity)
    is at most ``REUSE_SLACK`` x the slice's median image (refused rows, None, are dropped)."""
    present = [img for img in images if img is not None]
    if not present:
        return []
    limit = REUSE_SLACK * float(np.median([image_bytes(img) for img in present]))
    return [img for img in present if img.capacity <= limit]


@dataclass
class _Slice:
    """One decoder instance's part of a batch: its images (None where refused), the event its
    stream records after the decode, and the CPU seconds of the calling thread."""

    images: List[Optional[Any]]
    ready: Optional[Any] = None  # torch.cuda.Event
    cpu_seconds: float = 0.0


@dataclass
class _Decoded:
    """A batch's GPU rows between the stages: the rows (in order) and their code streams
    (stage 1), nvImageCodec's images (stage 2: HWC uint8, on the decode stream until
    ``ready``; ``images`` keeps them alive until the resample has read them), then only the
    rows whose images fit the plan with where their pixels are (stage 3), and the rows
    handed back."""

    rows: List[int]
    streams: List[Any]
    rejected: List[int]
    images: List[Any] = field(default_factory=list)
    ready: List[Any] = field(default_factory=list)  # torch.cuda.Event per decoder instance used
    by_instance: List["_Slice"] = field(default_factory=list)  # stage 2's result per decoder instance
    parse_seconds: float = 0.0  # stage 1's wall time
    seconds: float = 0.0  # stage 2's wall time
    origin: Optional[torch.Tensor] = None  # one element at the first image: the layout's address origin
    layout: Optional[ImageLayout] = None
