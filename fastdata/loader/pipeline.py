"""The staged batch pipeline every decoder plugs into: plan -> route -> decode into a slot -> upload -> normalize.

One batch, on the producer thread::

    pending = pipeline.submit(items, indices, epoch, names)
        plan: read bytes and plan crops from the headers (only when a GPU decoder is configured;
        the native decoder alone plans inside its one native call)
        route: each row to the first decoder that accepts it (fastdata.decoders.routing);
        "hybrid": the GPU keeps the share of its rows that the split balancer asks for
        (fastdata.loader.balance), the rest go native
        start: GPU decoders queue their rows (the pipeline's stream; DALI runs ``depth`` ahead,
        nvImageCodec on its worker thread)
        the native rows are queued on the native engine (its own thread), into the batch's
        pinned ring slot (fastdata.loader.pinned_ring: the one host staging area)
        a GPU decoder that resamples on the GPU writes its rows straight into the batch's output,
        allocated here (``PlannedBatch.output``: the dtype, layout and normalization the
        consumer gets)
    decoded = pipeline.decode(pending)
        the native rows' run is waited for, then the GPU decoders finish, and the rows they
        handed back are decoded at once into the same slot by the inline engine
    pipeline.replace(decoded, row, ...)          # the caller's skip policy, into the same slot
    images, labels, done, times = pipeline.deliver(decoded, labels=True)
        one host-to-device copy of the slot's rows (fastdata.loader.cuda), then one kernel that
        writes them, normalized, into their rows of the output beside the GPU's (place_rows);
        with a decoder that returns pixels instead (DALI, a decoder of your own) or none, the
        rows are placed side by side and normalized in one pass (GpuNormalizer); one event

Two native engines: the main one (``engine``, the native threads) only ever decodes queued
batches, so that the next batch starts the moment one ends while the producer thread does
everything else (fetch, planning, the upload, Python): the native threads no longer idle
through it. Work the producer needs at once (reading and planning for the GPU decoders, the
rows a GPU decoder hands back, replacements) goes to a small ``inline_engine`` instead, which
would otherwise wait behind the queued batches. Both give the same pixels: crops come from
(seed, epoch, index).

The host slot holds the rows decoded on the host, in order (``host_rows``; failed rows hold
zeros). When every row is native (the usual case) that is the batch itself, and on the CPU
the slot is the output.

``make_backend`` builds a pipeline outside a Loader (benchmarks, tests): ``run`` is one batch
through every stage (``collect(submit(...))``), returning images and the failed rows (black),
never replacing them.
"""
from __future__ import annotations

import math
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..decoders import make_decoder
from ..decoders.base import BatchOutput, Decoder, Item, PlannedBatch, check_plugged_decoder, to_device
from ..decoders.gpu_resize import place_rows
from ..decoders.native import NativeDecoder
from ..decoders.routing import plan_batch, read_items, route
from ..errors import DecodeError
from ..io.engine import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, BatchReport, Engine, native_spec
from ..io.host import cores_per_local_rank
from ..io.normalization import IMAGENET_MEAN, IMAGENET_STD, check_mean_std, scale_bias_for
from ..io.transforms import Transform
from .balance import SplitBalancer
from .cuda import CudaUploader, GpuNormalizer
from .pinned_ring import PinnedRing, Slot

# Cores "hybrid" leaves to the threads that feed the GPU when it picks the native thread count
# itself. Three were left while the native threads ran at normal priority (the H200 box,
# 2026-12-02: 13 native threads 13,262 img/s, 16 threads 11,769, every GPU-side thread waiting
# for a core). Under SCHED_IDLE (native_priority) the GPU side's threads take a core whenever
# they wake, and between their bursts 13 native threads left cores idle: on one H100 host
# (2026-12-07, fastdata-bench alone on the 8,192 set, four alternating pairs in two calls) 16 threads ran
# 36,569-37,147 img/s against 13's 35,395-36,083, every pair won by 16; beside ResNet-18 training
# both kept 98.5-99.6% of synthetic. On a slower H100 host (2026-12-08, two alternating pairs)
# the two were even: 13 threads 28,933 and 27,598 img/s, 16 threads 28,361 and 27,833. Kept as a
# switch for A/Bs with GPU_NATIVE_IDLE off.
HYBRID_HOST_CORES = 0


def hybrid_native_threads(cores: int) -> int:
    """Native threads "hybrid" runs on ``cores`` when left to pick: HYBRID_HOST_CORES fewer, at least one."""
    return max(1, cores - HYBRID_HOST_CORES)

