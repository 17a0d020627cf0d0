"""The one timing loop under `fastdata-bench` and every script in benchmarks/ that times a
loader, and its one statistic.

A contender (fastdata.cli.bench_contenders) yields ``(images, labels)`` batches forever.
:func:`measure` runs one for a time budget: start-up and warm-up batches untimed, then
timed batches, each read when it is on its device (CUDA is synchronized first). Rounds of
the same contender are pooled by :func:`pool`.

The statistic: **images/s = timed images / timed seconds**, summed over every round (a ratio
of sums). Why this one and not the median of window rates: it is the rate a training loop
fed by the contender actually gets. A loader that stalls now and then (an epoch-boundary
drain, workers delivering in bursts, a garbage-collection pause) loses that time in
training too, and a median of windows drops exactly those windows; with a DataLoader it
can also time a burst out of its prefetch queue (workers x prefetch_factor batches deep)
as a fast window. Noise from other processes is met by interleaving contenders and
rounds, not by discarding slow stretches. The window rates (up to :data:`MAX_WINDOWS`
consecutive stretches per round) are reported as the spread (min, quartiles, max), which
says how steady a loader is; since the statistic is the time-weighted mean of the window
rates, it always lies between their min and max.
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from fastdata.diagnostics.gpu_counters import PeriodicSampler, jpeg_util_reader
from fastdata.io.host import (process_cpu_seconds, thread_cpu_seconds, thread_minor_faults, thread_runqueue_seconds,
                              usable_cores)

MAX_WINDOWS = 5


class Usage:
    """CPU seconds and peak RSS of this process plus its children (sampled every 50 ms).

    The sampler's own CPU is not the contender's: listing the process tree every 50 ms cost
    0.06-0.09 cores on the H200 box (2026-12-02), counted into every contender's cores until
    then. ``cpu_seconds`` and ``thread_seconds`` leave it out; ``thread_seconds`` and
    ``thread_waits`` leave out every bench sampler thread (``fastdata-bench-*``: also the
    JPEG-engine sampler's, one NVML read per 0.1 s, which ``cpu_seconds`` still counts)."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.peak_rss = 0
        self._own_seconds = 0.0  # the sampler thread's CPU time, as of its last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastdata-bench-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.05):
            try:
                family = [self.proc] + self.proc.children(recursive=True)
            except psutil.Error:
                family = [self.proc]
            total = 0
            for p in family:
                try:
                    total += p.memory_info().rss
                except psutil.Error:  # a worker exiting between listing and reading
                    pass
            self.peak_rss = max(self.peak_rss, total)
            self._own_seconds = time.thread_time()

    def cpu_seconds(self) -> float:
        return process_cpu_seconds() - self._own_seconds

    def thread_seconds(self) -> Dict[str, float]:
        return _contenders(thread_cpu_seconds())

    def thread_waits(self) -> Dict[str, float]:
        """Run-queue seconds by thread kind (``thread_runqueue_seconds``)."""
        return _contenders(thread_runqueue_seconds())

    def thread_faults(self) -> Dict[str, float]:
        """Minor page faults by thread kind (``thread_minor_faults``)."""
        return _contenders(thread_minor_faults())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _contenders(by_kind: Dict[str, float]) -> Dict[str, float]:
    """Per-thread-kind figures without the bench's own sampler threads (memory, JPEG engines)."""
    return {k: v for k, v in by_kind.items() if not k.startswith("py:fastdata-bench-")}


# Between contenders the machine settles first. A DataLoader's 16 workers exiting (15 GB of
# RSS handed back) kept the H200 box busy for seconds, and the engines' decode-only row run
# right after read 12,864 img/s against 18,200-20,358 in other runs (docs/results.md,
# fourteenth session). So the next contender starts once no child process of this one is
# using a CPU and the machine's busy cores are back near what they were before the first
# contender. Idle children do not count (multiprocessing's forkserver and resource tracker
# live as long as the process), and a shared host's own load may never settle, hence the limit.
SETTLE_MAX_S = 20.0
SETTLE_WINDOW_S = 0.25


def settle_margin_cores() -> float:
    """How far above the first reading the busy cores may settle: other tenants of a big
    shared host move by more than half a core on their own."""
    import psutil

    return max(0.5, 0.05 * (psutil.cpu_count() or 1))


def busy_cores(window: float = SETTLE_WINDOW_S) -> float:
    """Cores the whole machine kept busy over the next ``window`` seconds (every process)."""
    import psutil

    return psutil.cpu_percent(interval=window) / 100.0 * (psutil.cpu_count() or 1)


def child_cpu_seconds() -> Dict[int, float]:
    """CPU seconds so far of each live descendant of this process (a DataLoader's workers, say)."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return {}
    seconds = {}
    for c in children:
        try:  # one child exiting between listing and reading must not hide the others
            t = c.cpu_times()
            seconds[c.pid] = t.user + t.system
        except psutil.Error:
            pass
    return seconds


def settle(baseline: float, *, max_seconds: float = SETTLE_MAX_S, margin: Optional[float] = None,
           busy: Callable[[], float] = busy_cores, children: Callable[[], Dict[int, float]] = child_cpu_seconds,
           clock: Callable[[], float] = time.perf_counter) -> Dict[str, Any]:
    """Waits until, over one busy reading (which takes its window), no child process of this
    one used a CPU (a child that appeared meanwhile counts as busy) and the machine's busy cores
    were at most ``baseline + margin``; for at most ``max_seconds``. Returns the seconds
    waited, the last busy reading, and whether it settled."""
    margin = settle_margin_cores() if margin is None else margin
    t0 = clock()
    while True:
        before = children()
        last = busy()
        after = children()
        active = [pid for pid, cpu in after.items() if pid not in before or cpu > before[pid] + 0.01]
        if not active and last <= baseline + margin:
            return {"seconds": clock() - t0, "busy_cores": last, "settled": True}
        if clock() - t0 >= max_seconds:
            return {"seconds": clock() - t0, "busy_cores": last, "settled": False, "busy_children": len(active)}


def describe(images: Any) -> str:
    """'float32[64x3x224x224] cpu' for a batch tensor."""
    shape = "x".join(str(s) for s in getattr(images, "shape", ()))
    dtype = str(getattr(images, "dtype", type(images).__name__)).replace("torch.", "")
    return f"{dtype}[{shape}] {getattr(images, 'device', '?')}"


def device_sync(device: str) -> Callable[[], None]:
    """What makes a batch on ``device`` really arrived: on CUDA, the work queued so far on the
    consumer's current stream (where a training step would read the batch) has completed.

    Waited on with a blocking-sync event: the consumer thread sleeps instead of spinning a
    core (``torch.cuda.synchronize`` spins by default, and waits for every stream, so also
    for the decode of batches still in flight). Every contender hands its batch to the
    current stream (Loader's handoff, ``.to(device)``, DALI's copy), so this is the
    moment its step could start."""
    if device.startswith("cuda"):
        import torch

        def arrived() -> None:
            done = torch.cuda.Event(blocking=True)
            done.record()
            done.synchronize()

        return arrived
    return lambda: None


def windows(times: Sequence[float], counts: Sequence[int], t_begin: float) -> List[float]:
    """Images/s of up to MAX_WINDOWS consecutive groups of timed batches.

    ``times[k]`` is when batch k arrived, ``counts[k]`` its images; the first group starts
    at ``t_begin`` (the end of warm-up).
    """
    n = len(times)
    groups = min(MAX_WINDOWS, n)
    rates, start, prev_t = [], 0, t_begin
    for g in range(groups):
        end = round((g + 1) * n / groups)
        imgs = sum(counts[start:end])
        dt = times[end - 1] - prev_t
        rates.append(imgs / dt if dt > 0 else float("inf"))
        start, prev_t = end, times[end - 1]
    return rates


def _quartiles(xs: Sequence[float]) -> List[float]:
    return statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3


# The least of a run's share that is timed, whatever its start-up took (see measure).
MIN_TIMED_SHARE = 0.4


def measure(contender: Any, job: Any, budget: float, *, status: Callable[[str], None] = lambda msg: None,
            step_seconds: float = 0.0, clock: Callable[[], float] = time.perf_counter,
            sleep: Callable[[float], None] = time.sleep,
            usage_factory: Callable[[], Any] = Usage,
            jpeg_reader: Callable[[], Optional[Tuple[Callable[[], float], str]]] = jpeg_util_reader) -> Dict[str, Any]:
    """One run of ``contender`` on ``job`` for about ``budget`` seconds (start-up included).

    Warm-up: at least 2 batches and 20% of the budget, ending by 60% of it; then batches until
    the budget is spent, for at least ``MIN_TIMED_SHARE`` of it (a start-up slower than the
    budget lengthens the run rather than leave it a sliver to time) and at least 2 batches (one
    batch is not a measurement; a run can overrun by the batch in flight). ``step_seconds`` simulates a
    training step after each batch (so the consumer's wait can be read). The result's
    ``images_per_s`` is the statistic of this module; ``clock``, ``sleep`` and
    ``usage_factory`` are there so a test can drive the loop with known times. On a CUDA
    device the GPU's hardware JPEG engines are sampled through the timed window
    (``jpeg_reader``, NVML; every ``JPEG_SAMPLE_PERIOD_S``): ``jpeg_engines_busy_percent``, their
    mean busy share, None where the counter cannot be read.
    """
    result: Dict[str, Any] = {"name": contender.name, "label": contender.label}
    sync = device_sync(job.device)
    usage = usage_factory()
    # Resolved now (NVML's set-up), started right before the timed window.
    engines = _jpeg_sampler(job.device, jpeg_reader)
    t0 = clock()
    gen = contender.batches(job)
    try:
        warm, first_batch_s, output = 0, None, None
        while True:
            images, _ = next(gen)
            sync()
            warm += 1
            el = clock() - t0
            if first_batch_s is None:
                first_batch_s, output = el, describe(images)
            status(f"warm-up: batch {warm} ({el:.1f} s)")
            if (warm >= 2 and el >= 0.2 * budget) or (warm >= 1 and el >= 0.6 * budget):
                break
        if engines is not None:
            engines.start()
        t_begin = clock()
        cpu0 = usage.cpu_seconds()
        threads0, waits0 = _usage_figures(usage, "thread_seconds"), _usage_figures(usage, "thread_waits")
        faults0 = _usage_figures(usage, "thread_faults")
        times: List[float] = []
        counts: List[int] = []
        waits: List[float] = []
        # The timed window: what the budget has left, but at least MIN_TIMED_SHARE of it, so a
        # start-up that ate the share (a pipeline compile, a cold engine) makes the run longer
        # instead of timing a sliver (two batches) that says nothing.
        t_end = max(t0 + budget, t_begin + MIN_TIMED_SHARE * budget)
        while clock() < t_end or len(times) < 2:
            t_req = clock()
            images, _ = next(gen)
            sync()
            now = clock()
            times.append(now)
            waits.append(now - t_req)
            counts.append(int(images.shape[0]))
            status(f"{sum(counts)} images, {sum(counts) / (now - t_begin):,.0f} img/s")
            if step_seconds:
                sleep(step_seconds)
        cpu1 = usage.cpu_seconds()
        threads1, waits1 = _usage_figures(usage, "thread_seconds"), _usage_figures(usage, "thread_waits")
        faults1 = _usage_figures(usage, "thread_faults")
        engine_samples = engines.take() if engines is not None else []
    except Exception as e:  # a contender failing mid-run is reported, not fatal to the tool
        result.update(status="failed", reason=f"{type(e).__name__}: {e}")
        return result
    finally:
        gen.close()
        usage.stop()
        if engines is not None:
            engines.stop()
    elapsed = times[-1] - t_begin  # the timed span ends when the last batch arrived
    rates = windows(times, counts, t_begin)
    result.update(
        status="ok",
        timed_images=sum(counts), timed_batches=len(counts), timed_seconds=elapsed,
        window_rates=rates, waits=waits,
        warmup_batches=warm, first_batch_seconds=first_batch_s,
        total_seconds=clock() - t0,
        cpu_seconds=cpu1 - cpu0,
        thread_cpu_seconds={k: v - threads0.get(k, 0.0) for k, v in threads1.items() if v - threads0.get(k, 0.0) > 0},
        # seconds each thread kind was runnable but waited for a core (the gpu decoder's feeder
        # threads beside the native ones, say), over the same timed window
        # (None where the kernel keeps no such figures)
        thread_runqueue_seconds=None if not waits0 else
        {k: v - waits0.get(k, 0.0) for k, v in waits1.items() if v - waits0.get(k, 0.0) > 0},
        # minor page faults of each thread kind over the timed window (fresh memory touched:
        # buffers malloc trimmed and took again, say)
        thread_minor_faults={k: v - faults0.get(k, 0) for k, v in faults1.items() if v - faults0.get(k, 0) > 0},
        peak_rss_mb=usage.peak_rss / 2**20,
        jpeg_engines_busy_percent=statistics.fmean(engine_samples) if engine_samples else None,
        output=output,
        detail=dict(getattr(contender, "detail", {})),
    )
    return _with_statistics(result, [result], waits)


# How often the JPEG engines' busy share is read (NVML averages it over its own sampling period).
JPEG_SAMPLE_PERIOD_S = 0.1


def _jpeg_sampler(device: str, reader: Callable[[], Optional[Tuple[Callable[[], float], str]]]) -> Any:
    """A sampler (not started) of the JPEG engines' busy share on a CUDA ``device``, else None."""
    if not str(device).startswith("cuda"):
        return None
    found = reader()
    return None if found is None else PeriodicSampler(*found, period=JPEG_SAMPLE_PERIOD_S, name="fastdata-bench-jpeg")


def pool(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Rounds (results of :func:`measure`) of one contender as one result: sums of images,
    seconds and CPU time; every round's windows in the spread; the statistic over the sums.
    A failed round fails it. The per-batch waits are summarised, not kept."""
    failed = next((r for r in runs if r.get("status") != "ok"), None)
    if failed is not None:
        return dict(failed)
    first = runs[0]
    pooled: Dict[str, Any] = {
        "name": first["name"], "label": first["label"], "status": "ok",
        "timed_images": sum(r["timed_images"] for r in runs),
        "timed_batches": sum(r["timed_batches"] for r in runs),
        "timed_seconds": sum(r["timed_seconds"] for r in runs),
        "window_rates": [x for r in runs for x in r["window_rates"]],
        "warmup_batches": sum(r["warmup_batches"] for r in runs),
        "first_batch_seconds": statistics.median(r["first_batch_seconds"] for r in runs),
        "total_seconds": sum(r["total_seconds"] for r in runs),
        "cpu_seconds": sum(r["cpu_seconds"] for r in runs),
        "thread_cpu_seconds": _summed([r.get("thread_cpu_seconds", {}) for r in runs]),
        "thread_runqueue_seconds": None if any(r.get("thread_runqueue_seconds") is None for r in runs)
        else _summed([r["thread_runqueue_seconds"] for r in runs]),
        "thread_minor_faults": _summed([r.get("thread_minor_faults", {}) for r in runs]),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "jpeg_engines_busy_percent": _time_weighted([(r.get("jpeg_engines_busy_percent"), r["timed_seconds"])
                                                     for r in runs]),
        "output": first["output"],
        "detail": first["detail"],
        # the waits before each round for the machine to settle (fastdata.cli.bench.run_plan)
        "settle": [r["settle"] for r in runs if r.get("settle") is not None],
    }
    return _with_statistics(pooled, runs, [x for r in runs for x in r["waits"]])


def _usage_figures(usage: Any, name: str) -> Dict[str, float]:
    """Per thread kind, ``Usage.thread_seconds`` (CPU), ``Usage.thread_waits`` (run queue) or
    ``Usage.thread_faults`` (minor page faults), or nothing where the usage sampler does not tell
    (a test's stand-in)."""
    read = getattr(usage, name, None)
    return read() if read is not None else {}


def _time_weighted(values: Sequence[Tuple[Optional[float], float]]) -> Optional[float]:
    """The mean of (value, seconds) pairs weighted by seconds, skipping missing values; None if none."""
    known = [(v, w) for v, w in values if v is not None and w > 0]
    return sum(v * w for v, w in known) / sum(w for _, w in known) if known else None


def _summed(parts: Sequence[Dict[str, float]]) -> Dict[str, float]:
    total: Dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _with_statistics(r: Dict[str, Any], runs: Sequence[Dict[str, Any]], waits: Sequence[float]) -> Dict[str, Any]:
    rate = r["timed_images"] / r["timed_seconds"]
    rates = r["window_rates"]
    q = _quartiles(rates)
    r.update(
        images_per_s=rate,
        mean_images_per_s=rate,  # the same number, under the key older JSON readers know
        spread={"min": min(rates), "max": max(rates), "q1": q[0], "q3": q[2]},
        round_rates=[run["timed_images"] / run["timed_seconds"] for run in runs],
        cpu_cores_busy=r["cpu_seconds"] / r["timed_seconds"],
        cpu_percent=100.0 * r["cpu_seconds"] / r["timed_seconds"] / usable_cores(),
        wait_ms_p50=1e3 * statistics.median(waits),
        wait_fraction=sum(waits) / r["timed_seconds"],
    )
    return r
