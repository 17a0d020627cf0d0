"""The hybrid split: how many of a batch's GPU-decodable rows go to the GPU so that the GPU
decoder and the native threads finish the batch together, or, while the training loop takes
batches slower than that, so that the GPU does as little of it as keeps the loader ahead.

Both sides work on the same batch at once (the GPU decoder on its worker threads, the native
threads on the native engine's queue), so each side's rate is measured while the other runs: the
rows it did over the seconds it took. With rates g and c (rows/s) the batch of n rows ends
soonest when the GPU takes n * g / (g + c) of them. The rates are smoothed over batches
(an exponential average), so one slow batch (a page fault, a cold cache) does not swing the
split, and re-measured every batch, so the split follows the data and the machine: no
``hw_decoder_load`` to tune (DALI's fixed share, which its users struggle with: DALI issues
#5362 and #6366).

Both sides work without waiting for the producer thread: the native rows of batch n + 1 are
queued on the native engine before batch n is handed out, and the GPU decoder runs batches
ahead on its own threads. (Until 2026-12-02 the native rows ran on the producer's own call,
so the native threads idled through its planning and upload, and the split gave the GPU
that time too; now each side's rate is its own.) The native rate is the rows over the
engine run's own seconds, not over the producer's wait for it.

Each side keeps at least ``probe`` of the batch so that its rate stays measured.

**The consumer's pace.** Finishing together gives the most rows per second, but a training
step beside a loader is slowed more by the loader's GPU work than by its CPU work. Measured
on the H200 box (2026-12-02, resnet18 bf16 at 13,158 img/s on synthetic data, one run each):
a second process taking 10,000 img/s from a gpu-backend Loader slowed it to 82%, one taking
9,283 img/s from a native Loader to 92%; in-process, gpu-only trained at 72-75%, the
balanced hybrid at 68-78%, and this split at 76-83%. My reading, not measured apart: the
decode's kernels and copies share the GPU with the step, while its CPU threads mostly take
cores the step does not use (and ran at nice 10 then; SCHED_IDLE since 2026-12-03). So the producer reports each hand-over of
a batch to the consumer (``observe_handover``): the seconds since the one before, and
whether it had to wait for room in the queue. Waiting means the loader is ahead and the
hand-over rate is the consumer's; the native threads then take as many rows as they can
while the batch still takes at most 1 / ``HEADROOM`` of the consumer's time per batch, and
the GPU gets the rest (never more than its balanced share). Not waiting means the consumer
is waiting or about to: the balanced share, the most rows per second, for every batch
submitted from then on. A native rate measured too high can therefore make the loader fall
behind for a batch or two, never stay behind. (The rates the balanced share comes from were
measured on the batches before: after a stretch ahead in which the GPU took only a few rows
per batch, its rate, fixed costs per call included, reads low, and the balanced share takes
a few batches to come back; with GPU lanes that idle it may stay low: see
``nvimgcodec.SPLIT_RATE_PER_LANE``.) The pace is forgotten when a feed starts and at each epoch's
end (``pace_reset``), and the producer does not count the hand-overs until its queue has
turned over once more: their waits include the consumer's first step or the pause between
epochs, not its pace.
"""
from __future__ import annotations

from typing import Optional

# How much faster than the consumer the loader is kept when it is ahead: the margin for a
# slow batch and for a consumer that speeds up.
HEADROOM = 1.25

# One batch's measured rate counts at most this many times the average so far: a side's time
# for a batch can read near zero (the native engine charges overlapping runs their share of
# the threads' time, and a small run that ends just after the one before it gets a sliver of
# it, csrc/core/engine.h BatchTimes), and one such spike would hold the split off for many
# batches. A side that really got faster is followed, this factor per batch at most.
RATE_SPIKE = 4.0


class SplitBalancer:
    """Per batch: ``gpu_rows(n, acceptable)``, then ``observe`` what each side did."""

    def __init__(self, smoothing: float = 0.25, probe: float = 1 / 32, initial_share: float = 0.5):
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")
        if not 0 <= probe < 0.5:
            raise ValueError("probe must be in [0, 0.5)")
        self.smoothing = smoothing
        self.probe = probe
        self.initial_share = initial_share
        self.gpu_rate: Optional[float] = None     # rows/s, smoothed
        self.native_rate: Optional[float] = None  # rows/s, smoothed
        self.handover_rate: Optional[float] = None  # rows/s taken by the consumer in this stretch ahead
        self.ahead = False  # the last hand-over waited for room in the queue

    def balanced_share(self) -> float:
        """The GPU's share with which both sides finish a batch together."""
        if self.gpu_rate is None or self.native_rate is None:
            return self.initial_share
        return self.gpu_rate / (self.gpu_rate + self.native_rate)

    def share(self) -> float:
        """The GPU's share of a batch that the rates ask for (before the probe and the cap): the
        balanced share, or while the loader is ahead the least the GPU can take and still deliver
        ``HEADROOM`` times the consumer's rate, if that is less."""
        balanced = self.balanced_share()
        if not self.ahead or self.gpu_rate is None or self.native_rate is None or self.handover_rate is None:
            return balanced
        return min(balanced, max(0.0, 1.0 - self.native_rate / (HEADROOM * self.handover_rate)))

    def gpu_rows(self, n: int, acceptable: int) -> int:
        """How many of a batch's ``n`` rows the GPU takes, of the ``acceptable`` ones it can."""
        if n <= 0 or acceptable <= 0:
            return 0
        share = min(max(self.share(), self.probe), 1 - self.probe)
        return max(1, min(acceptable, int(round(n * share))))

    def observe(self, gpu_rows: int, gpu_seconds: float, native_rows: int, native_seconds: float) -> None:
        """What one batch took on each side (a side with no rows or no time teaches nothing)."""
        self.gpu_rate = self._smooth(self.gpu_rate, gpu_rows, gpu_seconds)
        self.native_rate = self._smooth(self.native_rate, native_rows, native_seconds)

    def observe_handover(self, rows: int, seconds: Optional[float], waited: bool) -> None:
        """A batch of ``rows`` was handed to the consumer ``seconds`` after the one before it
        (None: the producer does not count that interval as the consumer's pace); ``waited``:
        the producer waited for room in the queue (the consumer is the slower)."""
        self.ahead = waited
        if not waited:
            # The consumer waited for us: its pace is unknown (at least ours). A rate measured
            # in an earlier stretch ahead is stale, so each stretch ahead measures afresh.
            self.handover_rate = None
        elif seconds is not None and rows > 0:
            if self.handover_rate is not None:
                # One slow hand-over (a checkpoint, a page fault) moves the pace by at most half
                # a step of the average: a consumer that really slows down is followed over a
                # few batches, and an outlier does not throw the loader behind.
                seconds = min(seconds, 2.0 * rows / self.handover_rate)
            self.handover_rate = self._smooth(self.handover_rate, rows, seconds)

    def pace_reset(self) -> None:
        """Forget the consumer's pace (a feed starts, an epoch ends): the balanced share until
        the loader is measured ahead again."""
        self.ahead = False
        self.handover_rate = None

    def _smooth(self, rate: Optional[float], rows: int, seconds: float) -> Optional[float]:
        if rows <= 0 or seconds <= 0:
            return rate
        now = rows / seconds
        return now if rate is None else rate + self.smoothing * (min(now, RATE_SPIKE * rate) - rate)
