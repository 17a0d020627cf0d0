"""Loader: the DataLoader-compatible iterator.

One producer thread per loader (started on the first iteration, reused for every epoch,
ended by ``close``) runs the pipeline ahead of the training loop:

    sampler indices -> source.fetch -> Engine.run (native threads, GIL released) into a
    ring slot -> [CUDA] H2D copy + normalize on a side stream, event recorded
    -> queue -> next(): the consumer's stream waits on the event (no host sync)

Memory is planned once (fastdata.loader.pinned_ring): on CUDA ``prefetch`` pinned uint8 slots
[B, H, W, 3] are allocated at start and each is rewritten only after its copy event has
completed; the producer thread (not the training thread) waits for that. CPU outputs are
the slots themselves (no copy): a slot a user still holds is never rewritten.
The CUDA stream handoff lives in fastdata.loader.cuda.
"""
from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..diagnostics.tracing import stage
from ..errors import BatchDecodeError, DecodeError
from ..io.engine import DEFAULT_MAX_PIXELS, Engine, default_threads, native_spec, scale_bias_for
from ..io.transforms import RandomResizedCrop, Transform
from ..sources.base import Source
from .cuda import CudaUploader, GpuNormalizer, copy_seconds, handoff, to_device
from .pinned_ring import PinnedRing
from .sampler import ShardedOrder
from .stats import LoaderStats, StatsCounter

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# How many following indices a failed sample may be replaced by before giving up.
_MAX_REPLACEMENT_TRIES = 16
_STATE_VERSION = 1


class _Names:
    """Lazy ``source.name`` per row: only failed rows ever need a name."""

    def __init__(self, source: Source, indices: np.ndarray):
        self._source, self._indices = source, indices

    def __getitem__(self, row: int) -> str:
        return self._source.name(int(self._indices[row]))