# Threads of the inline engine (see the module docstring) when another decoder is configured
# (never more than the native threads): it reads and plans every batch of a folder on the
# producer's call, so a few threads keep that short; it idles otherwise. On the H200 box
# (2026-12-02, single runs) hybrid planned a batch in 6.4-7.3 ms with 4 and 5.3 ms with 8,
# and ran 17,864 / 19,505 / 17,448 img/s with 4 / 8 / 16. With the native decoder alone it
# only decodes replacements: the producer thread itself.
INLINE_THREADS_GPU = 8

# The inline engine's OS thread name (the native threads keep the engine's "fastdata-native").
INLINE_THREAD_NAME = "fastdata-inline"

# With a decoder feeding a CUDA device the native threads run under SCHED_IDLE (Engine's ``idle``):
# with every native thread busy (the queued runs keep them so), the threads that feed the GPU
# decoder, and the training loop, must never wait for a core behind them. At nice 10 they still
# did: on the H200 box (8,192 set, 2026-12-03, twelfth session, one call) hybrid's GPU-side threads
# waited for a core 66-69% of their CPU time (run queue, /proc schedstat), under SCHED_IDLE 18%,
# and its GPU side delivered 16,265 rows/s against 13,248 and 12,755. The whole Loader: 22,591
# img/s against 20,765 and 19,653 (one run against two; their steady 2-s windows overlap:
# 21,629-23,814 against 15,784-22,836); with two decode lanes 19,460 and 19,459 against 18,813
# and 18,954. With GPU_NATIVE_IDLE off they run GPU_NATIVE_NICE nice steps lower instead (the rule
# until then); where the kernel refuses SCHED_IDLE, at nice 19 (Engine's ``idle``).
# Keeping the feeding threads to cores of their own and the native threads off them (a division
# of the CPUs, in place of SCHED_IDLE's preemption) ran slower: on two H100 hosts (8,192 set,
# alone, alternating; thirty-third session, 73817d6) 26,798 and 25,098 img/s with three cores
# kept against 31,721 and 31,112 with every thread free (the GPU side starved, the engines 62-67%
# busy against 97%), and 24,114 against 28,704 with five. On the second host the native threads'
# loss per core beside the GPU side was mostly the machine's, not the scheduler's: on its cores
# 0-10 native decode gave 6-8% fewer rows per CPU-second while gpu-only ran on cores 11-15, and
# 9-15% fewer while five busy loops did (docs/results.md).
GPU_NATIVE_NICE = 10
GPU_NATIVE_IDLE = True
# Native alone keeps the creator's priority, also to CUDA. Under SCHED_IDLE there (so that the
# training loop and the producer never wait for a core behind decode threads) it trained slower:
# ResNet-18 as CUDA graphs beside it, the 8,192 set's files, one H100 of a slow host (native decode
# alone ~10,500 img/s; forty-first session, alternating): 11,359 and 11,354 img/s at the creator's
# priority (69.8% of synthetic) against 10,030 and 9,752 under SCHED_IDLE (61.6%, 59.9%). That
# switch is gone (docs/results.md, "forty-first session").


def native_priority(gpu_decoder: bool, cuda: bool) -> Tuple[int, bool]:
    """The native threads' (nice increment, SCHED_IDLE) for a pipeline with or without a GPU
    decoder, its output on CUDA or not: lowered beside a GPU decoder that feeds CUDA
    (GPU_NATIVE_IDLE, else GPU_NATIVE_NICE); left as the creator's otherwise."""
    if gpu_decoder and cuda:
        return (0, True) if GPU_NATIVE_IDLE else (GPU_NATIVE_NICE, False)
    return (0, False)


# A GPU decoder that resamples on the GPU (``writes_output``) writes its rows normalized into the
# batch's output, and the host's rows are placed beside them by one kernel: no float32 batch in
# between, no placing pass, no separate normalize. For a batch of 256 at 224x224 in float16 that
# is 0.08 GB of device memory traffic after the resampler's reads against 0.69 GB (gpu-only) and
# 0.09 GB against 1.17 GB (hybrid, 60% of the rows on the GPU) for resample -> float32 -> place ->
# normalize, counted from the tensors' sizes; on an H100 (2026-12-05) 1.14x less GPU time per
# batch gpu-only, 1.41x at 60% on the GPU (docs/results.md, twentieth session). False: the old
# assembly, for the A/B (benchmarks/bench_gpu_resample.py --assembly times both).
FUSED_OUTPUT = True

