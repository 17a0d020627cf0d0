"""StallMeter: wait/step split, verdicts, overhead, loader stats, tracing ranges.

Oracles: fake loaders and steps that sleep known times and time their own sleeps, so the
truth does not come from the meter's clocks.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import types
from typing import Iterator, List, Tuple

import numpy as np
import pytest

import fastdata
from fastdata.diagnostics import tracing
from fastdata.diagnostics.stall import StallMeter, StallReport, classify, next_action, profile

BATCH = 8


class SleepyLoader:
    """Produces a batch after sleeping ``delay`` seconds in ``__next__`` (no prefetch)."""

    def __init__(self, steps: int, delay: float):
        self.steps = steps
        self.delay = delay
        self.slept: List[float] = []

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        for i in range(self.steps):
            t = time.perf_counter()
            time.sleep(self.delay)
            self.slept.append(time.perf_counter() - t)
            yield np.full((BATCH, 3), i, np.float32), np.arange(BATCH)


def run(loader, step_s: float, meter: StallMeter) -> None:
    for _batch in meter.wrap(loader):
        time.sleep(step_s)


@pytest.fixture
def clock(monkeypatch) -> "VirtualClock":
    """The meter's clock made virtual: the loaders and steps below advance it by exact
    amounts, so the fractions the meter reports are checked against known truths, not
    against sleeps that a loaded machine stretches."""
    import fastdata.diagnostics.stall as stall_module

    c = VirtualClock()
    monkeypatch.setattr(stall_module, "time", types.SimpleNamespace(perf_counter=c.now))
    return c


class VirtualPrefetcher:
    """A background producer with a queue of ``depth`` batches, in virtual time: batch k is
    ready ``delay`` after the producer is free and the queue has room (the consumer took
    batch k - depth); asking for it earlier waits until then."""

    def __init__(self, clock: "VirtualClock", steps: int, delay: float, depth: int = 3):
        self.clock, self.steps, self.delay, self.depth = clock, steps, delay, depth

    def __iter__(self) -> Iterator[np.ndarray]:
        start = self.clock.now()
        ready: List[float] = []
        taken: List[float] = []
        for k in range(self.steps):
            free = ready[k - 1] if k else start
            room = taken[k - self.depth] if k >= self.depth else start
            ready.append(max(free, room) + self.delay)
            self.clock.sleep(max(0.0, ready[k] - self.clock.now()))
            taken.append(self.clock.now())
            yield np.full((BATCH, 3), k, np.float32)


def run_virtual(loader, step_s: float, meter: StallMeter, clock: "VirtualClock") -> None:
    for _batch in meter.wrap(loader):
        clock.sleep(step_s)


def test_slow_loader_is_input_bound_with_true_wait_fraction(clock):
    meter = StallMeter(warmup=1, gpu_util=False)
    run_virtual(VirtualLoader(clock, steps=25, delay=0.020), 0.002, meter, clock)
    rep = meter.report()
    assert rep.verdict == "input-bound"
    assert rep.timing == "host"
    assert rep.steps == 24
    assert rep.samples == 24 * BATCH
    assert rep.data_wait_fraction == pytest.approx(20 / 22, abs=1e-9)
    assert rep.images_per_s == pytest.approx(BATCH / 0.022, rel=1e-9)
    assert "more" in rep.next_action or "fastdata.Loader" in rep.next_action


def test_slow_step_is_compute_bound_with_true_wait_fraction(clock):
    meter = StallMeter(warmup=1, gpu_util=False)
    run_virtual(VirtualLoader(clock, steps=25, delay=0.001), 0.040, meter, clock)
    rep = meter.report()
    assert rep.verdict == "compute-bound"
    assert rep.data_wait_fraction == pytest.approx(1 / 41, abs=1e-9)
    assert rep.step_ms_p50 == pytest.approx(40.0, rel=1e-9)
    assert "model faster" in rep.next_action


def test_prefetching_loader_wait_is_only_the_uncovered_part(clock):
    # Producer 15 ms/batch, step 5 ms: in steady state the loop waits 10 of every 15 ms.
    meter = StallMeter(warmup=2, gpu_util=False)
    run_virtual(VirtualPrefetcher(clock, steps=30, delay=0.015), 0.005, meter, clock)
    rep = meter.report()
    assert rep.verdict == "input-bound"
    assert rep.data_wait_fraction == pytest.approx(10 / 15, abs=1e-9)
    # Producer faster than the step: the queue stays full, no wait after it filled.
    meter = StallMeter(warmup=2, gpu_util=False)
    run_virtual(VirtualPrefetcher(clock, steps=30, delay=0.002, depth=4), 0.010, meter, clock)
    rep = meter.report()
    assert rep.verdict == "compute-bound", str(rep)
    assert rep.data_wait_fraction == pytest.approx(0.0, abs=1e-9)


def test_warmup_excludes_slow_first_batch(clock):
    class SlowStart:
        def __iter__(self):
            clock.sleep(0.1)  # e.g. worker start-up
            for _ in range(10):
                yield np.zeros((BATCH, 2))

    meter = StallMeter(warmup=1, gpu_util=False)
    run_virtual(SlowStart(), 0.005, meter, clock)
    rep = meter.report()
    assert rep.steps == 9
    assert rep.wait_seconds == pytest.approx(0.0, abs=1e-9)
    cold = StallMeter(warmup=0, gpu_util=False)
    run_virtual(SlowStart(), 0.005, cold, clock)
    assert cold.report().wait_seconds == pytest.approx(0.1, abs=1e-9)


def test_profile_context_accumulates_epochs_and_survives_break():
    loader = SleepyLoader(steps=6, delay=0.001)
    with profile(loader, warmup=0) as prof:
        for _epoch in range(2):
            for _ in prof:
                time.sleep(0.001)
        for i, _ in enumerate(prof):
            if i == 2:
                break
    rep = prof.report()
    # 2 full epochs (6 steps each) + 3 batches of which the last step never ended.
    assert rep.steps == 6 + 6 + 2
    assert rep.samples == rep.steps * BATCH or rep.samples == (rep.steps + 1) * BATCH
    with pytest.raises(TypeError):
        iter(StallMeter())


def test_report_reset_starts_a_new_window_and_summary_is_one_line():
    meter = StallMeter(warmup=0)
    it = meter.wrap(SleepyLoader(steps=12, delay=0.001))
    reports = []
    for i, _ in enumerate(it):
        time.sleep(0.001)
        if i % 4 == 3:
            reports.append(meter.report(reset=True))
    assert len(reports) == 3
    # Each window holds the steps that ended since the previous report.
    assert [r.steps for r in reports] == [3, 4, 4]
    assert all("\n" not in r.summary() for r in reports)
    assert "verdict" in str(reports[0])
    d = reports[0].to_dict()
    assert d["verdict"] == reports[0].verdict and "cpu_util_fraction" in d


def test_loader_stats_are_reported_as_window_deltas():
    @dataclasses.dataclass
    class Stats:
        images_per_s: float
        read_seconds: float
        decode_seconds: float
        failures: int

    class StatLoader(SleepyLoader):
        def stats(self) -> Stats:
            n = len(self.slept)
            return Stats(images_per_s=123.0, read_seconds=0.5 + n, decode_seconds=2.0 * n, failures=0)

    loader = StatLoader(steps=5, delay=0.001)
    meter = StallMeter(warmup=0)
    run(loader, 0.001, meter)
    st = meter.report().loader_stages
    assert st == {"images_per_s": 123.0, "read_seconds": 5.0, "decode_seconds": 10.0, "failures": 0.0}


def _rep(**kw) -> StallReport:
    base = dict(
        steps=10, samples=80, wall_seconds=1.0, wait_seconds=0.5, step_seconds=0.5, data_wait_fraction=0.5,
        host_wait_fraction=0.5, images_per_s=80.0, wait_ms_p50=50.0, wait_ms_p95=60.0, step_ms_p50=50.0,
        timing="host", gpu_util_percent=None, gpu_util_source=None, cpu_cores_used=0.5, cpu_cores_available=2,
        loader_stages=None, verdict="input-bound", next_action="",
    )
    base.update(kw)
    return StallReport(**base)


def test_next_action_follows_the_bottleneck():
    reads = _rep(loader_stages={"read_seconds": 4.0, "decode_seconds": 5.0})
    assert "RAMCache" in next_action(reads, is_fastdata=True)
    busy = _rep(cpu_cores_used=1.95, loader_stages={"read_seconds": 0.1, "decode_seconds": 5.0})
    advice = next_action(busy, is_fastdata=True)
    assert "saturated" in advice and "fastdata-convert" in advice and "hybrid" not in advice  # no CUDA step timed
    on_cuda = dataclasses.replace(busy, timing="cuda-events")
    assert "backend='hybrid'" in next_action(on_cuda, is_fastdata=True)
    assert "backend='hybrid'" in next_action(dataclasses.replace(busy, timing="cuda-sync"), is_fastdata=True)
    # keeping up barely (balanced), the CPU busy: no GPU rows offered
    balanced = dataclasses.replace(on_cuda, verdict="balanced", data_wait_fraction=0.1, wait_ms_p95=60.0)
    advice = next_action(balanced, is_fastdata=True)
    assert "saturated" in advice and "hybrid" not in advice
    # already decoding part of each batch on the GPU: not offered again
    splitting = dataclasses.replace(on_cuda, loader_stages={"read_seconds": 0.1, "decode_seconds": 5.0, "gpu_rows": 900.0})
    advice = next_action(splitting, is_fastdata=True)
    assert "saturated" in advice and "hybrid" not in advice
    idle = _rep(cpu_cores_used=0.6, loader_stages={"read_seconds": 0.1, "decode_seconds": 5.0, "threads": 1})
    assert "threads" in next_action(idle, is_fastdata=True)
    assert "fastdata.Loader" in next_action(_rep(cpu_cores_used=1.9), is_fastdata=False)
    hostbound = _rep(verdict="compute-bound", data_wait_fraction=0.01, gpu_util_percent=40.0)
    assert "host-bound" in next_action(hostbound, is_fastdata=False)


def test_classify_thresholds():
    assert classify(0.0) == "compute-bound"
    assert classify(0.10) == "balanced"
    assert classify(0.5) == "input-bound"


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        StallMeter(cuda_timing="maybe")
    with pytest.raises(ValueError):
        StallMeter(batch_size=0)
    with pytest.raises(ValueError):
        StallMeter(warmup=-1)


def test_exported_from_package():
    # fastdata/__init__.py exports them from the stall meter's module (a module named
    # fastdata.profile would shadow the function fastdata.profile)
    assert fastdata.StallMeter is StallMeter
    assert fastdata.profile is profile


def test_meter_work_per_step_is_a_few_clock_reads(monkeypatch):
    """The meter's own cost per step is constant and small: a fixed number of clock reads,
    the same for 1,000 and 2,000 steps and for any batch contents (its speed, ~µs per step,
    is a benchmark's business, not a test's)."""
    import fastdata.diagnostics.stall as stall_module

    reads = [0]

    def counting_clock() -> float:
        reads[0] += 1
        return 1000.0 + reads[0] * 1e-3

    monkeypatch.setattr(stall_module, "time", types.SimpleNamespace(perf_counter=counting_clock))

    def clock_reads(steps: int, batch) -> int:
        reads[0] = 0
        meter = StallMeter(warmup=0, gpu_util=False)
        for _ in meter.wrap([batch] * steps):
            pass
        meter.report()
        return reads[0]

    small = (np.zeros((2, 3), np.uint8), np.zeros(2, np.int64))
    big = (np.zeros((256, 3, 64, 64), np.uint8), np.zeros(256, np.int64))
    per_step = (clock_reads(2000, small) - clock_reads(1000, small)) / 1000
    assert per_step == int(per_step) and 1 <= per_step <= 3, per_step
    assert clock_reads(1000, big) == clock_reads(1000, small)


def test_stage_is_free_when_nobody_listens_and_recorded_by_the_profiler():
    torch = pytest.importorskip("torch")
    assert tracing.stage("fastdata.decode") is tracing.stage("fastdata.read")  # the shared no-op
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with tracing.stage("fastdata.decode"):
            torch.ones(4).add_(1)
        meter = StallMeter(warmup=0)
        for _ in meter.wrap([1, 2]):
            pass
    names = {e.name for e in prof.events()}
    assert "fastdata.decode" in names
    assert "fastdata.wait" in names


class VirtualClock:
    """Host time that advances only when the test says so: scheduling noise on a loaded CI
    machine cannot move the result (a real sleep of 5 ms took 18 ms there once)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class VirtualLoader:
    """Produces a batch ``delay`` virtual seconds after it is asked for (no prefetch)."""

    def __init__(self, clock: VirtualClock, steps: int, delay: float):
        self.clock, self.steps, self.delay = clock, steps, delay

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        for i in range(self.steps):
            self.clock.sleep(self.delay)
            yield np.full((BATCH, 3), i, np.float32), np.arange(BATCH)


