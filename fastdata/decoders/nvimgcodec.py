"""GPU decoder "gpu": NVIDIA nvImageCodec on the GPU's hardware JPEG engines, then one batched resample.

Per batch, on this decoder's own worker threads (so the native threads decode their share of
the same batch meanwhile): stage 1 decodes the rows into one device buffer, laid out from the
native plan's sizes (stored orientation, HWC uint8 RGB, each image at a 256-byte aligned
offset), through several nvImageCodec decoder objects (all on the process's one nvImageCodec
instance, ``SHARED_INSTANCE``), each on its own thread and CUDA stream with a share of the batch;
on the engines each chroma subsampling has decoder objects of its own, so each makes one call per
batch and always of one subsampling (``engine_calls``). With
several lanes (``DECODE_LANES``) batches go to them in turn, each lane with decoder objects of its own,
so several batches are on the engines at once; stage 2 keeps the rows decoded and runs
``resample_batch`` (the Triton kernels: crop + antialiased resize + flip, EXIF orientation
folded into the gather) over that buffer. The stages overlap across batches. Crops come
from the native engine's plan, so they equal the native path's for the same (seed, epoch,
index).

The decode call is fastdata's own (``_C.NvImageCodecBatch``, csrc/gpu/nvimgcodec_batch.cpp:
nvImageCodec's C API, loaded from the wheel at run time): code streams, images, decode and
wait for a whole call's rows with the GIL released once. Through nvImageCodec's Python API the
decoder made a code stream object and read an array interface per image, and the API's
``decode`` takes the GIL back for every image it returns (read in its v0.8 source); per batch
of 256, hundreds of GIL hand-overs beside the training thread. On the H200, gpu-only training
ran 57-60% of synthetic through that API and 71-75% through this call (docs/results.md).

Which rows: 8-bit Huffman JPEGs with 1 or 3 components that end with EOI (routing.py's
``gpu_decodable``), gray, 4:2:0, 4:2:2 or 4:4:4 (``ENGINE_SUBSAMPLINGS``: 4:4:0 and 4:1:1 go
native; a gray file reaches the engines with 1x1 sampling factors, see ``engine_bytes``), and not progressive:
the hardware engines decode baseline scans only, and a progressive file on them comes back
refused after the batch (a serial native re-decode), so it is routed to the native threads up front. Rows
the engines still refuse, whose header nvImageCodec cannot read, or whose size differs from
the plan's are handed back to the native decoder (``DecodedRows.rejected``), counted in
``Loader.stats().gpu_rejected``.

Why the hardware backend alone: nvImageCodec's CUDA (``GPU_ONLY``) and hybrid backends burn
CPU cores on Huffman decoding (12-13 cores for 7,600-10,700 img/s on the H200 box, #14), and
the native engine spends those cores better; the engines decode with ~1.3 cores.
"""
from __future__ import annotations

import importlib.util
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _C
from ..io.host import THREAD_CPU_SPLIT, calling_thread_cpu
from ..io.transforms import RandomResizedCrop, Transform
from .base import DecodedRows, PlannedBatch, stored_sizes
from .buffer_pool import BufferPool
from .gpu_resize import ImageLayout, resample_batch
from .routing import gpu_decodable

GPU_MISSING = ("backend='gpu' needs NVIDIA nvImageCodec: pip install fastdata[gpu] "
               "(nvidia-nvimgcodec-cu13 and nvidia-nvjpeg)")


