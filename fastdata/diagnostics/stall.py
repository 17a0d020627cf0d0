"""Stall meter: is this training loop waiting for input, or for the model?

Wrap any iterable of batches (a ``fastdata.Loader``, a torch ``DataLoader``, a generator)::

    meter = fastdata.StallMeter()
    for images, labels in meter.wrap(loader):
        step(images, labels)
    print(meter.report())

    with fastdata.profile(loader) as prof:       # the same, bound to one loader
        for images, labels in prof:
            step(images, labels)
    print(prof.report())

Per step the meter splits time into *wait* (blocked in ``next()`` on the iterable) and
*step* (everything between receiving a batch and asking for the next one). When the step
runs on a GPU, host clocks lie: kernels are queued asynchronously, so a slow step looks
fast and the wait absorbs it. The meter then records a CUDA event when a batch is handed
over and one when the next is requested; the gap between a step's end event and the next
step's start event is the time the GPU sat idle waiting for input. That needs no
synchronization in the loop (``cuda_timing="sync"`` instead synchronizes at every step
end: simpler numbers, but it stops the CPU from running ahead).

The meter's own cost is two clock reads, one length probe and a few appends per step
(~1-2 µs on the 2-core CPU box; see tests/diagnostics/test_stall_meter.py), plus two event
records per step in CUDA-event mode. It never prints; ``report()`` is cheap enough to
call every few hundred steps.

Thread model: ``wrap``/``report`` belong to the training thread. GPU utilization comes
from a daemon sampler thread (NVML, every 0.2 s) that exists only in GPU mode while a
wrapped iteration is running. With ``gil_probe=True`` a second daemon thread sleeps 1 ms
over and over and records how late it wakes: a Python thread that waits for the GIL (the
training loop's, after any call that released it) waits about that long. It measures how
busy the GIL is, held by any thread — the training loop's own Python (eager PyTorch holds
it while it dispatches) as much as an input pipeline's threads — so compare it with the
same loop on synthetic data: what the input pipeline adds is the difference, and it can
slow a step while the data wait stays zero.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
import time
from collections import deque
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Tuple, TypeVar

from ..io.host import process_cpu_seconds, usable_cores
from .gpu_counters import PeriodicSampler, gpu_util_reader
from .tracing import stage

__all__ = ["StallMeter", "StallReport", "profile", "classify", "INPUT_BOUND_ABOVE", "COMPUTE_BOUND_BELOW"]

T = TypeVar("T")

# Data-wait fraction thresholds of the verdict. Below 5% the input costs less than run-to-run
# noise of most training jobs; above 15% a faster input pipeline is the biggest lever.
COMPUTE_BOUND_BELOW = 0.05
INPUT_BOUND_ABOVE = 0.15
# CPU counts as saturated when the process (and its worker children) use this share of the
# cores it may run on.
_CPU_SATURATED = 0.85
_GPU_SAMPLE_PERIOD_S = 0.2
# The GIL probe's sleep, and the lateness that counts a wakeup as held up: an idle Linux box
# wakes a sleeping thread ~0.05-0.1 ms late; a GIL held by a busy Python thread makes it wait
# up to the switch interval (5 ms by default).
_GIL_PROBE_SLEEP_S = 0.001
_GIL_LATE_S = 0.001
_GIL_PROBE_KEEP = 120_000  # the last ~2 minutes of wakeups between two reports
_RESOLVE_EVERY = 256  # steps between opportunistic CUDA event resolutions (bounds memory)


@dataclasses.dataclass(frozen=True)
class StallReport:
    """What a window of steps spent waiting for input vs computing.

    Times are seconds unless named ``*_ms``. ``data_wait_fraction`` is wait / (wait + step)
    over the window, from CUDA events (GPU idle time between steps) when ``timing`` is
    ``"cuda-events"``, else from host clocks (``host_wait_fraction`` is always the host one).
    """

    steps: int
    samples: int
    wall_seconds: float
    wait_seconds: float
    step_seconds: float
    data_wait_fraction: float
    host_wait_fraction: float
    images_per_s: Optional[float]
    wait_ms_p50: float
    wait_ms_p95: float
    step_ms_p50: float
    timing: str  # "host" | "cuda-events" | "cuda-sync"
    gpu_util_percent: Optional[float]
    gpu_util_source: Optional[str]  # "nvml" | "torch" | None (not on a GPU, or no NVML)
    cpu_cores_used: Optional[float]  # process + worker children, average over the window
    cpu_cores_available: int
    loader_stages: Optional[Dict[str, float]]  # deltas of loader.stats() over the window
    verdict: str  # "input-bound" | "compute-bound" | "balanced" | "no data"
    next_action: str
    # The GIL probe (``StallMeter(gil_probe=True)``; None without it): how late a Python thread
    # sleeping 1 ms woke, median and 99th percentile, and the share of wakeups over 1 ms late:
    # the GIL held by any thread, the training loop's own included.
    gil_wait_ms_p50: Optional[float] = None
    gil_wait_ms_p99: Optional[float] = None
    gil_late_fraction: Optional[float] = None

    @property
    def cpu_util_fraction(self) -> Optional[float]:
        if self.cpu_cores_used is None or self.cpu_cores_available <= 0:
            return None
        return self.cpu_cores_used / self.cpu_cores_available

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cpu_util_fraction"] = self.cpu_util_fraction
        return d

    def summary(self) -> str:
        """One line for periodic training logs."""
        ips = f"{self.images_per_s:,.0f} img/s" if self.images_per_s is not None else "? img/s"
        gpu = f" gpu {self.gpu_util_percent:.0f}%" if self.gpu_util_percent is not None else ""
        cpu = f" cpu {self.cpu_cores_used:.1f}/{self.cpu_cores_available}" if self.cpu_cores_used is not None else ""
        return (
            f"{ips}  data-wait {100 * self.data_wait_fraction:.1f}% ({self.timing})"
            f"  step p50 {self.step_ms_p50:.1f} ms{gpu}{cpu}  -> {self.verdict}"
        )

    def __str__(self) -> str:
        lines = [
            f"stall report: {self.steps} steps, {self.samples:,} samples in {self.wall_seconds:.2f} s"
            + (f" -> {self.images_per_s:,.0f} images/s" if self.images_per_s is not None else ""),
            f"  data wait {100 * self.data_wait_fraction:.1f}% of the time ({self.timing};"
            f" host clocks {100 * self.host_wait_fraction:.1f}%)"
            f"  wait p50 {self.wait_ms_p50:.2f} ms p95 {self.wait_ms_p95:.2f} ms, step p50 {self.step_ms_p50:.2f} ms",
        ]
        util = []
        if self.gpu_util_percent is not None:
            util.append(f"GPU util {self.gpu_util_percent:.0f}% ({self.gpu_util_source})")
        if self.cpu_cores_used is not None:
            util.append(
                f"process CPU {self.cpu_cores_used:.2f} of {self.cpu_cores_available} cores"
                f" ({100 * (self.cpu_util_fraction or 0.0):.0f}%)"
            )
        if util:
            lines.append("  " + "  ".join(util))
        if self.gil_late_fraction is not None:
            lines.append(
                f"  GIL (held by any thread): a Python thread waking from a 1 ms sleep waited p50"
                f" {self.gil_wait_ms_p50:.2f} ms, p99 {self.gil_wait_ms_p99:.2f} ms;"
                f" {100 * self.gil_late_fraction:.0f}% of wakeups over 1 ms late"
            )
        if self.loader_stages:
            lines.append("  loader: " + "  ".join(f"{k} {v:,.3g}" for k, v in self.loader_stages.items()))
        lines.append(f"  verdict: {self.verdict} -> {self.next_action}")
        return "\n".join(lines)


def classify(wait_fraction: float) -> str:
    """Verdict for a data-wait fraction in [0, 1]."""
    if wait_fraction > INPUT_BOUND_ABOVE:
        return "input-bound"
    if wait_fraction < COMPUTE_BOUND_BELOW:
        return "compute-bound"
    return "balanced"


def _batch_len(batch: Any) -> Optional[int]:
    """Samples in a batch: leading dim of the first tensor/array, else len()."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(first)
    except TypeError:
        return None