class FakeGpu:
    """A stream clock: enqueued work runs after earlier work and not before it was enqueued.

    Stands in for CUDA so the event-pairing logic is checked on a CPU-only machine; the real
    thing runs in tests/gpu/test_train_example_gpu.py.
    """

    def __init__(self, clock: VirtualClock) -> None:
        self.host = clock
        self.clock = clock.now()  # when the stream becomes free (host seconds)

    def enqueue(self, seconds: float) -> None:
        self.clock = max(self.clock, self.host.now()) + seconds

    def event_class(self):
        gpu = self

        class FakeEvent:
            def __init__(self, enable_timing: bool = False):
                self.t = None

            def record(self) -> None:
                gpu.clock = max(gpu.clock, gpu.host.now())
                self.t = gpu.clock

            def query(self) -> bool:
                return gpu.host.now() >= self.t

            def synchronize(self) -> None:
                gpu.host.sleep(max(0.0, self.t - gpu.host.now()))

            def elapsed_time(self, end) -> float:
                return 1e3 * (end.t - self.t)

        return FakeEvent


@pytest.mark.parametrize("loader_ms,kernel_ms,truth,verdict", [(20, 5, 15 / 20, "input-bound"), (5, 20, 0.0, "compute-bound")])
def test_cuda_event_timing_sees_through_asynchronous_steps(monkeypatch, loader_ms, kernel_ms, truth, verdict):
    torch = pytest.importorskip("torch")
    import fastdata.diagnostics.stall as stall_module

    clock = VirtualClock()
    gpu = FakeGpu(clock)
    monkeypatch.setattr(stall_module, "time", types.SimpleNamespace(perf_counter=clock.now))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", gpu.event_class())
    meter = StallMeter(warmup=2, cuda_timing="events", gpu_util=False)
    for _ in meter.wrap(VirtualLoader(clock, steps=25, delay=loader_ms / 1e3)):
        gpu.enqueue(kernel_ms / 1e3)  # the step returns at once; the "GPU" works on
    rep = meter.report()
    assert rep.timing == "cuda-events"
    assert rep.host_wait_fraction > 0.9  # host clocks alone would call both loops input-bound
    # 23 steps in the window but 22 gaps (the first step has no previous end): 330/445 ms.
    assert abs(rep.data_wait_fraction - truth) < 0.01, rep.data_wait_fraction
    assert rep.verdict == verdict


