"""Loader: the DataLoader-compatible iterator.

One producer thread per loader (started on the first iteration, reused for every epoch,
ended by ``close``) runs the pipeline ahead of the training loop (fastdata.loader.producer):

    sampler indices -> source.fetch -> plan/route -> decoders write a pinned ring slot
    (native threads, GIL released; GPU decoders on the pipeline's stream) -> [CUDA] one H2D
    copy + normalize on that stream, event recorded -> queue -> next(): the consumer's stream
    waits on the event (no host sync)

The stages are in fastdata.loader.pipeline, the decoders in fastdata.decoders, the ring in
fastdata.loader.pinned_ring, the CUDA stream handoff in fastdata.loader.cuda. While one
epoch is consumed the thread goes on into the next one (the epoch the next iteration yields
unless ``set_epoch``/``load_state_dict`` say otherwise), so short epochs do not drain it.
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch

from ..decoders.base import Decoder
from ..diagnostics.tracing import stage
from ..errors import DecodeError
from ..io.engine import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, native_spec
from ..io.normalization import IMAGENET_MEAN, IMAGENET_STD
from ..io.transforms import RandomResizedCrop, Transform
from ..sources.base import Source
from .cuda import handoff
from .pipeline import BatchPipeline
from .producer import END, BatchProducer, Feed, OutcomeCounter, ProducerThread
from .sampler import ShardedOrder
from .stats import LoaderStats, StatsCounter

__all__ = ["Loader", "IMAGENET_MEAN", "IMAGENET_STD"]

_STATE_VERSION = 1
# At interpreter exit, how long a loader's thread may take to leave its batch (one batch's
# decode) before the exit goes on without it.
_EXIT_TIMEOUT_S = 10.0

_live_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()
# Producer threads closing the pipeline of a loader freed off the thread that made it
# (Loader.__del__): the exit hook waits for them too, so none is in native code at finalization.
_closing_producers: "Set[ProducerThread]" = set()


def _close_loaders_at_exit() -> None:
    """Stop every loader's threads before the interpreter finalizes.

    A producer thread still running at finalization (after Ctrl-C, whose traceback keeps the
    loader alive, or after a loop left early) is inside native code or DALI: CPython ends such
    a thread when it takes the GIL back, which aborted the process (SIGABRT, exit 134 instead
    of 130; #16 item 3), and DALI's own exit hook shut its pipelines down under a thread still
    using them. Runs before DALI's hook: every iteration registers it again (moved last, so
    it runs first).
    """
    for loader in list(_live_loaders):
        try:
            loader._close(timeout=_EXIT_TIMEOUT_S)
        except Exception:  # exiting: one loader's trouble must not keep the others running
            pass
    for thread in list(_closing_producers):
        try:
            thread.close(time.monotonic() + _EXIT_TIMEOUT_S)
        except Exception:
            pass


class Loader:
    """Batches of decoded, cropped, normalized images and their labels.

    Args:
        source: a ``fastdata.Source`` (ImageFolder, FileList, BytesSource, LMDBSource, RAMCache),
            or ``TarShards`` (streamed: its shards decide the epoch order, see docs/shards.md).
        batch_size: samples per batch (per rank).
        transform: ``RandomResizedCrop`` (training) or ``CenterCrop`` (evaluation).
        shuffle, seed, drop_last: epoch order; epoch e's order and crops depend only on
            (seed, e). Without ``set_epoch`` each new iteration moves to the next epoch.
        threads: native decode threads (default: the cores this process may use, split among
            the node's ranks under torchrun (``LOCAL_WORLD_SIZE``); the same for
            ``backend="hybrid"``, whose native threads run under SCHED_IDLE so that the
            threads feeding the GPU take a core whenever they wake).
        prefetch: batches prepared ahead (pinned slots in the ring).
        device: "cuda" (default when available) or "cpu".
        dtype: ``torch.uint8`` gives raw NHWC images; a float dtype gives normalized NCHW
            images (``channels_last`` memory unless ``channels_last=False``).
        on_error: "raise" (DecodeError naming the file) or "skip" (replace the sample by the
            next one that decodes, count it in ``stats()``, warn once per file).
        strict: treat libjpeg's corrupt-data warnings as errors.
        max_pixels, max_file_bytes: per-sample limits (decompression bombs; files above
            max_file_bytes fail unread, 0: no limit). Only regular files are read.
        rank, world_size: shard of this process; default from ``torch.distributed`` when it
            is initialized, else a single process.
        backend: "auto" (the default: "native"; beside a training step that keeps the GPU busy
            hybrid trained no faster, slower from fastdata-convert's LMDB, see
            ``resolve_backend``), "native" (libjpeg-turbo threads), "hybrid" (every batch split
            between the native threads and the GPU's hardware JPEG engines so that both finish
            together, re-balanced every batch; the gpu extra), "gpu" (nvImageCodec on the engines; the
            native threads take only what the engines cannot), "nvjpeg" (torchvision's GPU
            decoder) or "dali" (NVIDIA DALI, optional extra); same order, crops, labels and
            outputs. ``backend_options`` go to the backend (e.g. DALI's ``hw_decoder_load``;
            the gpu decoder's ``lanes``, batches decoded at once, each on nvImageCodec instances
            of its own, default 2 for "gpu" and 4 for "hybrid"; ``decode_threads``, a lane's
            instances per chroma subsampling the engines take (4:2:0, 4:2:2, 4:4:4, gray), sharing
            each batch, default 1 (one lane of 2 is the earlier layout); ``depth``, batches in
            flight, default 3 for "gpu" and 5 for "hybrid"; and
            ``cpu_threads``, nvImageCodec's host threads per instance). Left to pick the native
            thread count, hybrid runs one per core, as native does: they run under SCHED_IDLE, so
            the GPU side's threads take a core whenever they need one. A GPU backend decodes the rows it can take;
            the native threads decode the rest. A ``fastdata.decoders.Decoder`` object plugs
            in a decoder of your own the same way.
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
                 max_pixels: int = DEFAULT_MAX_PIXELS, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 rank: Optional[int] = None,
                 world_size: Optional[int] = None, roi: bool = True, backend: Union[str, Decoder] = "auto",
                 backend_options: Optional[Dict[str, Any]] = None, num_workers: Optional[int] = None,
                 pin_memory: bool = True):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if threads is None and num_workers:
            threads = num_workers
        # None: the pipeline picks (the usable cores; for "hybrid" less HYBRID_HOST_CORES, 0 by
        # default).
        if threads is not None and (not isinstance(threads, int) or threads < 1):
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
        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 0:
            raise ValueError(f"max_file_bytes must be an int >= 0 (0: no limit), got {max_file_bytes!r}")
        self.max_file_bytes = max_file_bytes
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
        cuda = self.device.type == "cuda"
        if not cuda and backend in ("nvjpeg", "gpu", "hybrid"):
            raise ValueError(f"backend={backend!r} decodes on the GPU: it needs device='cuda'")
        self._stats = StatsCounter(0, self.prefetch, self.batch_size)  # threads: the pipeline's, below
        self._outcomes = OutcomeCounter(self._stats)
        # The ring, allocated once. CUDA: private pinned staging; a slot is busy from decode
        # until its copy's event, so ``prefetch`` slots keep ``prefetch`` batches in flight.
        # CPU: the slots are the outputs; alive at once are the queue (prefetch), the batch
        # being decoded and the one the training step still holds, hence prefetch + 2 (the
        # pipeline adds one per further batch it decodes ahead).
        # On the CPU the native threads normalize float outputs as they write them.
        self._pipeline = BatchPipeline(
            self.transform, backend=backend, device=self.device, dtype=None if dtype == torch.uint8 else dtype,
            mean=mean, std=std, channels_last=channels_last, seed=self.order.seed, strict=self.strict,
            max_pixels=self.max_pixels, max_file_bytes=self.max_file_bytes, threads=threads, roi=self.roi,
            batch_size=self.batch_size,
            ring_slots=self.prefetch if cuda else self.prefetch + 2, handed_out=not cuda,
            pin=torch.cuda.is_available() and (cuda or bool(pin_memory)), cpu_normalize=True,
            backend_options=backend_options, on_stats=self._outcomes.add)
        self._stats.set_threads(self._pipeline.threads)
        self._producer = BatchProducer(source, self._labels, self._pipeline, self._stats, on_error, self._outcomes)
        self._next_epoch = 0
        self._resume_batch = 0
        self._serial = 0  # numbers the epoch runs handed to the producer thread
        self._feed: Optional[Feed] = None
        self._iterated = False
        self._current: Optional["weakref.ref[_EpochIterator]"] = None
        self._thread = ProducerThread(f"fastdata-loader-{id(self):x}")
        self._warned: set = set()
        self._closed = False
        self._pid = os.getpid()
        self._creator = weakref.ref(threading.current_thread())  # the thread whose __del__ may wait (__del__)
        _live_loaders.add(self)

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
        self._prefetch_next()

    def __iter__(self) -> "_EpochIterator":
        if self._closed:
            raise RuntimeError("Loader is closed")
        self._check_process()
        atexit.unregister(_close_loaders_at_exit)  # last registered runs first: before DALI's hook
        atexit.register(_close_loaders_at_exit)
        epoch, start = self._next_epoch, self._resume_batch
        self._next_epoch, self._resume_batch = epoch + 1, 0
        self._iterated = True
        feed = self._feed
        cur = self._current() if self._current is not None else None
        if (feed is not None and feed.alive and feed.lookahead is not None and feed.lookahead[1:] == (epoch, start)
                and (cur is None or cur.exhausted)):
            # The producer is already on this epoch: take its batches. Items of the run before
            # (its end marker) are skipped by serial, also when that iterator was dropped early
            # without being freed yet (it may no longer halt the feed: see _EpochIterator.close).
            serial = feed.lookahead[0]
            if cur is not None:
                cur.finished = True
        else:
            self._stop_current()
            feed = self._feed = Feed(self._producer, self.prefetch)
            serial = self._next_serial()
            self._extend(feed, serial, epoch, start)
        feed.owner = serial
        # Go on into the epoch an iteration after this one yields unless told otherwise.
        ahead = self._next_serial()
        self._extend(feed, ahead, epoch + 1, 0)
        feed.lookahead = (ahead, epoch + 1, 0) if feed.alive else None
        it = _EpochIterator(self, feed, serial, epoch, start)
        self._current = weakref.ref(it)
        return it

    def _check_process(self) -> None:
        """fork() copies only the calling thread: in a child (a DataLoader worker, say) this
        loader's producer and native threads do not exist."""
        if os.getpid() != self._pid:
            raise RuntimeError(f"this fastdata Loader was created before fork (in process {self._pid}); its threads "
                               f"do not exist in process {os.getpid()}: create the Loader in the process that "
                               "iterates it")

    def stats(self) -> LoaderStats:
        return self._stats.snapshot()

    def gpu_stage_seconds(self) -> Dict[str, float]:
        """Where the GPU decoder's worker threads spent their time since the loader was made
        (seconds, summed over batches and lanes): ``decode`` (its nvImageCodec calls' wall
        time), ``decode_cpu`` (their threads' CPU time), ``decode_sys`` (the part of that CPU
        time in the kernel), ``resample`` (queueing the kernels) and ``gpu_wait`` (waiting for
        them to finish: the GPU's queue). Empty when no GPU decoder keeps these (native, dali,
        nvjpeg)."""
        stages = getattr(self._pipeline.decoders[0], "stage_seconds", None)
        return dict(stages) if stages else {}

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
        self._prefetch_next()

    def close(self) -> None:
        """Stop the producer and join the native threads. Idempotent."""
        self._close(timeout=None)

    def _close(self, timeout: Optional[float], wait: bool = True) -> None:
        """``close``, waiting at most ``timeout`` seconds for the producer to stop (at exit;
        past it, the rest is left to the process's end: the native side never aborts it), or
        not at all (``wait=False``: __del__ off the loader's own thread). Then the feed is only
        told to stop, and the producer thread closes the rest and ends once it has left it."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:  # a forked child: the threads to stop and join are not here
            return
        cur = self._current() if self._current is not None else None
        if cur is not None:
            cur.finished = True
        self._current = None
        feed, self._feed = self._feed, None
        # A streaming source's readers are ended and joined here (its generator's end only
        # signals them). A deferred close names this loader's stream: by the time it runs,
        # another loader on the same source may be reading its own.
        end_stream = getattr(self.source, "end_stream", None)
        stream = getattr(self.source, "stream", None) if end_stream is not None else None
        pipeline, thread = self._pipeline, self._thread

        def close_rest() -> None:
            try:
                if end_stream is not None and (wait or stream is not None):
                    end_stream(stream)
            finally:
                try:
                    pipeline.close()
                finally:
                    _closing_producers.discard(thread)

        if not wait and thread.started:
            if feed is not None:
                feed.stop.set()
            _closing_producers.add(thread)
            atexit.unregister(_close_loaders_at_exit)  # as __iter__ does: before DALI's exit hook
            atexit.register(_close_loaders_at_exit)
            thread.finish_with(close_rest)
            return
        # (Never iterated, the producer thread never started: nothing to wait for.)
        deadline = None if timeout is None else time.monotonic() + timeout
        if feed is not None and not feed.halt(thread, deadline):
            return
        if not thread.close(deadline):
            return
        close_rest()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # The garbage collector runs this on whichever thread frees the loader: after a
        # DecodeError ended a loop, a reference cycle through the error's traceback can leave
        # it to a collection on any thread, also on one the producer is waiting for (a
        # decoder's worker, a source's reader). Waiting there for the producer deadlocks (seen:
        # the gpu decoder's resample thread, and the process hung at exit). So only the thread
        # that made the loader waits here.
        try:
            self._close(timeout=None, wait=threading.current_thread() is self._creator())
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    # ---- internals ----
    @property
    def _ring(self):  # the pinned ring (tests check its allocations)
        return self._pipeline.ring

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _prefetch_next(self) -> None:
        """Point the work ahead at the iteration ``set_epoch``/``load_state_dict`` asked for.

        Mid-epoch, the lookahead is swapped if the producer has not begun it yet (else the
        next ``iter()`` drops it). Between epochs, the producer starts on the asked-for epoch
        at once, and the next ``iter()`` adopts it.
        """
        if self._closed or not self._iterated:
            return  # nothing runs yet: the first iteration starts the producer
        want = (self._next_epoch, self._resume_batch)
        feed = self._feed
        if feed.alive and feed.lookahead is not None and feed.lookahead[1:] == want:
            return
        cur = self._current() if self._current is not None else None
        if cur is not None and not cur.exhausted:
            serial = self._next_serial()
            if feed.retarget(serial, want[0], self._batches(*want)):
                feed.lookahead = (serial, *want)
            return
        self._stop_current()
        feed = self._feed = Feed(self._producer, self.prefetch)
        serial = self._next_serial()
        self._extend(feed, serial, *want)
        feed.lookahead = (serial, *want) if feed.alive else None

    def _batches(self, epoch: int, start: int) -> Iterator[np.ndarray]:
        """``epoch``'s batches from ``start`` (a lazy iterator: computed on the producer thread).
        A streaming source (TarShards) hands them out itself, reading ahead as they are taken."""
        stream_batches = getattr(self.source, "stream_batches", None)
        if stream_batches is not None:
            return stream_batches(self.order, epoch, start, self.on_error)
        return self.order.batches(epoch, start)

    def _extend(self, feed: Feed, serial: int, epoch: int, start: int) -> None:
        """Queue ``epoch``'s batches from ``start`` on ``feed``."""
        if feed.extend(serial, epoch, self._batches(epoch, start)):
            self._thread.submit(feed)

    def _stop_current(self) -> None:
        """End the current iteration and whatever the producer does ahead."""
        cur = self._current() if self._current is not None else None
        if cur is not None:
            cur.finished = True
        self._current = None
        if self._feed is not None:
            self._feed.halt(self._thread)
            self._feed = None
        end_stream = getattr(self.source, "end_stream", None)
        if end_stream is not None:  # a streaming source's read-ahead for the epoch left
            end_stream()

    def _warn_skipped(self, failures: List[DecodeError]) -> None:
        for f in failures:
            key = f.name or f.index
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(f"fastdata: replaced an undecodable sample ({f}); counted in Loader.stats().failures",
                              RuntimeWarning, stacklevel=3)


