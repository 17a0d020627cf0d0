"""The hybrid split: how many of a batch's GPU-decodable rows go to the GPU so that the GPU
decoder and the native threads finish the batch together.

Both sides work on the same batch at once (the GPU decoder on its worker thread, the native
threads on the producer's call), so each side's rate is measured while the other runs: the
rows it did over the seconds it took. With rates g and c (rows/s) the batch of n rows ends
soonest when the GPU takes n * g / (g + c) of them. The rates are smoothed over batches
(an exponential average), so one slow batch (a page fault, a cold cache) does not swing the
split, and re-measured every batch, so the split follows the data and the machine: no
``hw_decoder_load`` to tune (DALI's fixed share, which its users struggle with: DALI issues
#5362 and #6366).

The producer thread also spends time per batch outside both decodes (planning the next
batch, the upload, Python), during which the native threads idle but the GPU decoder, a
batch ahead on its own threads, keeps working. So the GPU's fair share is larger than the
rates alone say: with the producer's own seconds P per batch, both sides are busy for the
whole cycle when the GPU takes ``(n + P * c) * g / (g + c)`` rows (its time then equals the
native rows' time plus P). Measured together with the three-stage gpu decoder and the
native thread default on the H200 box: hybrid went from 1.18x to 1.47x the native engine
(docs/results.md, "second pass"; not measured apart).

Each side keeps at least ``probe`` of the batch so that its rate stays measured.
"""
from __future__ import annotations

from typing import Optional


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
        self.overhead: float = 0.0                # the producer's seconds per batch outside the decodes, smoothed

    def share(self, n: int) -> float:
        """The GPU's share of a batch of ``n`` rows that the rates and the producer's own
        time ask for (before the probe and the cap)."""
        if self.gpu_rate is None or self.native_rate is None:
            return self.initial_share
        g, c = self.gpu_rate, self.native_rate
        return (n + self.overhead * c) * g / (g + c) / n

    def gpu_rows(self, n: int, acceptable: int) -> int:
        """How many of a batch's ``n`` rows the GPU takes, of the ``acceptable`` ones it can."""
        if n <= 0 or acceptable <= 0:
            return 0
        share = min(max(self.share(n), self.probe), 1 - self.probe)
        return max(1, min(acceptable, int(round(n * share))))

    def observe(self, gpu_rows: int, gpu_seconds: float, native_rows: int, native_seconds: float,
                overhead_seconds: float = 0.0) -> None:
        """What one batch took on each side (a side with no rows or no time teaches nothing),
        and the producer's seconds outside both decodes in its last cycle."""
        self.gpu_rate = self._smooth(self.gpu_rate, gpu_rows, gpu_seconds)
        self.native_rate = self._smooth(self.native_rate, native_rows, native_seconds)
        if gpu_rows + native_rows > 0:
            self.overhead += self.smoothing * (max(0.0, overhead_seconds) - self.overhead)

    def _smooth(self, rate: Optional[float], rows: int, seconds: float) -> Optional[float]:
        if rows <= 0 or seconds <= 0:
            return rate
        now = rows / seconds
        return now if rate is None else rate + self.smoothing * (now - rate)
