"""What a Loader measured: throughput, how long the consumer waited, and per-stage time."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from typing import ClassVar, Tuple


@dataclass(frozen=True)
class LoaderStats:
    """Cumulative since the loader was created (``*_seconds`` are sums; stage times are
    native thread time summed over threads, so they can exceed wall time)."""

    batches: int
    images: int
    wall_seconds: float        # since the first batch was asked for
    images_per_s: float        # images / wall_seconds
    wait_seconds: float        # the consumer blocked in next() waiting for a batch
    fetch_seconds: float       # source lookups (paths, LMDB reads, RAM slices), producer thread
    read_seconds: float        # file reads by native threads
    decode_seconds: float      # decode + crop/resize/flip by native threads
    h2d_seconds: float         # host-to-device copy + GPU normalize (CUDA event time)
    failures: int              # samples of the delivered batches that failed to decode (on_error="skip":
                               # each replaced by a later one; "raise": the error ends the epoch)
    replacement_failures: int  # on_error="skip": candidates that failed too while a replacement was sought
                               # (not in failures: each is counted there when its own batch decodes it)
    warnings: int              # libjpeg corrupt-data warnings (decoded anyway; strict=False)
    fallbacks: int             # non-JPEG samples decoded through Pillow
    gpu_rows: int              # rows the GPU decoder delivered (backend gpu, hybrid, nvjpeg, dali)
    native_rows: int           # rows the native threads decoded (those the GPU was not given, and gpu_rejected)
    gpu_rejected: int          # rows the GPU decoder was given but handed back (decoded natively)
    native_run_seconds: float  # the native threads' queued runs, each charged its share of the wall
                               # time (not summed over threads; overlaps counted once, BatchTimes in
                               # csrc/core/engine.h): how long they had a batch to decode
    native_busy_seconds: float # those runs' read + decode time, summed over the native threads
    cpu_seconds: float         # this process's CPU time (all threads) over wall_seconds
    threads: int
    prefetch: int
    batch_size: int

    # The fields that are settings, not sums: ``since`` keeps them as they are (every other field
    # but the rate is a count or a sum of seconds).
    GAUGES: ClassVar[Tuple[str, ...]] = ("threads", "prefetch", "batch_size")

    def since(self, earlier: "LoaderStats") -> "LoaderStats":
        """The stats of the window from the snapshot ``earlier`` to this one (of the same loader):
        every count and time is the difference, the rate recomputed over the window's wall time.
        A training script takes one at the end of its warm-up so that compile time and the
        pipeline's first batches stay out of the figures."""
        if earlier.wall_seconds > self.wall_seconds:
            raise ValueError("since(): the earlier snapshot is later than this one")
        values = {f.name: getattr(self, f.name) - getattr(earlier, f.name)
                  for f in fields(self) if f.name not in self.GAUGES + ("images_per_s",)}
        wall = values["wall_seconds"]
        return LoaderStats(images_per_s=values["images"] / wall if wall > 0 else 0.0, **values,
                           **{name: getattr(self, name) for name in self.GAUGES})

    @property
    def gpu_share(self) -> float:
        """Share of the rows the GPU decoded (the hybrid split, averaged over batches)."""
        rows = self.gpu_rows + self.native_rows
        return self.gpu_rows / rows if rows else 0.0

    @property
    def native_occupancy(self) -> float:
        """Share of wall time the native threads had a queued run to decode (1 - this: the
        producer had queued none, e.g. while it planned or waited for the GPU side)."""
        return self.native_run_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def native_busy_in_runs(self) -> float:
        """Share of the native threads' time inside their runs spent reading and decoding (1 - this:
        threads with no row left to claim while the last rows in flight finish)."""
        span = self.threads * self.native_run_seconds
        return self.native_busy_seconds / span if span > 0 else 0.0

    @property
    def cpu_cores(self) -> float:
        """CPU cores this process kept busy on average (all threads: decode, training, Python)."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Share of wall time the training loop spent waiting for batches (0 = never starved)."""
        return self.wait_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


class StatsCounter:
    """Thread-safe accumulation behind ``Loader.stats()``."""

    _FIELDS = ("batches", "images", "wait_seconds", "fetch_seconds", "read_seconds", "decode_seconds",
               "h2d_seconds", "failures", "replacement_failures", "warnings", "fallbacks", "gpu_rows", "native_rows",
               "gpu_rejected", "native_run_seconds", "native_busy_seconds")

    def __init__(self, threads: int, prefetch: int, batch_size: int):
        self._lock = threading.Lock()
        self._values = {k: 0 for k in self._FIELDS}
        self._t0 = None
        self._cpu0 = 0.0
        self._fixed = dict(threads=threads, prefetch=prefetch, batch_size=batch_size)

    def set_threads(self, threads: int) -> None:
        """The native thread count, once the pipeline has chosen it."""
        self._fixed["threads"] = int(threads)

    def start_clock(self) -> None:
        with self._lock:
            if self._t0 is None:
                self._t0 = time.perf_counter()
                self._cpu0 = time.process_time()

    def add(self, **deltas: float) -> None:
        with self._lock:
            for k, v in deltas.items():
                self._values[k] += v

    def snapshot(self) -> LoaderStats:
        with self._lock:
            v = dict(self._values)
            wall = 0.0 if self._t0 is None else time.perf_counter() - self._t0
            cpu = 0.0 if self._t0 is None else time.process_time() - self._cpu0
        return LoaderStats(wall_seconds=wall, cpu_seconds=cpu, images_per_s=v["images"] / wall if wall > 0 else 0.0,
                           **v, **self._fixed)
