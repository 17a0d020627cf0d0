"""What the producer's feed tells the hybrid split about the consumer's pace (Feed._hand_over):
whether each hand-over waited for room in the queue, the interval since the one before, and
when the pace is forgotten. A stand-in producer records the reports; the feed, its queue and
its thread are the Loader's own."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, List, Tuple

import numpy as np

from fastdata.loader.producer import END, Feed, ProducerThread


class PaceRecorder:
    """A BatchProducer stand-in: batches of 4 rows, every hand-over and reset recorded."""

    depth = 1

    def __init__(self) -> None:
        self.calls: List[Tuple[Any, ...]] = []

    def start(self, indices: np.ndarray, epoch: int) -> Any:
        return indices

    def finish(self, pending: Any) -> Any:
        return (None, np.asarray(pending), None, [], {})

    def discard(self, pending: Any) -> None:
        pass

    def handed_over(self, rows: int, seconds: Any, waited: bool) -> None:
        self.calls.append(("handover", rows, seconds, waited))

    def pace_reset(self) -> None:
        self.calls.append(("reset",))


def produce(recorder: PaceRecorder, maxsize: int, epochs: List[int], consumer_seconds: float) -> int:
    """A feed of ``epochs`` (batches per epoch) on its own producer thread, consumed to the end
    (sleeping ``consumer_seconds`` after each batch); the batches taken."""
    feed = Feed(recorder, maxsize=maxsize)
    thread = ProducerThread("test-feed-pace")
    try:
        for epoch, n in enumerate(epochs):
            feed.extend(epoch, epoch, [np.arange(4)] * n)
        thread.submit(feed)
        return consume(feed, ends=len(epochs), seconds_per_batch=consumer_seconds)
    finally:
        feed.halt(thread)
        thread.close()


def consume(feed: Feed, ends: int, seconds_per_batch: float) -> int:
    """Take batches (sleeping after each) until ``ends`` end markers; the batches taken."""
    taken = 0
    while ends:
        _, item = feed.queue.get(timeout=10)
        if item is END:
            ends -= 1
            continue
        taken += 1
        time.sleep(seconds_per_batch)
    return taken


def test_a_slow_consumer_is_reported_as_waited_on_and_its_pace_measured_after_the_queue_turns_over():
    recorder = PaceRecorder()
    assert produce(recorder, maxsize=2, epochs=[8, 8], consumer_seconds=0.02) == 16
    calls = recorder.calls
    resets = [i for i, c in enumerate(calls) if c[0] == "reset"]
    assert resets[0] == 0 and len(resets) == 3  # the run's start, and each epoch's end
    first_epoch = calls[1:resets[1]]
    assert [c[1] for c in first_epoch] == [4] * 8
    # The first queue.maxsize + 1 hand-overs after a reset are not a measure of the pace...
    assert all(c[2] is None for c in first_epoch[:3])
    # ...then each is the consumer's: it takes a batch every 20 ms and the producer waits for it.
    later = first_epoch[3:]
    assert later and all(c[3] for c in later)
    assert all(0.015 <= c[2] <= 0.2 for c in later), later
    second_epoch = calls[resets[1] + 1:resets[2]]
    assert all(c[2] is None for c in second_epoch[:3])


def test_a_consumer_that_waits_for_the_producer_is_not_waited_on():
    class SlowProducer(PaceRecorder):
        def finish(self, pending: Any) -> Any:
            time.sleep(0.01)
            return super().finish(pending)

    recorder = SlowProducer()
    assert produce(recorder, maxsize=2, epochs=[10], consumer_seconds=0.0) == 10
    handovers = [c for c in recorder.calls if c[0] == "handover"]
    assert len(handovers) == 10 and not any(c[3] for c in handovers)


def test_after_a_halt_batches_in_flight_are_discarded_and_nothing_is_reported():
    # Three batches in flight (as DALI keeps them); the consumer stops reading while the
    # producer is blocked on a full queue. The halt drains the queue to unblock it: the batch
    # it was putting may land there (nobody reads it), but no further batch is finished or
    # queued, the ones in flight are discarded, and nothing is reported to the split.
    class Recorder(PaceRecorder):
        depth = 3

        def __init__(self) -> None:
            super().__init__()
            self.halted = threading.Event()
            self.finished_after_halt = 0
            self.discarded = 0

        def finish(self, pending: Any) -> Any:
            self.finished_after_halt += self.halted.is_set()
            return super().finish(pending)

        def discard(self, pending: Any) -> None:
            self.discarded += 1

    recorder = Recorder()
    feed = Feed(recorder, maxsize=1)
    thread = ProducerThread("test-feed-pace")
    try:
        feed.extend(0, 0, [np.arange(4)] * 5)  # all started early: the end of the epoch flushes them
        thread.submit(feed)
        feed.queue.get(timeout=10)
        time.sleep(0.2)  # the producer fills the queue and blocks on the next put
        reported = len(recorder.calls)
        recorder.halted.set()
        assert feed.halt(thread)
        left = []
        while True:
            try:
                left.append(feed.queue.get_nowait())
            except queue.Empty:
                break
    finally:
        thread.close()
    assert len(left) <= 1 and recorder.finished_after_halt == 0
    assert recorder.discarded >= 2  # the batches still in flight
    assert len(recorder.calls) == reported