class Loader:
    """Batches of decoded, cropped, normalized images and their labels.

    Args:
        source: a ``fastdata.Source`` (ImageFolder, FileList, BytesSource, LMDBSource, RAMCache),
            or ``TarShards`` (streamed: its shards decide the epoch order, see docs/shards.md).
        batch_size: samples per batch (per rank).
        transform: ``RandomResizedCrop`` (training) or ``CenterCrop`` (evaluation).
        shuffle, seed, drop_last: epoch order; epoch e's order and crops depend only on
            (seed, e). Without ``set_epoch`` each new iteration moves to the next epoch.
        threads: native decode threads (default: the cores this process may use).
        prefetch: batches prepared ahead (pinned slots in the ring).
        device: "cuda" (default when available) or "cpu".
        dtype: ``torch.uint8`` gives raw NHWC images; a float dtype gives normalized NCHW
            images (``channels_last`` memory unless ``channels_last=False``).
        on_error: "raise" (DecodeError naming the file) or "skip" (replace the sample by the
            next one that decodes, count it in ``stats()``, warn once per file).
        strict: treat libjpeg's corrupt-data warnings as errors.
        rank, world_size: shard of this process; default from ``torch.distributed`` when it
            is initialized, else a single process.
        backend: "native" (libjpeg-turbo threads), "nvjpeg" (torchvision's GPU decoder) or
            "dali" (NVIDIA DALI, optional extra); same order, crops, labels and outputs.
            ``backend_options`` go to the backend (e.g. DALI's ``hw_decoder_load``).
        num_workers, pin_memory: accepted for DataLoader compatibility (num_workers is an
            alias of threads; slots are pinned whenever CUDA is available).

    Outputs on CUDA belong to the stream that was current when ``next()`` returned them.
    CPU outputs are written directly by the native threads (normalized there for float
    dtypes) into ring slots; a batch the caller keeps is never overwritten (the ring
    replaces a slot still referenced anywhere). CPU outputs are pinned when CUDA is
    available and ``pin_memory`` is true (then each batch is a fresh block from torch's
    caching host allocator, so ``x.cuda(non_blocking=True)`` is safe even if ``x`` is
    dropped at once).
    """

    def __init__(self, source: Source, batch_size: int = 256, transform: Optional[Transform] = None, *,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True, threads: Optional[int] = None,
                 prefetch: int = 3, device: Optional[str] = None, dtype: torch.dtype = torch.float32,
                 channels_last: bool = True, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, on_error: str = "raise", strict: bool = False,
                 max_pixels: int = DEFAULT_MAX_PIXELS, rank: Optional[int] = None,
                 world_size: Optional[int] = None, roi: bool = True, backend: str = "native",
                 backend_options: Optional[Dict[str, Any]] = None, num_workers: Optional[int] = None,
                 pin_memory: bool = True):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if threads is None:
            threads = num_workers if num_workers else default_threads()
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.source = source
        self.transform = transform if transform is not None else RandomResizedCrop(224)
        native_spec(self.transform)  # TypeError for a non-transform, before any thread starts
        self.batch_size = int(batch_size)
        self.prefetch = int(prefetch)
        self.on_error = on_error
        self.strict = bool(strict)
        self.max_pixels = int(max_pixels)
        self.roi = bool(roi)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}") from e
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch.cuda.is_available() is False")
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if dtype not in (torch.uint8, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be uint8, float32, float16 or bfloat16, got {dtype}")
        self.dtype = dtype
        if rank is None or world_size is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
            else:
                rank, world_size = rank or 0, world_size or 1
        make_order = getattr(source, "make_order", None)
        if make_order is not None:  # a streaming source (TarShards): its shards decide the order
            self.order = make_order(self.batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                    world_size=world_size)
        else:
            self.order = ShardedOrder(len(source), self.batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                      rank=rank, world_size=world_size)
        self._labels = np.ascontiguousarray(source.labels, dtype=np.int64)
        self._channels_last = bool(channels_last)
        self._memory_format = torch.channels_last if channels_last else torch.contiguous_format
        cuda = self.device.type == "cuda"
        # Normalization runs on the GPU for CUDA outputs, in the native threads for CPU ones.
        self._normalize = (GpuNormalizer(mean, std, dtype, channels_last, self.device)
                           if cuda and dtype != torch.uint8 else None)
        self._cpu_norm = None if cuda or dtype == torch.uint8 else (tuple(mean), tuple(std))
        if self._cpu_norm is not None:
            scale_bias_for(*self._cpu_norm)  # validates mean/std now, not on the producer thread
        self._backend = None  # a GPU decoding backend (fastdata.decoders), or the native path below
        if backend != "native":
            if not cuda and backend == "nvjpeg":
                raise ValueError("backend='nvjpeg' decodes on the GPU: it needs device='cuda'")
            from ..decoders import make_backend
            self._backend = make_backend(backend, self.transform, device=self.device, dtype=dtype, mean=mean, std=std,
                                         channels_last=channels_last, seed=self.order.seed, strict=self.strict,
                                         max_pixels=self.max_pixels, threads=int(threads), **(backend_options or {}))
        # One pool of native threads per loader: a backend brings its own (it reads, plans and
        # decodes its CPU fallbacks there), so a second, idle one is not started beside it.
        self._engine = self._backend.engine if self._backend is not None else Engine(int(threads))
        self._stats = StatsCounter(self._engine.threads, self.prefetch, self.batch_size)
        # The ring, allocated once. CUDA: private pinned staging; a slot is busy from decode
        # until its copy's event, so ``prefetch`` slots keep ``prefetch`` batches in flight.
        # CPU: the slots are the outputs; alive at once are the queue (prefetch), the batch
        # being decoded and the one the training step still holds, hence prefetch + 2.
        self._ring: Optional[PinnedRing] = None
        if self._backend is None:
            self._ring = PinnedRing(self.prefetch if cuda else self.prefetch + 2, self.batch_size,
                                    self.transform.output_size,
                                    image_dtype=torch.uint8 if self._cpu_norm is None else torch.float32,
                                    pin=torch.cuda.is_available() and (cuda or bool(pin_memory)),
                                    handed_out=not cuda)
        self._uploader = CudaUploader(self.device, self._normalize) if cuda and self._backend is None else None
        self._timings: Deque[Tuple[Any, Any]] = collections.deque()  # (start, done) of copies not yet counted
        self._next_epoch = 0
        self._resume_batch = 0
        self._current: Optional["weakref.ref[_EpochIterator]"] = None
        self._producer = _ProducerThread(f"fastdata-loader-{id(self):x}")
        self._warned: set = set()
        self._closed = False

    # ---- DataLoader-like surface ----
    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.order.num_batches

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order and crops for the next iteration.

        Setting the epoch a ``load_state_dict`` resumed into keeps the resume point, so the
        usual ``for epoch in range(start, E): loader.set_epoch(epoch)`` loop resumes exactly.
        """
        if epoch < 0:
            raise ValueError("epoch must be non-negative")
        if int(epoch) != self._next_epoch:
            self._resume_batch = 0
        self._next_epoch = int(epoch)

    def __iter__(self) -> "_EpochIterator":
        if self._closed:
            raise RuntimeError("Loader is closed")
        self._stop_current()
        epoch, start = self._next_epoch, self._resume_batch
        self._next_epoch, self._resume_batch = epoch + 1, 0
        it = _EpochIterator(self, epoch, start)
        self._current = weakref.ref(it)
        return it

    def stats(self) -> LoaderStats:
        return self._stats.snapshot()

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands: resuming from it yields exactly the remaining batches."""
        cur = self._current() if self._current is not None else None
        if cur is not None and not cur.finished:
            epoch, batch = cur.epoch, cur.consumed
        else:
            epoch, batch = self._next_epoch, self._resume_batch
        o = self.order
        if batch >= o.num_batches:  # the epoch is used up: resume at the start of the next
            epoch, batch = epoch + 1, 0
        return {"version": _STATE_VERSION, "epoch": epoch, "batch": batch, "seed": o.seed, "shuffle": o.shuffle,
                "num_samples": o.num_samples, "batch_size": o.batch_size, "drop_last": o.drop_last,
                "rank": o.rank, "world_size": o.world_size}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported Loader state version {state.get('version')!r}")
        o = self.order
        for key in ("seed", "shuffle", "num_samples", "batch_size", "drop_last", "world_size"):
            if state[key] != getattr(o, key):
                raise ValueError(f"state was saved with {key}={state[key]!r}, this loader has {getattr(o, key)!r}")
        if not 0 <= state["batch"] <= o.num_batches:
            raise ValueError(f"state batch {state['batch']} outside 0..{o.num_batches}")
        self._stop_current()
        self._next_epoch, self._resume_batch = int(state["epoch"]), int(state["batch"])

    def close(self) -> None:
        """Stop the producer and join the native threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_current()
        self._producer.close()
        if self._backend is not None:
            self._backend.close()
        if self._ring is not None:
            self._ring.close()
        self._timings.clear()
        self._engine.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    def _stop_current(self) -> None:
        cur = self._current() if self._current is not None else None
        if cur is not None:
            cur.close()
        self._current = None
        end_epoch = getattr(self.source, "end_epoch", None)
        if end_epoch is not None:  # a streaming source's read-ahead for the epoch left
            end_epoch()

    # ---- producer side (runs on the loader's background thread) ----
    def _fetch(self, indices: Sequence[int]) -> list:
        t0 = time.perf_counter()
        with stage("fastdata.fetch"):
            items = self.source.fetch(indices)
        self._stats.add(fetch_seconds=time.perf_counter() - t0)
        return items

    def _check_failures(self, failures: List[DecodeError]) -> None:
        """on_error="raise": the batch's failures end the epoch, named."""
        if failures and self.on_error == "raise":
            raise failures[0] if len(failures) == 1 else BatchDecodeError(failures)

    def _replacement(self, index: int, decode_into_row: Callable[[int], bool]) -> int:
        """on_error="skip": the next dataset index after ``index`` whose sample decodes
        (``decode_into_row(j)`` decodes sample j into the failed row, True on success)."""
        n = len(self.source)
        for k in range(1, _MAX_REPLACEMENT_TRIES + 1):
            j = (index + k) % n
            if decode_into_row(j):
                return j
        raise DecodeError(f"{_MAX_REPLACEMENT_TRIES} samples in a row after it failed to decode too; "
                          "the dataset looks broken", index=index, name=self.source.name(index))

    def _engine_run(self, items: list, out: np.ndarray, indices: Sequence[int], epoch: int,
                    names: Sequence[str]) -> Any:
        report = self._engine.run(items, self.transform, out, seed=self.order.seed, epoch=epoch, indices=indices,
                                  strict=self.strict, max_pixels=self.max_pixels, names=names, roi=self.roi,
                                  normalize=self._cpu_norm)
        self._stats.add(read_seconds=report.read_seconds, decode_seconds=report.decode_seconds,
                        warnings=report.warnings, fallbacks=report.fallbacks, failures=len(report.failures))
        return report

    def _fill(self, out: np.ndarray, labels: np.ndarray, indices: np.ndarray, epoch: int) -> List[DecodeError]:
        """Decode ``indices`` into ``out`` (uint8 NHWC, or float32 NHWC normalized by the
        native threads) and their labels; returns the failures that were replaced."""
        items = self._fetch(indices)
        with stage("fastdata.decode"):
            report = self._engine_run(items, out, indices, epoch, _Names(self.source, indices))
        labels[:] = self._labels[indices]
        self._check_failures(report.failures)
        for row in report.failed_rows:
            def decode_into_row(j: int, row: int = row) -> bool:
                return not self._engine_run(self._fetch([j]), out[row:row + 1], [j], epoch,
                                            [self.source.name(j)]).failures
            labels[row] = self._labels[self._replacement(int(indices[row]), decode_into_row)]
        return report.failures

    def _produce_batch(self, indices: np.ndarray, epoch: int) -> Tuple[torch.Tensor, torch.Tensor, Any,
                                                                       List[DecodeError]]:
        """One batch as the consumer will receive it (images, labels, CUDA event, failures)."""
        n = len(indices)
        slot = self._ring.acquire()
        images, labels = slot.images[:n], slot.labels[:n]
        failures = self._fill(images.numpy(), labels.numpy(), indices, epoch)
        if self._uploader is None:
            if self._cpu_norm is not None:
                images = images.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
                if self.dtype != torch.float32 or not self._channels_last:
                    images = images.to(dtype=self.dtype, memory_format=self._memory_format)
            return images, labels, None, failures
        gpu_images, gpu_labels, start, done = self._uploader.upload(images, labels)
        slot.reader = done
        self._timings.append((start, done))
        self._count_copy_times()
        return gpu_images, gpu_labels, done, failures

    def _count_copy_times(self) -> None:
        """Add the GPU time of finished copies to the stats, without waiting for any."""
        while self._timings and self._timings[0][1].query():
            self._stats.add(h2d_seconds=copy_seconds(*self._timings.popleft()))

    def _backend_submit(self, indices: np.ndarray, epoch: int) -> Tuple[np.ndarray, int, Any]:
        """Start a batch on the GPU backend (read, plan, queue the decode); see _backend_finish."""
        items = self._fetch(indices)
        t0 = time.perf_counter()
        with stage("fastdata.decode"):
            pending = self._backend.submit(items, indices, epoch)
        self._stats.add(decode_seconds=time.perf_counter() - t0)
        return indices, epoch, pending

    def _backend_finish(self, started: Tuple[np.ndarray, int, Any]) -> Tuple[torch.Tensor, torch.Tensor, Any,
                                                                                 List[DecodeError]]:
        """A batch from a GPU backend, with the same error policy as the native path."""
        indices, epoch, pending = started
        be = self._backend
        stream_ctx = (lambda: torch.cuda.stream(be.stream)) if be.stream is not None else contextlib.nullcontext
        t0 = time.perf_counter()
        with stage("fastdata.decode"):
            images, failures, rows = be.collect(pending)
        self._stats.add(decode_seconds=time.perf_counter() - t0, failures=len(failures))
        failures = [DecodeError(f.reason, index=f.index, name=f.name or self.source.name(int(f.index)))
                    for f in failures]
        self._check_failures(failures)
        labels = self._labels[indices].copy()
        for row in rows:
            def decode_into_row(j: int, row: int = row) -> bool:
                one, bad, _ = be.run(self._fetch([j]), np.array([j]), epoch)
                if not bad:
                    with stream_ctx():
                        images[row] = one[0]
                return not bad
            labels[row] = self._labels[self._replacement(int(indices[row]), decode_into_row)]
        event = None
        with stream_ctx():
            gpu_labels = to_device(torch.from_numpy(labels), self.device)
            if be.stream is not None:
                event = torch.cuda.Event()
                event.record(be.stream)
        return images, gpu_labels, event, failures

    def _backend_discard(self, started: Tuple[np.ndarray, int, Any]) -> None:
        self._backend.discard(started[2])

    def _warn_skipped(self, failures: List[DecodeError]) -> None:
        for f in failures:
            key = f.name or f.index
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(f"fastdata: replaced an undecodable sample ({f}); counted in Loader.stats().failures",
                              RuntimeWarning, stacklevel=3)


_DONE = object()


class _StartFailed:
    """A batch whose start raised: its error, in the place of the batch."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Job:
    """One epoch's batches for the producer thread, and how to hand them over.

    The native path produces each batch in one call. A pipelined GPU backend (DALI) is
    given ``depth`` batches before the first is collected, so the backend decodes while
    this thread reads and plans the next ones; batches still in flight when the epoch is
    left early are discarded, so the backend's queue stays in step for the next epoch.
    """

    def __init__(self, loader: Loader, epoch: int, batches: List[np.ndarray], maxsize: int):
        # The only references the thread has to the loader (dropped when the job ends).
        if loader._backend is not None:
            self.start, self.finish = loader._backend_submit, loader._backend_finish
            self.discard = loader._backend_discard
            self.depth = max(1, int(getattr(loader._backend, "pipeline_depth", 1)))
        else:
            self.start, self.finish, self.discard, self.depth = loader._produce_batch, None, None, 1
        self.epoch = epoch
        self.batches = batches
        self.queue: "queue.Queue[Any]" = queue.Queue(maxsize=maxsize)
        self.stop = threading.Event()
        self.finished = threading.Event()  # set once the thread no longer touches this epoch

    def run(self) -> None:
        in_flight: Deque[Any] = collections.deque()
        try:
            for indices in self.batches:
                if self.stop.is_set():
                    return
                if self.finish is None:
                    if not self._put(self.start(indices, self.epoch)):
                        return
                    continue
                try:
                    in_flight.append(self.start(indices, self.epoch))
                except Exception as e:  # raised after the batches before it, as the native path does
                    in_flight.append(_StartFailed(e))
                    break
                if len(in_flight) >= self.depth and not self._hand_over(in_flight.popleft()):
                    return
            while in_flight:
                if self.stop.is_set() or not self._hand_over(in_flight.popleft()):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)
        finally:
            while in_flight:
                started = in_flight.popleft()
                if not isinstance(started, _StartFailed):
                    self.discard(started)
            # Drop the loader before signalling: a dropped loader can be freed.
            self.start = self.finish = self.discard = None
            self.finished.set()

    def _hand_over(self, started: Any) -> bool:
        """Finish a started batch and queue it; False when the epoch ends here."""
        if isinstance(started, _StartFailed):
            self._put(started.error)
            return False
        return self._put(self.finish(started))

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

class _ProducerThread:
    """The loader's one background thread, started on the first iteration and reused for
    every epoch (no thread churn between epochs). It holds the loader only while it runs
    a job, so dropping the loader and its iterator lets both be freed, and ``close`` ends it.
    """

    def __init__(self, name: str):
        self._jobs: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, args=(self._jobs,), name=name, daemon=True)
        self._started = False

    @staticmethod
    def _loop(jobs: "queue.Queue[Optional[_Job]]") -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            job.run()
            del job

    def submit(self, job: _Job) -> None:
        if not self._started:
            self._started = True
            self._thread.start()
        self._jobs.put(job)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def on_this_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self) -> None:
        """End the thread after its current job (stop the job first). Idempotent."""
        if not self._started:
            return
        self._jobs.put(None)
        if not self.on_this_thread():  # the loader may be freed on this thread; it ends by itself
            self._thread.join()


class _EpochIterator:
    """One pass over an epoch's batches, produced ahead by the loader's thread."""

    def __init__(self, loader: Loader, epoch: int, start: int):
        self.epoch = epoch
        self.consumed = start
        self.finished = False
        self._loader = loader
        self._total = loader.order.num_batches
        begin_epoch = getattr(loader.source, "begin_epoch", None)
        if begin_epoch is not None:  # a streaming source reads ahead in this epoch's order
            begin_epoch(loader.order, epoch, start, loader.on_error)
        self._job = _Job(loader, epoch, list(loader.order.batches(epoch, start)), loader.prefetch)
        self._producer = loader._producer
        loader._stats.start_clock()
        self._producer.submit(self._job)

    def __iter__(self) -> "_EpochIterator":
        return self

    def __len__(self) -> int:
        return self._total - self.consumed

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.finished:
            raise StopIteration
        loader = self._loader
        t0 = time.perf_counter()
        with stage("fastdata.wait"):
            while True:
                try:
                    item = self._job.queue.get(timeout=1.0)
                    break
                except queue.Empty:
                    if not self._producer.is_alive():
                        self.finished = True
                        raise RuntimeError("fastdata loader thread stopped without a result") from None
        waited = time.perf_counter() - t0
        if item is _DONE:
            self.finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        images, labels, event, failures = item
        if event is not None:
            handoff(images, labels, event, loader.device)
        self.consumed += 1
        loader._stats.add(wait_seconds=waited, batches=1, images=len(labels))
        if failures:
            loader._warn_skipped(failures)
        return images, labels

    def close(self) -> None:
        """Stop producing this epoch; return once the thread has left it. Safe to call twice."""
        job = self._job
        job.stop.set()
        self.finished = True
        if self._producer.on_this_thread():
            return  # dropped by the producer itself (garbage collection there): it is stopping
        while not job.finished.wait(0.05):
            try:  # unblock a producer waiting to put
                job.queue.get_nowait()
            except queue.Empty:
                pass
            if not self._producer.is_alive():
                break

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