# nvImageCodec backend kinds the gpu decoder uses: the hardware engines alone (see above).
ENGINE_KINDS = ("HW_GPU_ONLY",)
# Chroma subsamplings the engines are given, each on DECODE_THREADS decoder instances of its own
# (instances_by_code). On the H200 (nvImageCodec 0.9, decode only, two instances per call layout,
# batch 256; docs/results.md, eighth to tenth sessions), calls of one subsampling each ran
# 17,578-17,955 (4:2:0), 15,606-16,896 (4:2:2) and 12,028-12,455 img/s (4:4:4) at 117-174 us of
# CPU per image, but calls mixing the three at random 6,675-7,417 img/s at 341-378 us, and one
# call per subsampling on instances shared by the three 6,853-8,384 (each instance's small
# 4:2:2/4:4:4 calls waited one after another). With instances of their own the mix decoded at
# 15,487 img/s (173 us). Hybrid on the demo mix ran 8,574 and 8,709 img/s with the three on
# shared instances against 7,484 and 7,903 with 4:2:0 alone (alternating runs, one call), and
# 9,473 with instances of their own against 8,773 shared (one pair, another call). The cost: six
# instances to create instead of two (hybrid's first batch came 8.5 s after its start against
# 4.5 s, one run each).
# Gray files joined them on 2026-12-04: the demo mix is 5% gray, and the native threads, which
# decode every row the engines do not take, are hybrid's bound there (docs/results.md).
ENGINE_SUBSAMPLINGS = ("4:2:0", "4:2:2", "4:4:4", "gray")
ENGINE_SUBSAMPLING_CODES = [_C.SUBSAMPLING_NAMES.index(name) for name in ENGINE_SUBSAMPLINGS]
GRAY_CODE = _C.SUBSAMPLING_NAMES.index("gray")  # the gray files' calls, whose bytes engine_bytes rewrites
# Largest image (pixels) the engines are given: 16 MP, 48 MB decoded; ImageNet-like photos are
# ~0.2 MP. Larger ones are decoded (and cropped before they are expanded) by the native threads.
MAX_GPU_PIXELS = 4096 * 4096
# The gpu decoder's layout defaults, the same for backend="gpu" and "hybrid" (each was measured
# for both; the backends used to keep separate values, and since the thirteenth session they agree).
# nvImageCodec decoder instances per lane and chroma subsampling, each called from its own
# thread with a slice of the batch (NvImageCodecDecoder's decode_threads). Measured on
# the H200 box (docs/results.md): decode only, two instances ran 24,045 img/s against one's 17,181
# (three: 21,026). Through fastdata's own call (no GIL per image) hybrid ran 18,639 img/s with two
# against 16,301 with one (2026-12-02, fourth session); since two lanes (below) each lane has one.
DECODE_THREADS = 1
# Batches decoded at once per gpu decoder, each on instances of its own (its "lane": a decode
# thread and DECODE_THREADS instances per subsampling). One lane splits every batch
# over its instances and starts batch n + 1 only when every instance is done with batch n; an
# nvImageCodec call returns once its work is queued, and the instance's next call waits for that
# work to finish on the GPU (read in nvImageCodec 0.8's source), so two lanes of one instance keep
# two whole batches on the engines. H200, 8,192 set, one call (2026-12-03, twelfth session):
# gpu-only ran 24,734 img/s with two lanes of one instance against 21,013 with one lane of two
# (the engines busy 98% against 85%, 3.5 and 3.3 cores). Hybrid with two lanes first lost (18,813
# and 18,954 against 20,765 and 19,653) while the split counted a two-lane batch's wall divided by
# two, which gave the GPU 77-82% of each batch; with each batch charged its share of the overlap
# (SharedWallClock) and a third batch in flight together (not separated) it won (2026-12-03,
# thirteenth session, alternating runs of 8 s in one call): 24,305 and 24,667 img/s against 21,935
# and 23,682 with one lane of two instances (the engines busy 83-84% against 71-74%, the GPU side
# 18,179-18,301 rows/s against 16,034-17,027, the same 12 cores); on the demo mix 8,837 against
# 8,709 (one pair), and examples/train.py resnet18 11,678 against 11,396 img/s (one run each, in
# different calls). backend="hybrid" has more lanes of its own: HYBRID_DECODE_LANES.
DECODE_LANES = 2
# Batches in flight per gpu decoder (its ``depth``): the worker decodes batch N+1 while the
# producer finishes batch N (its native rows, the upload), so the engines do not idle while the
# next batch is planned. gpu-only: a third batch ran 20,317-20,382 img/s against two's
# 17,317-17,565 (H200, 8,192 set, two alternating pairs of runs in one call, 2026-12-03), at the
# same CPU time per image (177 vs 181 us). Hybrid: with one
# lane a third batch cost a core for no rate (21,440 vs 21,529 img/s, 2026-12-02, one run each);
# with two lanes it keeps a batch for each lane while one is resampled (the layout measured above).
DEPTH = 3
# backend="hybrid"'s lanes and batches in flight (make_decoder passes them): the layout it runs
# beside training at. ResNet-18 training as CUDA graphs on the 8,192 set (H100, 2026-12-06,
# twenty-sixth session, alternating runs in three calls; synthetic 16,051-16,095 img/s): hybrid
# with four lanes and five batches ran 15,060, 15,327, 15,174, 14,807 and 15,427 img/s (94.3% of
# synthetic on the mean), with two lanes and three 14,394, 14,290 and 14,220 (89.0%), with eight
# and nine 15,378 and 15,147, with two lanes and five batches 14,036. The GPU side took fewer
# rows, not more (17-22% of each batch against 26-32%); the native threads were busier: 96-100%
# of the time against 77-82%. Our reading: a GPU batch, slow beside the model's kernels, no
# longer holds the next batches' native rows back. The costs: alone in fastdata-bench (no
# training) 31,693 and 30,208 img/s against 32,929 and 31,786 with two lanes (alternating, the
# same call), the engines busy 74% against 81%; and, before SHARED_INSTANCE, eight more
# nvImageCodec instances to create, 1.03 s each: making hybrid's decoder took 16.5 s on four lanes
# (16 instances; H100, 2026-12-06, twenty-seventh session; on one shared instance 1.0 s). Those
# runs' processes took ~54 s against ~38 s because examples/train.py also made an unused
# validation Loader under --no-eval (since fixed): two decoders each.
# backend="gpu" keeps two: beside the same training it ran 9,769 img/s on four lanes (5.4 cores)
# against 10,129 and 10,142 on two (3.4), each lane's batch taking twice as long.
# Each lane's thread is busy for most of its call (72-90% of the call's wall), so the calls' CPU
# per row grows with the calls in flight at once. Alone on another H100 host (2026-12-08,
# forty-fifth session, alternating, 20 s each): gpu-only 24,323 img/s at 73 us of call CPU per row
# on two lanes against 20,627 at 179 us on four; hybrid 28,697 img/s on four lanes (108 us; the
# call's first run left out), 27,252-28,134 on three (83-85 us), 26,790-27,129 on two (69-70 us;
# the engines 88-90% busy against 94%): the CPU the fewer lanes saved did not become native rows.
HYBRID_DECODE_LANES = 4
HYBRID_DEPTH = 5


