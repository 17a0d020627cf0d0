"""The producer: the loader loop that runs ahead of the training step on one background thread.

Per batch (``BatchProducer``): sampler indices -> ``source.fetch`` -> the pipeline's stages
(plan, route, decode into a pinned slot) -> the skip/replace policy -> upload + normalize
(fastdata.loader.pipeline). A decoder that works asynchronously (DALI) gets ``depth``
batches started before the first is finished, so reading and planning the next batches
overlap its work.

Across batches (``Feed``): one queue that the producer thread fills with the batches of one
or more epochs in a row, each epoch closed by an end marker. While the training loop still
consumes epoch e, the thread already produces the first batches of epoch e + 1 (the epoch
an iteration after this one yields unless ``set_epoch``/``load_state_dict`` say otherwise),
so a short epoch does not drain the pipeline. The Loader adopts those batches when the next
iteration asks for exactly that epoch from its start; otherwise it stops the feed and the
lookahead batches are dropped unseen. The queue bounds the work ahead (``prefetch`` batches
and end markers together), across the boundary as within an epoch.

The thread holds the producer, never the Loader, so a dropped Loader is freed (and closes
the thread) even while its feed waits to put a lookahead batch.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..diagnostics.tracing import stage
from ..errors import BatchDecodeError, DecodeError
from ..sources.base import Source
from .cuda import copy_seconds
from .pipeline import BatchPipeline, PendingBatch
from .stats import StatsCounter

# How many following indices a failed sample may be replaced by before giving up.
_MAX_REPLACEMENT_TRIES = 16

# images, labels, CUDA event, replaced failures, outcome counts (OutcomeCounter)
Batch = Tuple[torch.Tensor, torch.Tensor, Any, List[DecodeError], Dict[str, float]]


class _Names:
    """Lazy ``source.name`` per row: only failed rows ever need a name."""

    def __init__(self, source: Source, indices: np.ndarray):
        self._source, self._indices = source, indices

    def __getitem__(self, row: int) -> str:
        return self._source.name(int(self._indices[row]))


class OutcomeCounter:
    """The pipeline's counters for one Loader. Work (``*_seconds``) counts when it is done;
    per-sample outcomes (failures, warnings, Pillow fallbacks, rows per decoder) are held until the batch they
    belong to is finished and then travel with it, counting when the consumer receives it:
    batches decoded ahead for the next epoch, or dropped by ``set_epoch``, never show in
    ``stats()`` early (the stats of an epoch are that epoch's)."""

    OUTCOMES = ("failures", "replacement_failures", "warnings", "fallbacks", "gpu_rows", "native_rows",
                "gpu_rejected")

    def __init__(self, stats: StatsCounter):
        self.stats = stats
        self._held: Dict[str, float] = {}

    def add(self, **deltas: float) -> None:
        """The pipeline's ``on_stats`` (called on the producer thread)."""
        for key in self.OUTCOMES:
            if key in deltas:
                self._held[key] = self._held.get(key, 0) + deltas.pop(key)
        if deltas:
            self.stats.add(**deltas)

    def take(self) -> Dict[str, float]:
        """The outcomes held since the last call (one batch's), and forget them."""
        held, self._held = self._held, {}
        return held


class BatchProducer:
    """One batch through the pipeline, with the loader's source, labels and error policy.

    on_error "raise": a batch's failures end the epoch, named; "skip": each failed row is
    replaced by the next dataset index that decodes (same label), written into the same slot
    before the upload.
    """

    def __init__(self, source: Source, labels: np.ndarray, pipeline: BatchPipeline, stats: StatsCounter,
                 on_error: str, outcomes: OutcomeCounter):
        self.source = source
        self.labels = labels
        self.pipeline = pipeline
        self.stats = stats
        self.outcomes = outcomes
        self.on_error = on_error
        self.depth = pipeline.depth
        self._timings: Deque[Tuple[Any, Any]] = collections.deque()  # (start, done) of copies not yet counted

    def start(self, indices: np.ndarray, epoch: int) -> PendingBatch:
        """Fetch, plan and route a batch and start its GPU rows."""
        items = self._fetch(indices)
        with stage("fastdata.decode"):
            return self.pipeline.submit(items, indices, epoch, _Names(self.source, indices))

    def finish(self, pending: PendingBatch) -> Batch:
        """The batch as the consumer receives it (images, labels, CUDA event, replaced failures,
        the batch's outcome counts for the stats)."""
        self.outcomes.take()  # nothing of another batch's: outcomes are counted only in finish
        with stage("fastdata.decode"):
            decoded = self.pipeline.decode(pending)
        failures = [err for _, err in decoded.failures]
        if failures and self.on_error == "raise":
            self.stats.add(**self.outcomes.take())  # the error is this batch's delivery
            raise failures[0] if len(failures) == 1 else BatchDecodeError(failures)
        indices = decoded.batch.indices
        labels = decoded.slot.labels[:len(decoded)].numpy()
        labels[:] = self.labels[indices]
        try:
            for row, _ in decoded.failures:
                def decode_into_row(j: int, row: int = row) -> bool:
                    return self.pipeline.replace(decoded, row, self._fetch([j])[0], j, self.source.name(j))
                labels[row] = self.labels[self._replacement(int(indices[row]), decode_into_row)]
        except DecodeError:  # no replacement found: the error is this batch's delivery
            self.stats.add(**self.outcomes.take())
            raise
        images, gpu_labels, done, start = self.pipeline.deliver(decoded, labels=True)
        if done is not None:
            self._timings.append((start, done))
            self._count_copy_times()
        return images, gpu_labels, done, failures, self.outcomes.take()

    def handed_over(self, rows: int, seconds: Optional[float], waited: bool) -> None:
        """A batch went to the consumer ``seconds`` after the one before (None: not a measure of
        its pace); ``waited``: the queue was full (the consumer is the slower). The pipeline's
        split follows the consumer's pace."""
        self.pipeline.handed_over(rows, seconds, waited)

    def pace_reset(self) -> None:
        """The consumer's pace is unknown again (a feed starts, an epoch ends)."""
        self.pipeline.pace_reset()

    def discard(self, pending: PendingBatch) -> None:
        self.pipeline.discard(pending)

    def _fetch(self, indices: Sequence[int]) -> list:
        t0 = time.perf_counter()
        with stage("fastdata.fetch"):
            items = self.source.fetch(indices)
        self.stats.add(fetch_seconds=time.perf_counter() - t0)
        return items

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

    def _count_copy_times(self) -> None:
        """Add the GPU time of finished copies to the stats, without waiting for any."""
        while self._timings and self._timings[0][1].query():
            self.stats.add(h2d_seconds=copy_seconds(*self._timings.popleft()))


END = object()  # closes an epoch in the feed's queue


class _StartFailed:
    """A batch whose start raised: its error, in the place of the batch."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Feed:
    """Epochs of batches for the producer thread, and the queue it fills.

    Each epoch run is a segment ``(serial, epoch, batches)``; queue items are
    ``(serial, payload)`` where payload is a batch, ``END`` or an exception. The Loader adds
    segments with ``extend`` (True: submit the feed to the thread again) and stops the feed
    with ``halt``. After an error or a stop the feed produces nothing more (``alive`` False).
    """

    def __init__(self, producer: BatchProducer, maxsize: int):
        self.queue: "queue.Queue[Tuple[int, Any]]" = queue.Queue(maxsize=maxsize)
        self.stop = threading.Event()
        self.lookahead: Optional[Tuple[int, int, int]] = None  # (serial, epoch, start) queued ahead, not yet asked for
        self.owner = -1  # serial of the epoch run being consumed: only its iterator may halt the feed
        self._producer = producer
        self._segments: Deque[Tuple[int, int, Iterable[np.ndarray]]] = collections.deque()
        self._lock = threading.Lock()
        self._running = False  # submitted to the thread and not yet returned
        self._idle = threading.Event()  # the thread is not inside run()
        self._idle.set()
        self._failed = False
        self._last_handover: Optional[float] = None  # time.perf_counter() of the last batch handed over
        self._settling = 0  # hand-overs left before their intervals are the consumer's pace

    @property
    def alive(self) -> bool:
        return not (self.stop.is_set() or self._failed)

    def extend(self, serial: int, epoch: int, batches: Iterable[np.ndarray]) -> Optional[bool]:
        """Queue an epoch's batches after the ones queued before; True when the caller must
        submit the feed to the producer thread (its run has ended or never started), None
        when the feed has stopped or failed (nothing more is produced)."""
        with self._lock:
            if not self.alive:
                return None
            self._segments.append((serial, epoch, batches))
            if self._running:
                return False
            self._running = True
            self._idle.clear()
            return True

    def retarget(self, serial: int, epoch: int, batches: Iterable[np.ndarray]) -> bool:
        """Replace the last queued segment (the lookahead) if the thread has not begun it."""
        with self._lock:
            if not self.alive or len(self._segments) == 0 or self.lookahead is None \
                    or self._segments[-1][0] != self.lookahead[0]:
                return False
            self._segments[-1] = (serial, epoch, batches)
            return True

    def run(self) -> None:
        """Produce every queued segment in order (on the producer thread)."""
        producer = self._producer
        in_flight: Deque[Tuple[int, Any]] = collections.deque()  # (serial, started batch | _StartFailed | END)
        serial = -1
        self._restart_pace(producer)
        try:
            while True:
                with self._lock:
                    segment = self._segments.popleft() if self._segments and self.alive else None
                    if segment is None and not in_flight:
                        self._running = False
                        return
                if segment is None:  # nothing more to start: hand over what is in flight
                    while in_flight:
                        if not self._hand_over(producer, *in_flight.popleft()):
                            return
                    continue
                serial, epoch, batches = segment
                for indices in batches:
                    if self.stop.is_set():
                        return
                    try:
                        in_flight.append((serial, producer.start(indices, epoch)))
                    except Exception as e:  # raised after the batches before it, as a synchronous start would
                        in_flight.append((serial, _StartFailed(e)))
                        break
                    if sum(1 for _, p in in_flight if p is not END) >= producer.depth:
                        # Hand over the oldest batch, and the end markers queued before and after it.
                        while in_flight:
                            s, payload = in_flight.popleft()
                            if not self._hand_over(producer, s, payload):
                                return
                            if payload is not END:
                                break
                        if not self._put_ends(in_flight):
                            return
                else:
                    in_flight.append((serial, END))
                    if not self._put_ends(in_flight):  # nothing before it in flight: the epoch ends now
                        return
                    continue
                while in_flight:  # a start failed: what came before it, then its error
                    if not self._hand_over(producer, *in_flight.popleft()):
                        return
        except BaseException as e:  # handed to the consumer, raised there
            self._failed = True
            self._put((serial, e))
        finally:
            while in_flight:
                _, payload = in_flight.popleft()
                if payload is not END and not isinstance(payload, _StartFailed):
                    producer.discard(payload)
            del producer
            with self._lock:
                if not self.alive:  # nothing will be produced any more (extend refuses a dead feed)
                    self._segments.clear()
                    self._running = False
                if not self._running:  # else extend has already asked for the next run
                    self._idle.set()

    def _put_ends(self, in_flight: Deque[Tuple[int, Any]]) -> bool:
        """Queue the end markers at the head of ``in_flight`` (their epochs are complete)."""
        while in_flight and in_flight[0][1] is END:
            self._restart_pace(self._producer)
            if not self._put(in_flight.popleft()):
                return False
        return True

    def _hand_over(self, producer: BatchProducer, serial: int, payload: Any) -> bool:
        """Finish a started batch and queue it (or queue END / a start's error); False when
        the feed ends here."""
        if payload is END:
            self._restart_pace(producer)
            return self._put((serial, END))
        if isinstance(payload, _StartFailed):
            self._failed = True
            self._put((serial, payload.error))
            return False
        if self.stop.is_set():  # halted: nobody reads the queue any more
            producer.discard(payload)
            return False
        try:
            batch = producer.finish(payload)
        except BaseException as e:
            self._failed = True
            self._put((serial, e))
            return False
        if self.stop.is_set():  # halted while it was finished
            return False
        try:  # whether there was room at once tells the producer who waits for whom
            self.queue.put_nowait((serial, batch))
            waited = False
        except queue.Full:
            if not self._put((serial, batch)):
                return False
            waited = True
        now = time.perf_counter()
        # The interval since the last hand-over is the consumer's pace only once the queue has
        # turned over after a (re)start or an epoch's end: until then a put may have waited
        # through the consumer's first step or the pause between epochs (an evaluation).
        seconds = None if self._last_handover is None or self._settling > 0 else now - self._last_handover
        self._settling = max(0, self._settling - 1)
        if not self.stop.is_set():
            producer.handed_over(len(batch[1]), seconds, waited)
        self._last_handover = now
        return True

    def _restart_pace(self, producer: BatchProducer) -> None:
        """Forget the consumer's pace: at the start of a run and at each epoch's end."""
        self._last_handover = None
        self._settling = self.queue.maxsize + 1
        producer.pace_reset()

    def _put(self, item: Tuple[int, Any]) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def halt(self, thread: "ProducerThread", deadline: Optional[float] = None) -> bool:
        """Stop producing; return once the thread has left this feed (unless called on it).
        False when it has not left by ``deadline`` (time.monotonic(); at interpreter exit)."""
        self.stop.set()
        if thread.on_this_thread():
            return True
        while not self._idle.wait(0.05):
            try:  # unblock a producer waiting to put
                self.queue.get_nowait()
            except queue.Empty:
                pass
            if not thread.is_alive():
                break
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True


class ProducerThread:
    """The loader's one background thread, started on the first iteration and reused for
    every epoch (no thread churn between epochs); it runs submitted feeds one at a time.
    """

    def __init__(self, name: str):
        self._jobs: "queue.Queue[Union[Feed, Callable[[], None], None]]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, args=(self._jobs,), name=name, daemon=True)
        self._started = False
        self._finishing = False  # finish_with was called: no job after its last one

    @staticmethod
    def _loop(jobs: "queue.Queue[Union[Feed, Callable[[], None], None]]") -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            if not isinstance(job, Feed):  # the last task (finish_with); an error in it is the
                job()  # thread's to report (threading.excepthook), then the thread ends
                return
            job.run()
            del job

    @property
    def started(self) -> bool:
        return self._started

    def submit(self, feed: Feed) -> None:
        self._put_job(feed)

    def finish_with(self, last: Callable[[], None]) -> None:
        """Run ``last`` on this thread once the feeds queued so far have returned, then end it:
        a close for a caller that must not wait (see Loader.__del__)."""
        self._put_job(last)
        self._finishing = True

    def _put_job(self, job: "Union[Feed, Callable[[], None]]") -> None:
        if self._finishing:
            raise RuntimeError("internal: a job for a producer thread that is finishing")
        if not self._started:
            self._started = True
            self._thread.start()
        self._jobs.put(job)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def on_this_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self, deadline: Optional[float] = None) -> bool:
        """End the thread after its current feed (halt the feed first). Idempotent. False when
        it still runs at ``deadline`` (time.monotonic(); at interpreter exit)."""
        if not self._started:
            return True
        self._jobs.put(None)
        if not self.on_this_thread():
            self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            return not self._thread.is_alive()
        return True
