"""The hybrid split: how many of a batch's GPU-decodable rows go to the GPU so that the GPU
decoder and the native threads finish the batch together, or, while the training loop takes
batches slower than that, so that the GPU does as little of it as keeps the loader ahead.

Both sides work on the same batch at once (the GPU decoder on its worker threads, the native
threads on the native engine's queue), so each side's rate is measured while the other runs: the
rows it did over the seconds it took. With rates g and c (rows/s) the batch of n rows ends
soonest when the GPU takes n * g / (g + c) of them: the first balanced share (since
2026-12-06 the producer's waits move it from there: below). The rates are smoothed over batches
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
per batch, its rate, fixed costs per call included, reads low. The balanced share the waits
set, below, is kept through a stretch ahead.) The pace is forgotten when a feed starts and at each epoch's
end (``pace_reset``), and the producer does not count the hand-overs until its queue has
turned over once more: their waits include the consumer's first step or the pause between
epochs, not its pace.

**The balanced share from the producer's waits** (``WAIT_SPLIT``, the default since
2026-12-06). The GPU's rate as measured is what it did, not what it could do: with several
lanes decoding batches at once, a lane that idles part of the time is not charged for the idle
time, so the rate reads about the rows it was given per second of work, and the share
g / (g + c) stays near the share the GPU already has (H200, 2026-12-06: lanes busy 37%, native
threads busy 100%, the GPU given 67%). Which side the producer waited for when it collected a
batch says it directly: it waits for the native threads first, then for the GPU decoder, so a
wait for the GPU means the GPU finished last, and a wait for the native threads alone means
they did. So the waits keep a share of their own, moved up while the native threads finish
last and down while the GPU does:

- A move reaches the collected batches only after the ``window`` batches in flight, so the
  waits are summed over a window after a window left to settle.
- Each move is a step that grows while the direction holds and halves when it turns (Rprop's
  rule), at most ``WAIT_STEP_MAX``.
- The rates give the first share, and the floor of every move up: the GPU's rate reads at most
  what it could take, so (with the native rate read as it is) the balance is not below the
  rates' share. A share set while the GPU's warm-up read its rate low then catches up with the
  rates at its next move up, not a step per two windows. (An offset on the rates' share instead
  of a share of their own would feed on itself where the rates read the share given: the
  test's model of that ran at about half its ceiling.)
- Nothing moves while the loader is ahead (the native rate sets the pace's share, above), when
  neither side held the producer up, or upwards while the GPU already takes every row it
  accepts.

The share swings around the balance point rather than settling on it: a side that was the
slower keeps a backlog of queued batches after the share has crossed the point, so it stays the
one waited for, and the steps grow. In the test's model of the two queues (``_queued_hybrid``,
five batches in flight) the share swung 160-212 rows of 256 around 192 and ran at 89% of the
model's ceiling with steps of at most 1/16, and 179-200 rows at 96% with 1/64.

Tried and taken out (docs/results.md, thirty-ninth session): a consumer-first split, the GPU
only what the native threads lack of 1.05 times a pace kept through stretches behind and epoch
ends, none while they keep it. Beside ResNet-18 training as CUDA graphs from the LMDB it ran
82.6-84.0% of synthetic against this split's 78.2-90.2% and native alone's 90.9-93.6% on the
same H100; from the files 81.8-84.4% against 81.2-81.9%. Beside such a step a GPU row was not
cheap at any share measured (9-26% of the rows from the LMDB), which is why the Loader's default
is native (resolve_backend).

Measured on H100s (docs/results.md, thirtieth and thirty-first sessions; ``gpu_suite.sh waits``,
``waits_train``, ``waits_mix``, ``waits_step``): the waits' share ran the 8,192 set +10% against
the rates' (24,410 and 23,681 img/s against 22,031 and 21,559), the same beside ResNet-18
training; steps of at most 1/64 +6% against 1/16 (31,085 and 30,274 against 27,853 and 29,769).
On the demo mix the waits' runs were 7-20% slower than the rates', nearly all of it in their
first seconds: what the rates' floor on a move up is for. With it (thirty-second session, a
third H100) the waits ran +6% on the 8,192 set (28,786 and 28,862 against 26,834 and 27,668)
and on the mix +5% by the means, +1% by the medians (19,469, 19,462, 20,087 against 19,398,
17,600, 19,258), a quarter to over half of the moves up starting from the rates' share.
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

# The balanced share from which side the producer waited for (see the module's text; measured
# there), instead of from the two rates (False: the A/B's other side).
WAIT_SPLIT = True
# A wait shorter than this is a ready side: taking a finished result costs microseconds, but
# waking the producer thread can cost ~0.1 ms.
WAIT_FLOOR_S = 0.2e-3
# The steps of the share, of a batch: the first (larger, to near the balance soon from the rates'
# share), then the least and the most of every later step.
WAIT_STEP_START = 1 / 32
WAIT_STEP_MIN = 1 / 256
WAIT_STEP_MAX = 1 / 64


class SplitBalancer:
    """Per batch: ``gpu_rows(n, acceptable)``; at its collection ``observe`` what each side did
    and ``observe_waits`` which side the producer waited for; per hand-over ``observe_handover``."""

    def __init__(self, smoothing: float = 0.25, probe: float = 1 / 32, initial_share: float = 0.5,
                 window: int = 1):
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")
        if not 0 <= probe < 0.5:
            raise ValueError("probe must be in [0, 0.5)")
        if window < 1:
            raise ValueError("window must be at least 1 batch")
        self.smoothing = smoothing
        self.probe = probe
        self.initial_share = initial_share
        self.gpu_rate: Optional[float] = None     # rows/s, smoothed
        self.native_rate: Optional[float] = None  # rows/s, smoothed
        self.handover_rate: Optional[float] = None  # rows/s taken by the consumer in this stretch ahead
        self.ahead = False  # the last hand-over waited for room in the queue
        # WAIT_SPLIT: the balanced share the waits set (None until the first window moved it)
        self.window = window  # batches in flight: a share set now is first collected this many batches later
        self.share_from_waits: Optional[float] = None
        self._step = WAIT_STEP_START
        self._last_move = 0  # +1 up, -1 down, 0 none yet
        self._seen = 0  # batches observed since the last move (the first ``window`` settle)
        self._waited = [0.0, 0.0]  # this window's waits for the native threads (finished last), for the GPU
        self.capped = False  # the last batch's GPU rows were fewer than the share: it accepted no more
        self.moves = [0, 0]  # the waits' moves of the share so far, up and down (a swing shows as many of both)
        self.lifts = 0  # moves up that started from the rates' share, above the waits' (the floor at work)

    def balanced_share(self) -> float:
        """The GPU's share with which both sides finish a batch together."""
        if WAIT_SPLIT and self.share_from_waits is not None:
            return self.share_from_waits
        return self.rate_share()

    @property
    def rates_measured(self) -> bool:
        """Both sides' rates are measured (before, the rates' share is the initial guess)."""
        return self.gpu_rate is not None and self.native_rate is not None

    def rate_share(self) -> float:
        """The balanced share the two measured rates give."""
        if not self.rates_measured:
            return self.initial_share
        return self.gpu_rate / (self.gpu_rate + self.native_rate)

    def share(self) -> float:
        """The GPU's share of a batch (before the probe and the cap): the balanced share, or while
        the loader is ahead the least the GPU can take and still deliver ``HEADROOM`` times the
        consumer's rate, if that is less."""
        balanced = self.balanced_share()
        if not self.ahead or not self.rates_measured or self.handover_rate is None:
            return balanced
        return min(balanced, max(0.0, 1.0 - self.native_rate / (HEADROOM * self.handover_rate)))

    def gpu_rows(self, n: int, acceptable: int) -> int:
        """How many of a batch's ``n`` rows the GPU takes, of the ``acceptable`` ones it can."""
        if n <= 0 or acceptable <= 0:
            self.capped = n > 0  # the GPU accepts none of it: a native side waited for moves nothing
            return 0
        share = min(max(self.share(), self.probe), 1 - self.probe)
        want = int(round(n * share))
        self.capped = acceptable < want
        return max(1, min(acceptable, want))

    def observe(self, gpu_rows: int, gpu_seconds: float, native_rows: int, native_seconds: float) -> None:
        """What one batch took on each side (a side with no rows or no time teaches nothing)."""
        self.gpu_rate = self._smooth(self.gpu_rate, gpu_rows, gpu_seconds)
        self.native_rate = self._smooth(self.native_rate, native_rows, native_seconds)

    def observe_waits(self, native_wait: float, gpu_wait: float) -> None:
        """How long the producer waited, collecting a batch, for its native rows and then for its
        GPU rows (WAIT_SPLIT: moves the balanced share; see the module's text)."""
        if not WAIT_SPLIT:
            return
        if self.ahead:  # the batch had the pace's share, not the balanced one: nothing to learn
            self._seen, self._waited = 0, [0.0, 0.0]
            return
        self._seen += 1
        if self._seen <= self.window:  # batches submitted before the last move
            return
        if gpu_wait > WAIT_FLOOR_S:
            self._waited[1] += gpu_wait
        elif native_wait > WAIT_FLOOR_S:
            self._waited[0] += native_wait
        if self._seen < 2 * self.window:
            return
        native_last, gpu_last = self._waited
        self._seen, self._waited = 0, [0.0, 0.0]
        if max(native_last, gpu_last) <= WAIT_FLOOR_S * self.window:
            return  # neither side held the producer up
        move = 1 if native_last > gpu_last else -1
        if move > 0 and self.capped:
            return  # the GPU accepted no more of the batch than it has
        if self._last_move:
            grown = self._step * 1.5 if move == self._last_move else self._step / 2
            self._step = min(WAIT_STEP_MAX, max(WAIT_STEP_MIN, grown))
        self._last_move = move
        self.moves[move < 0] += 1
        rates = self.rate_share()
        start = rates if self.share_from_waits is None else self.share_from_waits
        # the rates' share is the floor of a move up (the module's text), once both are measured
        if move > 0 and self.rates_measured and rates > start:
            self.lifts += 1
            start = rates
        self.share_from_waits = min(1 - self.probe, max(self.probe, start + move * self._step))

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
        self._seen, self._waited = 0, [0.0, 0.0]  # a window spanning the pause would read its waits

    def _smooth(self, rate: Optional[float], rows: int, seconds: float) -> Optional[float]:
        if rows <= 0 or seconds <= 0:
            return rate
        now = rows / seconds
        return now if rate is None else rate + self.smoothing * (min(now, RATE_SPIKE * rate) - rate)