def gpu_extra_installed() -> bool:
    """Whether nvImageCodec is installed, without importing it (its import loads the CUDA
    codec libraries and prints errors for those missing, e.g. on a machine without a GPU)."""
    return _nvimgcodec_folder() is not None


def _nvimgcodec_folder() -> Optional[str]:
    """The ``nvidia.nvimgcodec`` package's folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except ImportError:  # no "nvidia" package at all
        return None
    return spec.submodule_search_locations[0] if spec is not None and spec.submodule_search_locations else None


def nvimgcodec_module() -> Any:
    """``nvidia.nvimgcodec``, or None when the ``gpu`` extra is not installed. Its import makes an
    nvImageCodec instance of its own with every codec extension loaded (its PYBIND11_MODULE
    holds a static one), so only what decodes through that Python API imports it
    (``fastdata-doctor``'s engine check, the bench's ``engines`` row); the gpu decoder finds the
    library with ``nvimgcodec_library``."""
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return None
    return nvimgcodec


def nvimgcodec_library() -> Optional[str]:
    """Path of the wheel's libnvimgcodec (its codec extensions in ``extensions/`` beside it), or
    None when the ``gpu`` extra is not installed; found without importing ``nvidia.nvimgcodec``
    (see nvimgcodec_module). The extensions find the CUDA and nvJPEG libraries of the other
    wheels through their own RUNPATH, not through anything that import does."""
    folder = _nvimgcodec_folder()
    if folder is None:
        return None
    path = os.path.abspath(os.path.join(folder, "libnvimgcodec.so.0"))
    if not os.path.exists(path):
        raise ImportError(f"nvImageCodec's library is not where its wheel puts it: {path}")
    return path


# Make every gpu decoder of the process on one nvImageCodec instance (per library) while any of
# them lives, rather than one instance per decoder object. An instance loads nvImageCodec's codec
# extensions, 1.03 s each on an H100, one at a time even from threads: hybrid's 16 decoder objects
# (4 lanes x 4 subsamplings) took 16.6 s to make on 16 instances and 1.0 s on one (2026-12-06,
# twenty-eighth session; nvImageCodec's Python API also makes all its decoders on one instance).
# Their decodes, called from 16 threads at once, ran as fast (alone in the bench, alternating:
# gpu 24,514 / 23,446 img/s shared against 24,443 / 23,525 apart, hybrid 24,835 / 23,224 against
# 24,674 / 23,705; beside ResNet-18 training as CUDA graphs 83.4% / 84.9% of synthetic against
# 83.3% / 82.3%) and the mixed set and tests/gpu gave the same results. False: the A/B's other side
# (benchmarks/gpu_suite.sh shared).
SHARED_INSTANCE = True
_instances: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
_instances_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _instances, _instances_lock
    # A parent thread may have held the lock at fork time, and the parent's instance is not the
    # child's to share (its worker threads did not come along).
    _instances, _instances_lock = weakref.WeakValueDictionary(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def nvimgcodec_instances(library: str, count: int) -> Tuple[List[Any], List[Any]]:
    """The ``_C.NvImageCodecInstance`` of ``library`` each of ``count`` decoder objects is made on,
    and those of them made now: the one the process's live decoders share (SHARED_INSTANCE), else
    a new one each."""
    if not SHARED_INSTANCE:
        made = [_C.NvImageCodecInstance(library) for _ in range(count)]
        return made, made
    with _instances_lock:  # two Loaders made at once must not make two instances
        instance, made = _instances.get(library), []
        if instance is None:
            instance = _instances[library] = _C.NvImageCodecInstance(library)
            made = [instance]
    return [instance] * count, made


# nvimgcodecBackendKind_t values, by the names nvImageCodec's Python API gives them.
BACKEND_KINDS = {"CPU_ONLY": 1, "GPU_ONLY": 2, "HYBRID_CPU_GPU": 3, "HW_GPU_ONLY": 4}
# Each decoded image starts at a multiple of this many bytes in the batch's buffer (what
# cudaMalloc gives each image when nvImageCodec allocates them itself).
IMAGE_ALIGN = 256
# A new image buffer is this much larger than the batch that asked for it, rounded up to
# BUFFER_ROUNDING bytes, so that later batches of about the same size fit into it.
BUFFER_HEADROOM = 1.25
BUFFER_ROUNDING = 2 * 2**20
# The spare buffers of one decoder hold at most this many bytes together (three batches of
# 256 photo-like 500x375 images, 144 MB each, fit with room to spare).
BUFFER_POOL_BYTES = 1024 * 2**20
# _C.NvImageCodecBatch.decode's per-row statuses; NOT_CALLED: none given (the row was in no call).
DECODED = 0
NOT_CALLED = 255


class NvImageCodecDecoder:
    """Batched JPEG decode on the hardware engines (nvImageCodec), crop/resize/flip batched on the GPU.

    ``start`` queues the batch on the worker threads and returns at once; ``finish`` waits for
    it and returns float32 [k, H, W, 3] pixels (values 0..255) on ``device``, or, when the
    batch carries an output (``PlannedBatch.output``), has written them into it, complete (the
    worker waited for its kernels), plus the rows handed back, and ``seconds``: its slowest
    stage's wall time for the batch (the hybrid split's GPU rate).

    cpu_threads: nvImageCodec's host threads (parsing, engine submission), per decoder object.
    decode_threads: nvImageCodec decoder objects per chroma subsampling the engines take
    (instances_by_code), each called from a thread of its own on its own CUDA stream
    with a share of that subsampling's rows: the call is host-bound (its calling thread is
    busy 83-99% of the call), so one caller caps the engines at one thread's rate. Default:
    DECODE_THREADS.
    depth: batches in flight (default: DEPTH).
    lanes: batches decoded at once, each on ``decode_threads`` decoder objects per subsampling of its
    own and a decode thread of its own, taken in turn (so at most ``depth`` are busy). Default:
    DECODE_LANES (make_decoder gives backend="hybrid" HYBRID_DECODE_LANES and HYBRID_DEPTH).
    backend_kinds: nvImageCodec backend kinds to allow, by name (default: the hardware
    engines only). The tests pass ``("CPU_ONLY",)`` to run the decoder's assembly on a
    machine without a GPU (``_allow_cpu``): host memory instead of the device's.
    """

    name = "gpu"
    writes_output = True  # into PlannedBatch.output (base.BatchOutput), when given
    _allow_cpu = False

    def __init__(self, transform: Transform, *, device: torch.device, cpu_threads: int = 4,
                 decode_threads: Optional[int] = None, depth: Optional[int] = None,
                 lanes: Optional[int] = None, backend_kinds: Tuple[str, ...] = ENGINE_KINDS) -> None:
        library = nvimgcodec_library()
        if library is None:
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
        # The module's defaults are read here, at construction, so that a benchmark can set them first.
        self.depth = _at_least_one("depth", DEPTH if depth is None else depth)
        decode_threads = _at_least_one("decode_threads", DECODE_THREADS if decode_threads is None else decode_threads)
        lanes = _at_least_one("lanes", DECODE_LANES if lanes is None else lanes)
        unknown = [kind for kind in backend_kinds if kind not in BACKEND_KINDS]
        if unknown or not backend_kinds:
            raise ValueError(f"unknown nvImageCodec backend kinds {unknown or list(backend_kinds)}; "
                             f"known: {sorted(BACKEND_KINDS)}")
        self.transform = transform
        self.out_hw = transform.output_size
        self.device = device
        self.hardware_only = tuple(backend_kinds) == ENGINE_KINDS
        device_id = device.index if device.type == "cuda" else None  # None: host buffers
        # decode_threads instances per subsampling the engines take (engine_calls); the CPU
        # stand-in takes every subsampling, the ones the engines do not on the first instances.
        # What accepts() routes to the engines is fixed here with the instances that decode it.
        self._engine_codes = list(ENGINE_SUBSAMPLING_CODES)
        self._instances_by_code = instances_by_code(self._engine_codes, decode_threads)
        if not self.hardware_only:
            for code in range(len(_C.SUBSAMPLING_NAMES)):
                self._instances_by_code.setdefault(code, list(range(decode_threads)))
        per_lane = max(decode_threads, instance_count(self._instances_by_code))
        # Lane l decodes with instances l * per_lane .. (l + 1) * per_lane - 1, the first of them
        # called by the lane's decode thread itself (its lead: the batch buffer is its stream's).
        self._lane_instances = [{code: [l * per_lane + k for k in ks] for code, ks in self._instances_by_code.items()}
                                for l in range(lanes)]
        self._lane_leads = [l * per_lane for l in range(lanes)]
        self._next_lane = 0
        self._lane_clock = SharedWallClock()
        instances = lanes * per_lane
        started = time.perf_counter()
        try:
            # Held here, one per decoder object, so that the process's shared instance stays
            # findable (nvimgcodec_instances) while this decoder lives.
            self._instances, made = nvimgcodec_instances(library, instances)
            # "" keeps nvImageCodec's own defaults (fancy upsampling on, as the native engine's
            # libjpeg): the same pixels as its Python API's decode gave.
            self._decoders = [_C.NvImageCodecBatch(instance, device_id, int(cpu_threads),
                                                   [BACKEND_KINDS[k] for k in backend_kinds], "")
                              for instance in self._instances]
        except (RuntimeError, ValueError) as e:
            raise RuntimeError(f"backend='gpu': nvImageCodec could not create a decoder for {list(backend_kinds)} "
                               f"on {device}: {e}") from e
        # What making its nvImageCodec objects cost (seconds; not the rest of this constructor):
        # ``instance_create`` (nvimgcodecInstanceCreate, which loads the codec extensions; 1.03 s
        # each on an H100, 2026-12-06) for the instances made now, and ``decoder_create``, summed
        # over the decoder objects.
        self.creation_seconds = {"wall": time.perf_counter() - started,
                                 "instance_create": sum(i.create_seconds for i in made),
                                 "decoder_create": sum(d.create_seconds for d in self._decoders)}
        self._decode_workers = [ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-decode") for _ in range(lanes)]
        # The other instances' callers: each lane's decode stage calls its lead instance itself.
        self._decode_helpers = (ThreadPoolExecutor(instances - lanes, thread_name_prefix="fastdata-gpu-decode")
                                if instances > lanes else None)
        self._resample_worker = ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-resample")
        # At the default priority: this decoder's and the pipeline's streams at a high one ran no
        # faster beside ResNet-18 training as CUDA graphs (hybrid 13,081 against 13,069 img/s, two
        # alternating pairs, H100, 2026-12-05). The engines' copies and color conversion ran on
        # ~30 other streams, and on 28 with nvJPEG's hardware decode called directly on these
        # (docs/results.md, twenty-third and twenty-fifth sessions): most likely nvJPEG's own,
        # which no priority of these reaches.
        self._decode_streams = ([torch.cuda.Stream(device) for _ in range(instances)]
                                if device.type == "cuda" else [None] * instances)
        self._closed = False
        self._lock = threading.Lock()
        # Finished batches' image buffers (_take_buffer), for later ones
        self._images = BufferPool(self.depth + 1, BUFFER_POOL_BYTES, BUFFER_HEADROOM, BUFFER_ROUNDING)
        # Where the workers' time goes, summed over batches (and lanes; seconds of wall time): the
        # nvImageCodec calls (wall time of the stage, and decode_cpu: the CPU time of every
        # calling thread, summed over the instances: near the number of instances called x the wall time means
        # the calls work or spin on the host, near zero that they sleep while the engines
        # decode; decode_sys, where the OS splits a thread's CPU time: the part of it in the
        # kernel, which tells waiting through system calls (ioctls to the driver, sched_yield)
        # from a spin in user space, CUDA's or nvJPEG's own), queueing the resample, and waiting
        # for the stream (the GPU work left).
        self.stage_seconds = {"decode": 0.0, "decode_cpu": 0.0, "resample": 0.0, "gpu_wait": 0.0}
        if THREAD_CPU_SPLIT:
            self.stage_seconds["decode_sys"] = 0.0

    @property
    def decoder_total(self) -> int:
        """Its nvImageCodec decoder objects (lanes x decoders per lane), each called by one thread."""
        return len(self._decoders)

    @property
    def instance_total(self) -> int:
        """The nvImageCodec instances its decoder objects are made on (1 with SHARED_INSTANCE)."""
        return len({id(instance) for instance in self._instances})

    @property
    def lanes(self) -> int:
        """Batches decoded at once, each on instances of its own."""
        return len(self._decode_workers)

    # ---- the Decoder protocol ----
    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        ok = gpu_decodable(batch)  # 1 or 3 components (gray ones are given 1x1 sampling: engine_bytes)
        if not ok.any():  # also a batch without a plan, whose header facts are not there
            return ok
        plan = batch.plan
        # Very large images go native: the decoded images of the batches in flight live, whole
        # (not cropped), on the training GPU.
        sizes = np.asarray(plan.sizes, np.int64)
        ok &= sizes[:, 0] * sizes[:, 1] <= MAX_GPU_PIXELS
        if self.hardware_only:
            ok &= ~np.asarray(plan.progressive, dtype=bool)
            ok &= np.isin(plan.subsamplings, self._engine_codes)
        return ok

    def start(self, batch: PlannedBatch, rows: List[int]) -> "Future[DecodedRows]":
        with self._lock:
            if self._closed:
                raise RuntimeError("the gpu decoder is closed")
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            lane, self._next_lane = self._next_lane, (self._next_lane + 1) % self.lanes
            decoded = self._decode_workers[lane].submit(self._decode_stage, batch, list(rows), lane)
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
        for worker in (*self._decode_workers, self._decode_helpers, self._resample_worker):
            if worker is not None:
                worker.shutdown(wait=True)  # in stage order: each later stage's queue is complete
        self._decoders = []
        self._instances = []
        self._images.clear()  # their memory goes back to torch now, not when this object does

    # ---- the two stages ----
    # Each stage has its own thread, so the ``depth`` batches in flight overlap: while batch N
    # is resampled (stage 2, the pipeline's stream, after an event from stage 1), batch N+1 is
    # decoded on the engines (stage 1, the instances' own streams).
    def _decode_stage(self, batch: PlannedBatch, rows: List[int], lane: int) -> _Decoded:
        """Stage 1: the rows' images into one buffer, each of the lane's decoder instances with a
        share of the rows (``engine_calls``); this thread calls the lane's lead instance while the
        helpers call the others."""
        t0 = time.perf_counter()
        token = object()  # this stage's job on the lanes' clock, from its start to its end
        self._lane_clock.start(token, t0)
        calls, results, error = [], [], None
        try:
            layout = ImageLayout.packed(np.stack(stored_sizes(batch.plan, rows), axis=1), chw=False, align=IMAGE_ALIGN)
            decoded = _Decoded(rows, layout, lead=self._lane_leads[lane])
            if rows:
                decoded.buffer = self._take_buffer(decoded.nbytes, decoded.lead)
                if self.device.type == "cuda" and len(self._decode_streams) > 1:
                    # The buffer belongs to the lead's stream (torch's allocator): the other instances'
                    # streams write it only after that stream's work so far (a block it reused, say).
                    decoded.allocated = torch.cuda.Event()
                    decoded.allocated.record(self._decode_streams[decoded.lead])
            try:
                work = engine_calls(np.asarray(batch.plan.subsamplings)[rows], self._lane_instances[lane])
                for k in range(len(work)):
                    if work[k] and k != decoded.lead:
                        calls.append(self._decode_helpers.submit(self._decode_share, k, batch, decoded, work[k]))
                if work[decoded.lead]:
                    results.append(self._decode_share(decoded.lead, batch, decoded, work[decoded.lead]))
            except Exception as e:
                error = e
            # Every helper call made is waited for, also after a failure: they write the buffer,
            # and the lane's next batch must not call an instance one of them still uses.
            for call in calls:
                try:
                    results.append(call.result())
                except Exception as e:
                    error = error or e
        finally:  # also when the stage failed: a job left on the clock would be charged forever
            seconds = time.perf_counter() - t0
            charged = self._lane_clock.stop(token, t0 + seconds)
        decoded.seconds, decoded.charged = seconds, charged
        if error is not None:
            # Slices that did queue work may still be writing the buffer: wait for every decode
            # stream before it goes back to torch (else a later batch could get that memory
            # while those writes land).
            for stream in self._decode_streams:
                if stream is not None:
                    stream.synchronize()
            raise error
        # Every row is in exactly one call (engine_calls); one that were not would keep NOT_CALLED
        # and go back to the native threads, never be resampled from an unwritten buffer.
        decoded.status = np.full(len(rows), NOT_CALLED, np.uint8)
        for part in results:
            decoded.status[part.positions] = part.status
        decoded.ready = [part.ready for part in results if part.ready is not None]
        with self._lock:  # the lanes add up at once
            self.stage_seconds["decode"] += decoded.seconds
            self.stage_seconds["decode_cpu"] += sum(part.cpu_seconds for part in results)
            if "decode_sys" in self.stage_seconds:
                self.stage_seconds["decode_sys"] += sum(part.sys_seconds for part in results)
        return decoded

    def _decode_share(self, k: int, batch: PlannedBatch, decoded: _Decoded, calls: List[np.ndarray]) -> _Share:
        """Decoder instance ``k`` makes ``calls`` (positions in the stage's rows, one array per
        call), one after another, on its own stream."""
        cpu0, sys0 = calling_thread_cpu()
        layout = decoded.layout
        stream = self._decode_streams[k]

        def call(positions: np.ndarray, cuda_stream: int) -> np.ndarray:
            rows = [decoded.rows[p] for p in positions]
            datas = [batch.datas[r] for r in rows]
            if rows and batch.plan.subsamplings[rows[0]] == GRAY_CODE:  # a call holds one subsampling (engine_calls)
                datas = [engine_bytes(data) for data in datas]
            return np.asarray(self._decoders[k].decode(datas, decoded.buffer.data_ptr(), decoded.nbytes,
                                                       layout.base[positions], layout.height[positions],
                                                       layout.width[positions], cuda_stream))

        if stream is None:
            statuses = [call(positions, 0) for positions in calls]
            ready = None
        else:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                if decoded.allocated is not None and k != decoded.lead:
                    stream.wait_event(decoded.allocated)
                # Each call holds its thread on a core for about its whole length: beside training
                # about 7x the CPU per GPU row of alone (H100). Not the wait nvImageCodec's hardware
                # decoder makes for the object's previous call (cudaEventSynchronize): a thread kept
                # asleep on a blocking event until that work was done changed neither the calls' CPU
                # per row (117-121 against 121-126 us alone, ~840 against ~846 beside ResNet-18
                # training) nor the rate (thirty-fourth session, docs/results.md). So it is inside
                # the call itself, most likely nvJPEG's own waits (as in the twenty-fifth session).
                statuses = [call(positions, stream.cuda_stream) for positions in calls]
                ready = torch.cuda.Event()  # waited on by the GPU only (the resample stage's wait_event)
                ready.record(stream)
        cpu1, sys1 = calling_thread_cpu()
        return _Share(np.concatenate(calls), np.concatenate(statuses), ready, cpu1 - cpu0, sys1 - sys0)

    def _take_buffer(self, nbytes: int, lead: int) -> torch.Tensor:
        """A buffer of at least ``nbytes`` for a batch's images (BufferPool), new ones on the
        lead instance's stream."""
        def allocate(size: int) -> torch.Tensor:
            if self.device.type != "cuda":
                return torch.empty(size, dtype=torch.uint8)
            with torch.cuda.device(self.device), torch.cuda.stream(self._decode_streams[lead]):
                return torch.empty(size, dtype=torch.uint8, device=self.device)
        return self._images.take(nbytes, allocate)

    def _resample_stage(self, batch: PlannedBatch, pending: "Future[_Decoded]",
                        stream: Optional[torch.cuda.Stream]) -> DecodedRows:
        decoded = pending.result()
        t0 = time.perf_counter()
        if stream is None:
            result = self._resample_rows(batch, decoded)
        else:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                # The decode streams' writes, before the kernels read them: waited for on the GPU,
                # so the kernels are queued while the engines still decode. A host wait instead
                # (sleep on the events, then queue the kernels), tried so that nothing on this
                # shared stream (the producer's delivery of the batch before) could queue behind
                # the engines, ran slower: gpu-only 18,183 against 21,534 img/s (mean of four
                # alternating pairs, every pair slower), hybrid 20,312 against 20,958 (eight
                # pairs), 8,192 set, H100, 2026-12-05 (docs/results.md, twenty-second session).
                for ready in decoded.ready:
                    stream.wait_event(ready)
                try:
                    result = self._resample_rows(batch, decoded)
                finally:  # also when the resample raised after queueing kernels: they read the buffer
                    done = torch.cuda.Event(blocking=True)  # the worker sleeps on it instead of spinning a core
                    done.record(stream)
                    t1 = time.perf_counter()
                    done.synchronize()  # complete before the buffer goes and before finish hands the pixels on
                    self.stage_seconds["gpu_wait"] += time.perf_counter() - t1
        self._images.give(decoded.buffer)  # the kernels are done with it (synchronized above)
        decoded.buffer = None
        # Pipelined, the slowest stage sets the rate: the hybrid split's GPU time for the batch,
        # the decode stage's counted as its share of the time it overlapped other lanes' batches.
        result.seconds = max(decoded.charged, time.perf_counter() - t0)
        return result

    def _resample_rows(self, batch: PlannedBatch, decoded: _Decoded) -> DecodedRows:
        """Resample the rows decoded; hand the others back (refused by the engines, a header
        nvImageCodec could not read, or a size other than the plan's)."""
        good = decoded.status == DECODED
        rows = np.asarray(decoded.rows, np.int64)
        rejected = rows[~good].tolist()
        if not good.any():
            return DecodedRows(rejected=rejected)
        t0 = time.perf_counter()
        plan, sel = batch.plan, rows[good]
        into = batch.output  # the batch's output, where the pipeline gives one: the rows go straight there
        pixels = resample_batch(decoded.buffer, decoded.layout.select(good), plan.boxes[sel], plan.flips[sel], plan.orientations[sel],
                                self.out_hw, clip_to_box=isinstance(self.transform, RandomResizedCrop),
                                into=into, rows=None if into is None else sel)
        self.stage_seconds["resample"] += time.perf_counter() - t0
        if into is not None:
            return DecodedRows(rejected=rejected, written=True)
        return DecodedRows(pixels=pixels, rejected=rejected)