class _EpochIterator:
    """One pass over an epoch's batches, produced ahead by the loader's thread."""

    def __init__(self, loader: Loader, feed: Feed, serial: int, epoch: int, start: int):
        self.epoch = epoch
        self.consumed = start
        self.finished = False
        self._loader = loader
        self._feed = feed
        self._serial = serial
        self._total = loader.order.num_batches
        self._thread = loader._thread
        self._creator = weakref.ref(threading.current_thread())  # the consumer: the thread whose __del__ may wait
        loader._stats.start_clock()

    @property
    def exhausted(self) -> bool:
        """Every batch of the epoch was handed out: what the feed produces next is another epoch's."""
        return self.consumed >= self._total

    def __iter__(self) -> "_EpochIterator":
        return self

    def __len__(self) -> int:
        return self._total - self.consumed

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.finished:
            raise StopIteration
        loader = self._loader
        loader._check_process()
        t0 = time.perf_counter()
        with stage("fastdata.wait"):
            while True:
                try:
                    serial, item = self._feed.queue.get(timeout=1.0)
                except queue.Empty:
                    if not self._thread.is_alive():
                        self.finished = True
                        raise RuntimeError("fastdata loader thread stopped without a result") from None
                    continue
                if serial == self._serial:
                    break
                # else: the end marker of the epoch before this one, never asked for
        waited = time.perf_counter() - t0
        if item is END:
            self.finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        images, labels, event, failures, outcomes = item
        if event is not None:
            handoff(images, labels, event, loader.device)
        self.consumed += 1
        loader._stats.add(wait_seconds=waited, batches=1, images=len(labels), **outcomes)
        if failures:
            loader._warn_skipped(failures)
        return images, labels

    def close(self) -> None:
        """Stop producing this epoch (and the lookahead) unless every batch was handed out or
        a later iteration took the feed over; return once the thread has left it. Safe to
        call twice."""
        self._stop(wait=True)

    def __del__(self) -> None:
        # As Loader.__del__: only the consumer's thread waits for the producer to leave the
        # feed; on any other (a garbage collection there) the feed is only told to stop. What
        # comes next (iter, set_epoch, load_state_dict, close, the exit hook) waits for it.
        try:
            self._stop(wait=threading.current_thread() is self._creator())
        except Exception:
            pass

    def _stop(self, wait: bool) -> None:
        self.finished = True
        if os.getpid() != self._loader._pid:
            return  # a forked child: no producer here to wait for
        if not self.exhausted and self._feed.owner == self._serial:
            if wait:
                self._feed.halt(self._thread)
            else:
                self._feed.stop.set()
