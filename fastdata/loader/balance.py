"""The hybrid split: how many of a batch's GPU-decodable rows go to the GPU so that the GPU
decoder and the native threads finish the batch together.

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

    def share(self) -> float:
        """The GPU's share of a batch that the rates ask for (before the probe and the cap)."""
        if self.gpu_rate is None or self.native_rate is None:
            return self.initial_share
        return self.gpu_rate / (self.gpu_rate + self.native_rate)

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

    def _smooth(self, rate: Optional[float], rows: int, seconds: float) -> Optional[float]:
        if rows <= 0 or seconds <= 0:
            return rate
        now = rows / seconds
        return now if rate is None else rate + self.smoothing * (now - rate)