# SOF markers of Huffman JPEGs (baseline, extended, progressive): what gpu_decodable lets through.
_SOF_HUFFMAN = (0xC0, 0xC1, 0xC2)


def engine_bytes(data: np.ndarray) -> np.ndarray:
    """The bytes the engines are given for a gray row: the file's own, except where the frame
    header of a one-component JPEG gives that component sampling factors other than 1x1: a copy
    with 1x1 there. Called for the gray calls' rows only (GRAY_CODE).

    Why: on the H200's engines (nvImageCodec 0.9.0, HW_GPU_ONLY) every gray JPEG with 2x2 factors
    (what Pillow writes for ``subsampling=2``, as the demo set's are) came back 9.5-12.5 dB off
    libjpeg's decode, 6 demo files and 5 synthetic sizes from 64x48 to 1052x592, while the same
    files with 1x1 factors decoded identically to Pillow (2026-12-04; docs/results.md,
    fifteenth session). With one component the factors decode to the same pixels (ITU T.81 A.1.1:
    the component's size is X * H / Hmax = X; a one-component scan is non-interleaved, one block
    per MCU), so the copy is the same image; libjpeg decodes both to identical bytes (tested).
    Any frame header this walk cannot read leaves the bytes as they are (the plan read them).
    (The native header reader knows the factors too, but not where they sit in the file; the
    walk reads a few marker lengths, for ~5% of the demo mix's rows.)"""
    at = _sof_component_sampling_offset(data)
    if at is None or data[at] == 0x11:
        return data
    fixed = np.frombuffer(data, np.uint8).copy()
    fixed[at] = 0x11
    return fixed