def _batch_on_cuda(batch: Any) -> bool:
    items = batch if isinstance(batch, (tuple, list)) else (batch,)
    for item in items:
        if getattr(item, "is_cuda", False):
            return True
    return False


def _stats_dict(stats: Any) -> Dict[str, float]:
    """Numeric fields of a loader's stats object (dataclass, namedtuple, dict or plain object)."""
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        raw = dataclasses.asdict(stats)
    elif hasattr(stats, "_asdict"):
        raw = stats._asdict()
    elif isinstance(stats, dict):
        raw = dict(stats)
    else:
        raw = {k: v for k, v in vars(stats).items() if not k.startswith("_")}
    return {k: float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _is_rate(key: str) -> bool:
    # Rates and gauges are reported as they are now; cumulative counters as window deltas.
    return key.endswith(("_per_s", "_fraction", "_percent", "_ratio")) or key in ("threads", "prefetch", "batch_size")


def _gil_wakeup_lateness() -> float:
    """Seconds past a 1 ms sleep until this thread runs Python again (GIL + OS wake-up)."""
    t0 = time.perf_counter()
    time.sleep(_GIL_PROBE_SLEEP_S)
    return time.perf_counter() - t0 - _GIL_PROBE_SLEEP_S


def _gil_summary(lateness: List[float]) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(p50 ms, p99 ms, share over 1 ms late) of the probe's wakeups; Nones without any."""
    if not lateness:
        return None, None, None
    late = sum(1 for x in lateness if x > _GIL_LATE_S) / len(lateness)
    return 1e3 * _quantile(lateness, 0.5), 1e3 * _quantile(lateness, 0.99), late


class StallMeter:
    """Measures per-step data wait vs step time around any iterable of batches.

    Args:
        batch_size: samples per batch; ``None`` reads the leading dimension of each batch's
            first tensor/array (falls back to ``len``).
        warmup: steps excluded at the start of the meter's life (loader start-up, compile).
        cuda_timing: ``"auto"`` uses CUDA events when the batch is a CUDA tensor or CUDA is
            initialized at the first step; ``"events"``, ``"sync"`` (``torch.cuda.synchronize``
            at each step end) or ``"off"`` (host clocks only) force a mode.
        gpu_util: sample GPU utilization through NVML when on a GPU.
        gil_probe: measure how busy the GIL is while the loop runs, held by any thread (a
            daemon thread waking every 1 ms; see the module docstring). Costs the training
            thread a GIL hand-off every few ms.
        window: per-step durations kept for percentiles (sums cover every step).
    """

    def __init__(
        self,
        batch_size: Optional[int] = None,
        *,
        warmup: int = 1,
        cuda_timing: str = "auto",
        gpu_util: bool = True,
        gil_probe: bool = False,
        window: int = 4096,
    ) -> None:
        if cuda_timing not in ("auto", "events", "sync", "off"):
            raise ValueError(f"cuda_timing must be auto, events, sync or off, got {cuda_timing!r}")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if warmup < 0 or window <= 0:
            raise ValueError(f"warmup must be >= 0 and window > 0, got {warmup}, {window}")
        self.batch_size = batch_size
        self.warmup = warmup
        self.cuda_timing = cuda_timing
        self.gpu_util = gpu_util
        self._window = window
        self._iterable: Optional[Iterable[Any]] = None
        self._mode: Optional[str] = None  # decided at the first step: host | cuda-events | cuda-sync
        self._seen = 0  # steps seen over the meter's life, warmup included
        self._stats_source: Optional[Any] = None
        self._sampler: Optional[PeriodicSampler] = None
        self._gil: Optional[PeriodicSampler] = (
            PeriodicSampler(_gil_wakeup_lateness, "sleep", period=0.0, name="fastdata-gil-probe", keep=_GIL_PROBE_KEEP)
            if gil_probe else None)  # runs only while a wrapped iteration runs
        self._active = 0  # wrap() generators currently running
        self._event_pool: List[Any] = []
        self._reset_window()

    # ---- window state -------------------------------------------------------------
    def _reset_window(self) -> None:
        self._steps = 0
        self._samples = 0
        self._samples_known = True
        self._wait_sum = 0.0
        self._step_sum = 0.0
        self._waits: Deque[float] = deque(maxlen=self._window)
        self._step_times: Deque[float] = deque(maxlen=self._window)
        # CUDA events: flat list [start_0, end_0, start_1, end_1, ...] of unresolved steps;
        # _last_end is the previous step's end event (GPU idle is measured from it).
        self._events: List[Any] = []
        self._last_end: Optional[Any] = None
        self._gpu_wait = 0.0
        self._gpu_step = 0.0
        self._gpu_steps = 0
        self._t_cpu0 = process_cpu_seconds()
        self._t_wall0 = time.perf_counter()
        self._stats0 = self._read_stats()
        if self._sampler is not None:
            self._sampler.take()
        if self._gil is not None:
            self._gil.take()

    def _read_stats(self) -> Optional[Dict[str, float]]:
        if self._stats_source is None:
            return None
        try:
            return _stats_dict(self._stats_source.stats())
        except Exception:  # a loader's stats() must never break training; report without stages
            return None

    # ---- iteration -------------------------------------------------------------------
    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield ``iterable``'s batches unchanged while timing each wait and step."""
        stats = getattr(iterable, "stats", None)
        if callable(stats) and self._stats_source is None:
            self._stats_source = iterable
            self._stats0 = self._read_stats()
        return self._wrap(iter(iterable))

    def __iter__(self) -> Iterator[Any]:
        if self._iterable is None:
            raise TypeError("StallMeter is not bound to an iterable: use meter.wrap(iterable) or fastdata.profile(loader)")
        return self.wrap(self._iterable)

    def _wrap(self, it: Iterator[T]) -> Iterator[T]:
        perf = time.perf_counter
        self._active += 1
        for sampler in (self._sampler, self._gil):
            if sampler is not None:
                sampler.start()
        step_start: Optional[float] = None  # host time the current batch was handed over
        try:
            while True:
                t_req = perf()
                if step_start is not None:
                    t_req = self._end_step(t_req, step_start)
                with stage("fastdata.wait"):
                    try:
                        batch = next(it)
                    except StopIteration:
                        return
                t_got = perf()
                if self._mode is None:
                    self._decide_mode(batch)
                if self._seen >= self.warmup:
                    wait = t_got - t_req
                    self._wait_sum += wait
                    self._waits.append(wait)
                    if self._mode == "cuda-events":
                        self._record_event(start=True)
                    step_start = t_got
                else:
                    step_start = None
                    self._seen += 1
                    if self._seen == self.warmup:
                        self._reset_window()  # window starts after warm-up
                yield batch
                if step_start is not None:
                    n = self.batch_size if self.batch_size is not None else _batch_len(batch)
                    if n is None:
                        self._samples_known = False
                    else:
                        self._samples += n
        finally:
            self._active -= 1
            # No sampler thread outlives the loop (a loop abandoned with `break` ends here
            # when its generator is closed); samples stay for report().
            for sampler in (self._sampler, self._gil):
                if self._active == 0 and sampler is not None:
                    sampler.stop()

    def _end_step(self, t_req: float, step_start: float) -> float:
        if self._mode == "cuda-sync":
            sys.modules["torch"].cuda.synchronize()
            t_req = time.perf_counter()
        elif self._mode == "cuda-events":
            self._record_event(start=False)
        dt = t_req - step_start
        self._step_sum += dt
        self._step_times.append(dt)
        self._steps += 1
        self._seen += 1
        if self._mode == "cuda-events" and self._steps % _RESOLVE_EVERY == 0:
            self._resolve_events(block=False)
        return t_req

    def _decide_mode(self, batch: Any) -> None:
        torch = sys.modules.get("torch")
        on_gpu = torch is not None and torch.cuda.is_available() and (
            _batch_on_cuda(batch) or torch.cuda.is_initialized()
        )
        if self.cuda_timing == "off" or (self.cuda_timing == "auto" and not on_gpu):
            self._mode = "host"
            return
        if torch is None or not torch.cuda.is_available():
            raise RuntimeError(f"cuda_timing={self.cuda_timing!r} needs torch with a CUDA device")
        self._mode = "cuda-sync" if self.cuda_timing == "sync" else "cuda-events"
        if self.gpu_util and self._sampler is None:
            reader = gpu_util_reader()
            if reader is not None:
                self._sampler = PeriodicSampler(*reader, period=_GPU_SAMPLE_PERIOD_S, name="fastdata-gpu-util")
                self._sampler.start()

    # ---- CUDA events -------------------------------------------------------------------
    def _record_event(self, start: bool) -> None:
        torch = sys.modules["torch"]
        ev = self._event_pool.pop() if self._event_pool else torch.cuda.Event(enable_timing=True)
        ev.record()
        if start:
            self._events.append(ev)
        elif self._events and len(self._events) % 2 == 1:
            self._events.append(ev)
        else:  # an end without a start (window reset mid-step): nothing to pair it with
            self._event_pool.append(ev)

    def _resolve_events(self, block: bool) -> None:
        """Fold completed (start, end) event pairs into the GPU sums, oldest first."""
        ev = self._events
        i = 0
        while i + 1 < len(ev):
            start, end = ev[i], ev[i + 1]
            if not block and not end.query():
                break
            if block:
                end.synchronize()
            if self._last_end is not None:
                self._gpu_wait += self._last_end.elapsed_time(start) / 1e3
                self._event_pool.append(self._last_end)
            self._gpu_step += start.elapsed_time(end) / 1e3
            self._gpu_steps += 1
            self._event_pool.append(start)
            self._last_end = end
            i += 2
        del ev[:i]

    # ---- results -----------------------------------------------------------------------
    def report(self, reset: bool = False) -> StallReport:
        """Summarize the steps since the start (or the last ``reset=True`` report).

        Blocks only in CUDA-event mode, until the last finished step's kernels are done.
        """
        wall = time.perf_counter() - self._t_wall0
        timing = self._mode or "host"
        host_total = self._wait_sum + self._step_sum
        host_frac = self._wait_sum / host_total if host_total > 0 else 0.0
        frac = host_frac
        if self._mode == "cuda-events":
            self._resolve_events(block=True)
            gpu_total = self._gpu_wait + self._gpu_step
            if gpu_total > 0:
                frac = self._gpu_wait / gpu_total
        cpu_now = process_cpu_seconds()
        cores_used = None
        if wall > 0:
            cores_used = (cpu_now - self._t_cpu0) / wall
        gpu_samples = self._sampler.take() if self._sampler is not None else []
        gpu_util = statistics.fmean(gpu_samples) if gpu_samples else None
        gil_p50, gil_p99, gil_late = _gil_summary(self._gil.take() if self._gil is not None else [])
        stages = self._stage_deltas()
        samples_ok = self._samples_known and self._samples > 0 and host_total > 0
        waits = list(self._waits)
        steps = list(self._step_times)
        verdict = classify(frac) if self._steps > 0 else "no data"
        rep = StallReport(
            steps=self._steps,
            samples=self._samples,
            wall_seconds=host_total,
            wait_seconds=self._wait_sum,
            step_seconds=self._step_sum,
            data_wait_fraction=frac,
            host_wait_fraction=host_frac,
            images_per_s=(self._samples / host_total) if samples_ok else None,
            wait_ms_p50=1e3 * _quantile(waits, 0.5),
            wait_ms_p95=1e3 * _quantile(waits, 0.95),
            step_ms_p50=1e3 * _quantile(steps, 0.5),
            timing=timing,
            gpu_util_percent=gpu_util,
            gpu_util_source=self._sampler.source if self._sampler is not None and gpu_util is not None else None,
            cpu_cores_used=cores_used,
            cpu_cores_available=usable_cores(),
            loader_stages=stages,
            verdict=verdict,
            next_action="",
            gil_wait_ms_p50=gil_p50,
            gil_wait_ms_p99=gil_p99,
            gil_late_fraction=gil_late,
        )
        rep = dataclasses.replace(rep, next_action=next_action(rep, is_fastdata=self._is_fastdata()))
        if reset:
            self._reset_window()
        return rep

    def _stage_deltas(self) -> Optional[Dict[str, float]]:
        now = self._read_stats()
        if now is None:
            return None
        base = self._stats0 or {}
        return {k: (v if _is_rate(k) else v - base.get(k, 0.0)) for k, v in now.items()}

    def _is_fastdata(self) -> bool:
        """Whether the wrapped iterable is (or wraps, e.g. in a training script) a fastdata Loader."""
        src = self._stats_source
        if src is None:
            return False
        if _from_fastdata(src):
            return True
        with contextlib.suppress(Exception):  # stats() is the loader's; never let it break a report
            return _from_fastdata(src.stats())
        return False

    def close(self) -> None:
        """Stop the sampler threads (GPU utilization, GIL probe). The meter can still report."""
        for sampler in (self._sampler, self._gil):
            if sampler is not None:
                sampler.stop()


def _from_fastdata(obj: Any) -> bool:
    module = type(obj).__module__
    return module == "fastdata" or module.startswith("fastdata.")


def _quantile(values: List[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def next_action(rep: StallReport, *, is_fastdata: bool) -> str:
    """The single most useful next step for a report's verdict (plain English)."""
    cpu = rep.cpu_util_fraction
    cpu_busy = cpu is not None and cpu >= _CPU_SATURATED
    bursty = rep.wait_ms_p95 > 4 * max(rep.wait_ms_p50, 0.05) and rep.data_wait_fraction < 0.5
    st = rep.loader_stages or {}
    if rep.verdict == "no data":
        return "run a few steps past warm-up before asking for a report"
    if rep.verdict == "compute-bound":
        if rep.gpu_util_percent is not None and rep.gpu_util_percent < 80:
            return (
                "input keeps up, but the GPU is idle part of each step: the step is host-bound "
                "(Python overhead, .item()/print syncs every step, small batch) - log less often, "
                "try torch.compile or CUDA graphs, or a larger batch"
            )
        return (
            "input keeps up; make the model faster (AMP bf16, channels_last, torch.compile, larger batch) "
            "- the input pipeline has headroom"
        )
    if rep.verdict == "balanced" and not cpu_busy:
        return "input barely keeps up: raise prefetch (and threads/workers) a little for headroom"
    if bursty and not cpu_busy:
        return "waits come in bursts while the CPU has headroom: raise prefetch so slow batches are absorbed"
    if not is_fastdata:
        if cpu_busy:
            return (
                "CPU is saturated decoding: switch to fastdata.Loader (native libjpeg-turbo decode with the crop "
                "fused in, several times Pillow's rate per core) or decode on the GPU"
            )
        return "CPU has headroom: raise num_workers/prefetch_factor, or switch to fastdata.Loader"
    read = st.get("read_seconds", 0.0)
    decode = st.get("decode_seconds", 0.0)
    if read > 0.5 * max(decode, 1e-9):
        return (
            "reading dominates decoding: cache the dataset - fastdata.RAMCache if it fits in RAM, "
            "else an LMDB made with fastdata-convert (run fastdata-doctor DATA to see which)"
        )
    if cpu_busy:
        # LMDB first: the cheapest change (fastdata-convert's records carry a restart index, so
        # native crops decode faster: the Loader 1.36-1.37x on photo-like 500x375 JPEGs, 2-core
        # box, thirty-sixth session). The engines' split only for an input-bound CUDA step with no
        # GPU decoder in use yet: beside a step that keeps the GPU busy, hybrid lost to native from
        # the LMDB in four calls and led from the files in one, where native alone was input-bound
        # (docs/results.md, thirty-eighth to fortieth sessions), so it is offered as something to try.
        options = ["read crops from an LMDB made with fastdata-convert (restart-indexed records: crops "
                   "decode faster, 1.36x on 500x375 photos)"]
        if rep.timing != "host" and rep.verdict == "input-bound" and not st.get("gpu_rows"):
            options.append("try splitting each batch with the GPU's JPEG engines (backend='hybrid', "
                           "pip install fastdata[gpu])")
        options += ["pre-shrink the images (fastdata-convert --max-side)", "use a machine with more cores per GPU"]
        return "CPU is saturated decoding: " + ", ".join(options[:-1]) + ", or " + options[-1]
    threads = st.get("threads")
    now = f" (now {threads:.0f})" if threads else ""
    return f"CPU has headroom: raise the Loader's threads={now} and prefetch="


@contextlib.contextmanager
def profile(loader: Iterable[Any], **kwargs: Any) -> Iterator[StallMeter]:
    """``with fastdata.profile(loader) as prof: for batch in prof: ...`` then ``prof.report()``.

    ``kwargs`` go to ``StallMeter``. Iterating ``prof`` several times (epochs) accumulates.
    """
    meter = StallMeter(**kwargs)
    meter._iterable = loader
    try:
        yield meter
    finally:
        meter.close()