def _loop_with_gil_hog(meter: StallMeter, hog: bool) -> StallReport:
    """40 steps that each release the GIL for 5 ms (as a CUDA sync or a blocking copy does),
    beside a pure-Python thread that holds the GIL between switch intervals, or alone."""
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    hog_thread = threading.Thread(target=spin, daemon=True)
    if hog:
        hog_thread.start()
    try:
        for _ in meter.wrap(range(40)):
            time.sleep(0.005)
    finally:
        stop.set()
        if hog:
            hog_thread.join()
    return meter.report()


def test_gil_probe_sees_a_python_thread_holding_the_gil() -> None:
    quiet = _loop_with_gil_hog(StallMeter(warmup=0, gpu_util=False, gil_probe=True), hog=False)
    busy = _loop_with_gil_hog(StallMeter(warmup=0, gpu_util=False, gil_probe=True), hog=True)
    # Beside the spinning thread the probe waits for a switch interval (5 ms) at most wakeups;
    # alone it wakes within the OS's latency.
    assert busy.gil_late_fraction > 0.5 and busy.gil_wait_ms_p50 >= 1.0, busy
    assert quiet.gil_wait_ms_p50 < busy.gil_wait_ms_p50 / 2, (quiet, busy)
    assert quiet.gil_late_fraction < busy.gil_late_fraction
    assert "GIL (held by any thread)" in str(busy)
    off = _loop_with_gil_hog(StallMeter(warmup=0, gpu_util=False), hog=False)
    assert off.gil_wait_ms_p50 is None and off.gil_late_fraction is None and "GIL" not in str(off)
    assert not any(t.name == "fastdata-gil-probe" for t in threading.enumerate())  # stopped with the loop


def test_gil_probe_counts_the_loops_own_python_too() -> None:
    # The probe cannot tell whose Python holds the GIL: a loop that computes in Python shows
    # as a busy GIL on its own (hence "compare with the same loop on synthetic data").
    meter = StallMeter(warmup=0, gpu_util=False, gil_probe=True)
    for _ in meter.wrap(range(20)):
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:  # 10 ms of pure Python per step, no other thread
            pass
    rep = meter.report()
    assert rep.gil_late_fraction > 0.5 and rep.gil_wait_ms_p50 >= 1.0, rep