def _sof_component_sampling_offset(data: np.ndarray) -> Optional[int]:
    """Offset of the sampling byte of a one-component frame header (SOF0/1/2), or None (more
    components, or no frame header this walk can read)."""
    n, at = len(data), 2  # after SOI
    while at + 4 <= n:
        if data[at] != 0xFF:
            return None
        marker = int(data[at + 1])
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        length = (int(data[at + 2]) << 8) | int(data[at + 3])
        if marker in _SOF_HUFFMAN:
            # FF Cn, length (2), precision (1), height (2), width (2), components (1), then per
            # component: id (1), sampling (1), table (1)
            return at + 11 if length >= 11 and at + 11 < n and data[at + 9] == 1 else None
        if marker == 0xDA or length < 2:  # a scan before any frame header, or a broken length
            return None
        at += 2 + length
    return None


def _at_least_one(name: str, value: Any) -> int:
    """``value`` if it is an int of at least 1 (a bool is not), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
    return value


def engine_calls(subsamplings: np.ndarray, instances_by_code: Dict[int, Sequence[int]]) -> List[List[np.ndarray]]:
    """The decode calls of a batch's engine rows, given each row's subsampling code: per decoder
    instance, a list of calls, each an array of row positions. A call holds one subsampling only:
    the engines decoded calls mixing 4:2:0, 4:2:2 and 4:4:4 rows at about half the rate of calls
    of one (H200, ENGINE_SUBSAMPLINGS). Each subsampling's rows are shared out in near-equal
    contiguous slices over its instances (``instances_by_code``), its first slice to the first of
    them, so those instances finish together."""
    calls: List[List[np.ndarray]] = [[] for _ in range(instance_count(instances_by_code))]
    subsamplings = np.asarray(subsamplings)
    for code in np.unique(subsamplings):
        instances = instances_by_code.get(int(code))
        if not instances:
            raise ValueError(f"no decoder instance takes chroma subsampling code {int(code)}")
        positions = np.flatnonzero(subsamplings == code)
        for k, (lo, hi) in zip(instances, decode_slices(len(positions), len(instances))):
            calls[k].append(positions[lo:hi])
    return calls


def instances_by_code(codes: Sequence[int], per_code: int) -> Dict[int, List[int]]:
    """Which decoder instances decode each subsampling: ``per_code`` of its own for each code, so
    that an instance's calls always hold the same subsampling and the few-row calls of the rarer
    subsamplings run beside the others' instead of after them (see ENGINE_SUBSAMPLINGS)."""
    return {int(code): list(range(i * per_code, (i + 1) * per_code)) for i, code in enumerate(codes)}