# Hybrid reads (and plans) a batch's rows in order only until the GPU's share of it is among
# them; the native threads read the rest themselves, at their own priority and off the producer
# thread. Reading every row for routing cost the inline engine's threads (normal priority, beside
# the GPU side's) 44 us per row of the batch on the H200 box (8,192 set, seventeenth session),
# where gpu-only's cost 20. Measured: read + plan + route of a batch of 256 on the 2-core box,
# 3.20 -> 2.11 ms at a 0.6 share; on an H100 box (2026-12-05, with FUSED_OUTPUT, both on against
# both off) hybrid's rate did not change beyond the spread. False: read every row, for the A/B.
HYBRID_READS_GPU_SHARE = True


@dataclass
class PendingBatch:
    """A submitted batch: its plan, its host slot, the GPU decoders' started work, the rows
    left to the native decoder and their queued run (slot rows 0.. in order; None when none)."""

    batch: PlannedBatch
    slot: Slot
    started: List[Tuple[Decoder, List[int], Any]]
    native_rows: List[int]
    native: Any = None


@dataclass
class DecodedBatch:
    """A batch whose pixels are all decoded: host rows in ``slot`` (slot row i is batch row
    ``host_rows[i]``), device rows in ``parts`` as (rows, pixels) or, ``written``, in the
    batch's output already, failures by row."""

    batch: PlannedBatch
    slot: Slot
    host_rows: List[int]
    parts: List[Tuple[List[int], torch.Tensor]] = field(default_factory=list)
    failures: List[Tuple[int, DecodeError]] = field(default_factory=list)
    written: List[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def in_order(self) -> bool:
        """Every row is on the host, in batch order: the slot is the batch."""
        return not self.parts and not self.written and self.host_rows == list(range(len(self.batch)))

    def host_position(self, row: int) -> int:
        return self.host_rows.index(row)


class BatchPipeline:
    """The stages of a batch for one transform, output device, dtype and backend.

    backend: "native" (libjpeg-turbo threads only); "gpu", "nvjpeg" or "dali" (a GPU decoder
    first, the native decoder for the rows it cannot take; ``backend_options`` go to it);
    "hybrid" (the "gpu" decoder and the native threads share every batch, balanced; without
    the gpu extra it warns once and runs native); or a ``fastdata.decoders.Decoder`` of your
    own in that first place.
    ring_slots, handed_out, pin: the pinned ring (see PinnedRing): ``ring_slots`` with one batch
    in flight; the pipeline adds a slot per further batch it keeps in flight (``depth``). cpu_normalize: on the CPU,
    let the native threads write the normalized output (float32, float16 or bfloat16) when they
    decode every row (the Loader's CPU path); otherwise normalization runs in torch after the
    rows are placed.
    on_stats: receives counter deltas (LoaderStats field names).

    Not thread-safe: one producer thread drives it. On CUDA, work is queued on ``stream``.
    """

    def __init__(self, transform: Transform, *, backend: Union[str, Decoder] = "native",
                 device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 channels_last: bool = True, seed: int = 0, strict: bool = False,
                 max_pixels: int = DEFAULT_MAX_PIXELS, threads: Optional[int] = None, roi: bool = True,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, batch_size: int = 1, ring_slots: int = 2,
                 handed_out: bool = True, pin: bool = False,
                 cpu_normalize: bool = False, backend_options: Optional[Dict[str, Any]] = None,
                 on_stats: Optional[Callable[..., None]] = None):
        native_spec(transform)  # TypeError for a non-transform, before any thread starts
        if seed < 0:
            raise ValueError("seed must be non-negative")
        self.transform = transform
        self.out_hw = transform.output_size
        self.device = torch.device(device)
        self.dtype = dtype  # None: uint8 NHWC out
        self.channels_last = bool(channels_last)
        self.seed = int(seed)
        self.max_pixels = int(max_pixels)
        self.max_file_bytes = int(max_file_bytes)
        self._on_stats = on_stats
        cuda = self.device.type == "cuda"
        default_threads = threads is None
        threads = cores_per_local_rank() if threads is None else threads
        # The GPU decoder first (it checks its device before any native thread starts).
        self.balancer: Optional[SplitBalancer] = None
        hybrid = False
        if isinstance(backend, str):
            asked, backend = backend, resolve_backend(backend, self.device)
            if asked in ("auto", "hybrid") and backend == "native" and backend_options:
                # native (the default, or hybrid without CUDA or the gpu extra) drops what only the GPU decoder takes
                _warn_once(f"{asked} options", f"fastdata: backend={asked!r} decodes on the CPU (native); backend_options "
                                               f"{sorted(backend_options)} are for the GPU decoder and are ignored")
                backend_options = None
            gpu = make_decoder(backend, transform, device=self.device, threads=threads, **(backend_options or {}))
            if backend == "hybrid" and gpu is not None:
                hybrid = True
                if default_threads:
                    threads = hybrid_native_threads(threads)
        else:
            gpu = backend
            check_plugged_decoder(gpu)
        self._closed = False
        nice, idle = native_priority(gpu is not None, cuda)
        self.engine = Engine(threads, nice=nice, idle=idle)
        # Named apart from the decode threads, so per-thread CPU figures tell planning from decoding.
        self.inline_engine = Engine(min(INLINE_THREADS_GPU, threads) if gpu is not None else 1,
                                    thread_name=INLINE_THREAD_NAME)
        self.threads = self.engine.threads
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        cpu_norm = None
        if cpu_normalize and gpu is None and not cuda and dtype is not None:
            cpu_norm = (tuple(mean), tuple(std))
            check_mean_std(*cpu_norm)  # now, not on the producer thread
        self._normalizer = None if dtype is None or cpu_norm is not None else \
            GpuNormalizer(mean, std, dtype, channels_last, self.device)
        self._cpu_norm = cpu_norm
        # The GPU decoder writes its rows into the batch's output (see FUSED_OUTPUT), normalized with
        # the native threads' scale and bias.
        self._fused = FUSED_OUTPUT and gpu is not None and bool(getattr(gpu, "writes_output", False))
        self._scale_bias = None if dtype is None else scale_bias_for(mean, std)
        native = dict(seed=self.seed, strict=strict, max_pixels=self.max_pixels, max_file_bytes=self.max_file_bytes,
                      roi=roi, normalize=cpu_norm)
        self.native = NativeDecoder(self.engine, transform, on_report=self._count_native_report, **native)
        self.inline = NativeDecoder(self.inline_engine, transform, on_report=self._count_report, **native)
        self.decoders: List[Decoder] = ([gpu] if gpu is not None else []) + [self.native]
        self.depth = max(d.depth for d in self.decoders)
        if hybrid:  # a share it sets reaches the collected batches ``depth`` batches later
            self.balancer = SplitBalancer(window=self.depth)
        # A slot is taken when its batch is submitted: ``depth`` batches hold one at once.
        self.ring = PinnedRing(ring_slots + self.depth - 1, batch_size, self.out_hw,
                               image_dtype=torch.uint8 if cpu_norm is None else dtype, pin=pin,
                               handed_out=handed_out)
        self._uploader = CudaUploader(self.device, self.stream) if cuda else None
        # Rows per decoder since the pipeline was made (LoaderStats' names; a Loader gets them per
        # batch through on_stats): gpu_rows delivered by the GPU decoder, native_rows decoded on the
        # host (the rows the GPU was not given and those it handed back, gpu_rejected). read_rows
        # (the pipeline's own, counted at submit): rows read and planned for routing on the
        # producer's call (every row, except hybrid's past the GPU's share: the native threads
        # read those).
        self.stats = {"batches": 0, "gpu_rows": 0, "native_rows": 0, "gpu_rejected": 0, "read_rows": 0}
        self._gpu_accept_rate = 1.0  # hybrid: the share of the rows read that the GPU accepted, last batch
        # Batches submitted and not yet decoded or discarded: each holds a ring slot (taken at
        # submit, written by its queued native run), so there may be at most one per slot.
        self._in_flight = 0

    # ---- stages ----
    def submit(self, items: Sequence[Item], indices: Sequence[int], epoch: int,
               names: Optional[Sequence[Optional[str]]] = None) -> PendingBatch:
        """Plan and route a batch, start its GPU rows and queue its native rows. ``names`` label
        failures (default: the path of path items)."""
        if self._closed:
            raise RuntimeError("the pipeline is closed")
        index_arr = np.ascontiguousarray(indices, dtype=np.int64)
        if index_arr.shape != (len(items),):
            raise ValueError(f"indices must have {len(items)} entries, got shape {index_arr.shape}")
        if epoch < 0:
            raise ValueError("epoch must be non-negative")
        if len(items) > self.ring.shape[0]:
            raise ValueError(f"a batch of {len(items)} does not fit the ring's {self.ring.shape[0]} rows")
        if self._in_flight >= len(self.ring):
            raise RuntimeError(f"{self._in_flight} batches are submitted and not yet collected, as many as the "
                               f"ring's slots: collect (decode) one before submitting another")
        if names is None:
            names = [it if isinstance(it, str) else None for it in items]
        slot = self.ring.acquire()
        if len(self.decoders) == 1:  # the native decoder alone: the engine reads, plans and decodes in one call
            batch, rows = PlannedBatch(items, index_arr, epoch, names), list(range(len(items)))
            pending = PendingBatch(batch, slot, [], rows, self._start_native(batch, rows, slot))
            self._in_flight += 1
            return pending
        t0 = time.perf_counter()
        if self.balancer is not None:
            batch, routes = self._plan_gpu_share(items, index_arr, epoch, names)
        else:
            batch = plan_batch(items, index_arr, epoch, names, self.inline_engine, self.transform, seed=self.seed,
                               max_pixels=self.max_pixels, max_file_bytes=self.max_file_bytes)
            self.stats["read_rows"] += len(batch)
            routes = route(batch, self.decoders)
        if self.balancer is not None:  # hybrid: the GPU keeps its balanced share, in batch order
            keep = self.balancer.gpu_rows(len(batch), len(routes[0]))
            routes[-1] = sorted(routes[-1] + routes[0][keep:])
            routes[0] = routes[0][:keep]
        started = []
        with self._on_stream():
            if self._fused:  # on the stream the GPU decoder's kernels write it on
                batch.output = BatchOutput.allocate(len(batch), self.out_hw, self.dtype, self.channels_last,
                                                    self._scale_bias, self.device)
            for decoder, rows in zip(self.decoders[:-1], routes[:-1]):
                if rows:
                    started.append((decoder, rows, decoder.start(batch, rows)))
        self._count(decode_seconds=time.perf_counter() - t0)
        pending = PendingBatch(batch, slot, started, routes[-1], self._start_native(batch, routes[-1], slot))
        self._in_flight += 1
        return pending

    def _plan_gpu_share(self, items: Sequence[Item], indices: np.ndarray, epoch: int,
                        names: Sequence[Optional[str]]) -> Tuple[PlannedBatch, List[List[int]]]:
        """Hybrid: read and plan rows in batch order only until the GPU's share of the batch is
        among them (HYBRID_READS_GPU_SHARE), and route. The GPU takes the first rows it accepts,
        so a row after its share's last is the native threads' whatever its header says: they
        read it themselves. The first round reads what the last batch's acceptance rate says is
        needed, plus a margin; a second, sized by this batch's rate so far; a third reads the rest
        (each round plans every row read so far: ~1 us per row against ~20 for reading it)."""
        n = len(items)
        # The share; the GPU may accept fewer. ``gpu_rows(n, a)`` uses ``a`` only as a cap, so the
        # rows kept below are those of reading every row.
        want = self.balancer.gpu_rows(n, n)
        datas: List[np.ndarray] = []
        rate = self._gpu_accept_rate
        for round_ in range(3):
            if HYBRID_READS_GPU_SHARE and round_ < 2:
                short = want - (len(routes[0]) if datas else 0)
                upto = min(n, len(datas) + math.ceil(short / max(rate, 1 / 8)) + 2 + n // 64)
            else:
                upto = n
            more, _ = read_items(items[len(datas):upto], self.inline_engine,
                                 self.max_file_bytes)
            datas.extend(more)
            batch = plan_batch(items, indices, epoch, names, self.inline_engine, self.transform, seed=self.seed,
                               max_pixels=self.max_pixels, max_file_bytes=self.max_file_bytes, datas=datas)
            routes = route(batch, self.decoders)
            rate = len(routes[0]) / len(datas) if datas else 1.0
            if len(routes[0]) >= want or len(datas) == n:
                break
        self._gpu_accept_rate = rate
        self.stats["read_rows"] += len(datas)
        return batch, routes

    def _start_native(self, batch: PlannedBatch, rows: List[int], slot: Slot) -> Any:
        """Queue ``rows`` on the native engine into slot rows 0.. (None when there are none)."""
        return self.native.start(batch, rows, slot.native_rows(0, len(rows))) if rows else None

    def decode(self, pending: PendingBatch) -> DecodedBatch:
        """Wait for the batch's native rows, then finish the GPU decoders' rows (in submission
        order) and decode the rows they handed back at once (inline engine)."""
        self._in_flight -= 1
        batch, slot = pending.batch, pending.slot
        native_rows = list(pending.native_rows)
        failures: List[Tuple[int, DecodeError]] = []
        native_seconds = 0.0
        t0 = time.perf_counter()
        if pending.native is not None:
            native, pending.native = pending.native, None
            done = self.native.finish(native)
            failures.extend(done.failures)
            native_seconds = done.seconds or 0.0
        native_wait = time.perf_counter() - t0  # the producer's wait for the native threads
        parts: List[Tuple[List[int], torch.Tensor]] = []
        written: List[int] = []
        handed_back: List[int] = []
        failed_off_host: List[int] = []  # rows another decoder kept and failed: black host rows (below)
        gpu_rows, gpu_seconds = 0, 0.0
        t0 = time.perf_counter()
        with self._on_stream():
            while pending.started:
                decoder, rows, handle = pending.started.pop(0)
                done = decoder.finish(handle, None)
                failures.extend(done.failures)
                rejected = set(done.rejected)
                kept = [r for r in rows if r not in rejected]
                failed = {row for row, _ in done.failures}
                if not failed.issubset(kept):  # a rejected row is decoded natively: its failure would be a second one
                    raise RuntimeError(f"internal: decoder {decoder.name!r} reported failures for rows it did not keep: "
                                       f"{sorted(failed.difference(kept))}")
                ok = [r for r in kept if r not in failed]
                if kept and done.written:
                    if batch.output is None:
                        raise RuntimeError(f"internal: decoder {decoder.name!r} wrote into an output it was not given")
                    written.extend(ok)
                elif kept:
                    if done.pixels is None or len(done.pixels) != len(kept):
                        raise RuntimeError(f"internal: decoder {decoder.name!r} returned no pixels for {len(kept)} rows")
                    # the failed rows' pixels too: their black host rows are placed after (_place)
                    parts.append((kept, done.pixels))
                failed_off_host.extend(r for r in kept if r in failed)
                gpu_rows += len(kept)
                gpu_seconds += done.seconds or 0.0  # a decoder that does not time itself teaches the split nothing
                handed_back.extend(done.rejected)
        gpu_wait = time.perf_counter() - t0  # then for the GPU decoder (finish only waits for its worker)
        if len(self.decoders) > 1:
            self._count(decode_seconds=gpu_wait)
        handed_back.sort()
        if handed_back:
            at = len(native_rows)
            done = self.inline.decode(batch, handed_back, slot.native_rows(at, at + len(handed_back)))
            failures.extend(done.failures)
        if failed_off_host:
            # A failed row is a black host row, whichever decoder failed it: the skip policy
            # decodes its replacement into the slot (replace), and deliver places it like any other.
            at = len(native_rows) + len(handed_back)
            slot.images[at:at + len(failed_off_host)].zero_()
        if self.balancer is not None:  # each side's rows over its own time on them, and which side was waited for
            self.balancer.observe(gpu_rows, gpu_seconds, len(native_rows), native_seconds)
            self.balancer.observe_waits(native_wait, gpu_wait)
        host_rows = native_rows + handed_back + failed_off_host
        rows = {"gpu_rows": gpu_rows, "native_rows": len(native_rows) + len(handed_back),
                "gpu_rejected": len(handed_back)}
        for key, n in rows.items():
            self.stats[key] += n
        self.stats["batches"] += 1
        # failures: the batch's rows, whichever decoder failed them (replace() counts its own)
        self._count(**rows, failures=len(failures))
        failures.sort(key=lambda pair: pair[0])
        return DecodedBatch(batch, slot, host_rows, parts, failures, sorted(written))

    def handed_over(self, rows: int, seconds: Optional[float], waited: bool) -> None:
        """The producer handed a batch of ``rows`` to the consumer ``seconds`` after the one
        before (None: not a measure of the consumer's pace), after waiting for room in its
        queue or not (hybrid: see SplitBalancer)."""
        if self.balancer is not None:
            self.balancer.observe_handover(rows, seconds, waited)

    def pace_reset(self) -> None:
        """The consumer's pace is unknown again (hybrid: the balanced split until measured)."""
        if self.balancer is not None:
            self.balancer.pace_reset()

    def replace(self, decoded: DecodedBatch, row: int, item: Item, index: int, name: Optional[str]) -> bool:
        """Decode sample ``index`` (``item``) natively into failed ``row``'s place; True on success."""
        pos = decoded.host_position(row)
        out = decoded.slot.native_rows(pos, pos + 1)
        report = self.inline.run([item], np.array([index], dtype=np.int64), decoded.batch.epoch, [name], out)
        if report.failures:  # a candidate, not a sample of this batch: kept apart from ``failures``
            self._count(replacement_failures=len(report.failures))
        return not report.failures

    def deliver(self, decoded: DecodedBatch, labels: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor],
                                                                             Any, Any]:
        """The batch as the consumer receives it: (images, labels, done event, start event).

        images: [N, 3, H, W] ``dtype`` (channels_last memory when asked), or uint8 [N, H, W, 3]
        when dtype is None, on the device; labels: the slot's labels (int64 [N], written by the
        caller) on the device when ``labels``. On CUDA they belong to ``stream`` until ``done``.
        """
        n, slot, k = len(decoded), decoded.slot, len(decoded.host_rows)
        host_labels = slot.labels[:n] if labels else None
        if decoded.batch.output is not None:  # the GPU decoder's rows are in it: place the host's beside them
            host = slot.images[:k] if k else None
            if self._uploader is None:  # a GPU decoder's CPU stand-in (Triton's interpreter)
                return self._assemble(decoded, host), host_labels, None, None
            images, gpu_labels, start, done = self._uploader.upload(host, host_labels,
                                                                   lambda dev: self._assemble(decoded, dev))
            slot.reader = done
            return images, gpu_labels, done, start
        if self._uploader is None:
            if decoded.in_order:
                images = slot.images[:n]
                if self._cpu_norm is not None:  # normalized by the native threads, in the output's dtype
                    images = images.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
                    if not self.channels_last:
                        images = images.contiguous()
                    return images, host_labels, None, None
                return self._finish(images), host_labels, None, None
            return self._finish(self._place(decoded, slot.images[:k])), host_labels, None, None
        host = slot.images[:k] if k else None
        place = (lambda dev: dev) if decoded.in_order else (lambda dev: self._place(decoded, dev))
        images, gpu_labels, start, done = self._uploader.upload(host, host_labels, lambda dev: self._finish(place(dev)))
        slot.reader = done  # the ring rewrites this slot only after the copy
        return images, gpu_labels, done, start

    def discard(self, pending: PendingBatch) -> None:
        """Drop a submitted batch nobody will collect (an epoch left early), keeping the GPU
        decoders' queues in step; its native run is waited for (it writes into the slot). Never raises."""
        self._in_flight -= 1
        with self._on_stream():
            while pending.started:
                decoder, _, handle = pending.started.pop(0)
                decoder.discard(handle)
        if pending.native is not None:
            native, pending.native = pending.native, None
            self.native.discard(native)

    # ---- one batch outside a Loader ----
    def run(self, items: Sequence[Item], indices: Sequence[int],
            epoch: int) -> Tuple[torch.Tensor, List[DecodeError], List[int]]:
        """One batch through every stage: (images as ``deliver`` gives them, failures, failed
        rows). Failed rows hold black (zero pixels, normalized like the others)."""
        return self.collect(self.submit(items, indices, epoch))

    def collect(self, pending: PendingBatch) -> Tuple[torch.Tensor, List[DecodeError], List[int]]:
        """A submitted batch, finished as ``run`` returns it (batches in submission order)."""
        decoded = self.decode(pending)
        images, _, _, _ = self.deliver(decoded)
        return images, [err for _, err in decoded.failures], [row for row, _ in decoded.failures]

    def close(self) -> None:
        """Stop the decoders and join the native threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for decoder in self.decoders:
            decoder.close()
        self.ring.close()
        self.engine.close()  # after every queued run (the native side drains its queue)
        self.inline_engine.close()

    def __enter__(self) -> "BatchPipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- helpers ----
    @property
    def _memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def _on_stream(self) -> ContextManager:
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def _place(self, decoded: DecodedBatch, host: Optional[torch.Tensor]) -> torch.Tensor:
        """[N, H, W, 3] on the output device: host rows and each GPU decoder's rows in their
        places; rows nobody wrote (failures) hold black. uint8, or float32 when a decoder
        delivered float pixels (values 0..255)."""
        n = len(decoded)
        h, w = self.out_hw
        parts = list(decoded.parts)
        if host is not None and len(decoded.host_rows):
            parts.append((decoded.host_rows, host))
        if len(parts) == 1 and parts[0][0] == list(range(n)):
            return parts[0][1]
        dtype = torch.float32 if any(p.dtype != torch.uint8 for _, p in parts) else torch.uint8
        out = torch.zeros((n, h, w, 3), dtype=dtype, device=self.device)
        for rows, pixels in parts:
            out[to_device(torch.tensor(rows), self.device)] = pixels.to(device=self.device, dtype=dtype)
        return out

    def _assemble(self, decoded: DecodedBatch, host: Optional[torch.Tensor]) -> torch.Tensor:
        """The batch's output with the host's rows (uint8 [k, H, W, 3] on the output device)
        written into it beside the GPU decoder's (DecodedRows.written; the rows it failed are
        host rows, black or replaced, and placed over whatever it wrote there)."""
        if len(decoded.host_rows) + len(decoded.written) != len(decoded):
            raise RuntimeError(f"internal: {len(decoded.host_rows)} host rows and {len(decoded.written)} written by "
                               f"the GPU decoder in a batch of {len(decoded)}")
        output = decoded.batch.output
        if host is not None:
            place_rows(host, output, decoded.host_rows)
        return output.tensor

    def _finish(self, nhwc: torch.Tensor) -> torch.Tensor:
        """Pixels [N, H, W, 3] (uint8, or float32 0..255) -> the output dtype and layout."""
        if self.dtype is None:
            return nhwc if nhwc.dtype == torch.uint8 else nhwc.round().clamp_(0, 255).to(torch.uint8)
        return self._normalizer(nhwc)

    def _count_report(self, report: BatchReport) -> None:
        self._count(read_seconds=report.read_seconds, decode_seconds=report.decode_seconds,
                    warnings=report.warnings, fallbacks=report.fallbacks)

    def _count_native_report(self, report: BatchReport) -> None:
        """A queued run of the native threads: also how long it ran and how busy they were in it
        (LoaderStats.native_occupancy, native_busy_in_runs: where those threads idle)."""
        self._count_report(report)
        self._count(native_run_seconds=report.wall_seconds,
                    native_busy_seconds=report.read_seconds + report.decode_seconds)

    def _count(self, **deltas: float) -> None:
        if self._on_stats is not None:
            self._on_stats(**deltas)


_warned: set = set()  # the keys of the warnings given (each once per process)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend a name means on ``device``.

    "auto" (the Loader's default): "native", on every device. Beside a training step that keeps
    the GPU busy, the GPU decoder's rows relieve the CPU but slow the step, and native came out
    ahead or even: ResNet-18 as CUDA graphs on H100s, reading fastdata-convert's LMDB, trained
    faster with native alone than with hybrid in each of the four calls that ran both
    (docs/results.md, thirty-eighth and thirty-ninth sessions; by 0.7 to 21 points of
    synthetic-data speed); from the files the two were even (fortieth session: native ahead by
    3.5 points in one call, hybrid by 6 in the next, where the host's CPU ran slower and native
    alone was input-bound; forty-fifth session, another host: native 90.9% and 78.5%, hybrid
    87.0% and 85.7%). The engines' calls beside a replayed graph of that step ran ~20x
    slower than alone, their thread's CPU busy the whole call, from pinned bytes too (no faster,
    somewhat slower). "hybrid" and "gpu" are for a GPU with room to spare, such as a loader
    measured alone or preprocessing (alone on the 8,192 set hybrid ran 1.7x native, H100,
    thirty-second session), and worth a try where the CPU side cannot keep up from files;
    beside a model that leaves the GPU idle they may help (not measured).
    "hybrid" without the gpu extra (nvImageCodec) says so once (a warning) and runs native.
    Other names are returned as given."""
    if backend == "auto":
        return "native"
    if backend != "hybrid":
        return backend
    from ..decoders.nvimgcodec import gpu_extra_installed
    if device.type != "cuda":
        raise ValueError("backend='hybrid' splits batches between the CPU and the GPU: it needs device='cuda'")
    if not gpu_extra_installed():
        _warn_once("gpu extra", "fastdata: the hybrid CPU+GPU decoder needs the gpu extra (pip install fastdata[gpu]: "
                                "nvidia-nvimgcodec-cu13, nvidia-nvjpeg); decoding on the CPU only")
        return "native"
    return "hybrid"


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


def make_backend(name: Union[str, Decoder], transform: Transform, *, device: Union[str, torch.device] = "cuda",
                 dtype: Union[torch.dtype, str, None] = torch.float16, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, channels_last: bool = True, seed: int = 0,
                 strict: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS, threads: Optional[int] = None,
                 max_batch: int = 256, **options: Any) -> BatchPipeline:
    """A pipeline for backend ``name`` outside a Loader (benchmarks and tests): call ``run``.

    Batches of up to ``max_batch`` rows; ``options`` go to the decoder (DALI: hw_decoder_load,
    batch_size, prefetch). Raises ValueError for an unknown name or nvjpeg without CUDA,
    ImportError with the install command when DALI is missing.
    """
    device = torch.device(device)
    return BatchPipeline(transform, backend=name, device=device, dtype=resolve_dtype(dtype), mean=mean, std=std,
                         channels_last=channels_last, seed=seed, strict=strict, max_pixels=max_pixels,
                         threads=threads, batch_size=max_batch, ring_slots=2, handed_out=device.type != "cuda",
                         pin=device.type == "cuda", backend_options=options)