def instance_count(instances_by_code: Dict[int, Sequence[int]]) -> int:
    """The decoder instances a map of ``instances_by_code`` calls: 1 + its highest index (0 when empty)."""
    return 1 + max((k for instances in instances_by_code.values() for k in instances), default=-1)


def decode_slices(n: int, parts: int) -> List[Tuple[int, int]]:
    """``n`` rows in at most ``parts`` contiguous, near-equal, non-empty slices (start, end)."""
    parts = max(1, min(parts, n))
    bounds = [n * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts)] if n else []


class SharedWallClock:
    """Wall time of jobs that may overlap (the lanes' decode stages), each job charged an even
    share of every stretch it ran beside others: two batches decoded at once for 10 ms are
    charged 5 ms each, so rows over charged seconds is the rate the decoder delivers while busy
    (the split's GPU rate), whether the lanes overlapped fully, partly or not at all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._charged: Dict[int, float] = {}  # per running job (its id), the seconds charged so far
        self._last = 0.0

    def start(self, job: Any, now: float) -> None:
        with self._lock:
            self._advance(now)
            self._charged[id(job)] = 0.0

    def stop(self, job: Any, now: float) -> float:
        """The seconds charged to ``job``, which stops running at ``now``."""
        with self._lock:
            self._advance(now)
            return self._charged.pop(id(job))

    def _advance(self, now: float) -> None:
        if self._charged:
            share = max(0.0, now - self._last) / len(self._charged)
            for job in self._charged:
                self._charged[job] += share
        self._last = max(self._last, now)


@dataclass
class _Share:
    """One decoder instance's part of a batch: the rows' positions in the stage's rows, their
    statuses (``DECODED`` or why not), the event its stream records after its calls, and the CPU
    seconds of the calling thread, with the part of them in the kernel."""

    positions: np.ndarray
    status: np.ndarray
    ready: Optional[Any] = None  # torch.cuda.Event
    cpu_seconds: float = 0.0
    sys_seconds: float = 0.0


@dataclass
class _Decoded:
    """A batch's GPU rows between the stages: the rows (in order), where each one's image is
    in ``buffer`` (``layout``; written on the decode streams until ``ready``), and stage 1's
    per-row statuses and wall time."""

    rows: List[int]
    layout: ImageLayout  # HWC, stored orientation, IMAGE_ALIGN-aligned (the plan's sizes)
    buffer: Optional[torch.Tensor] = None
    lead: int = 0  # the decoder instance whose stream the buffer was taken on (its lane's first)
    allocated: Optional[Any] = None  # torch.cuda.Event on the lead's stream after the buffer was taken
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    ready: List[Any] = field(default_factory=list)  # torch.cuda.Event per decoder instance used
    seconds: float = 0.0  # stage 1's wall time
    charged: float = 0.0  # its share of that time, the time it overlapped other lanes split evenly (SharedWallClock)

    @property
    def nbytes(self) -> int:
        """The buffer bytes the layout needs."""
        return self.layout.nbytes()
