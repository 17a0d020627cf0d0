"""fastdata.cli.bench_runner computes its statistic as documented: timed images / timed seconds,
pooled over rounds as a ratio of sums, with window rates as the spread only.

A fake contender advances a fake clock by known per-batch times, so every number below is
computed by hand, not read off a wall clock.
"""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Iterator, List, Sequence

import pytest

from fastdata.cli import bench_runner


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeUsage:
    """CPU seconds read at the start and end of the timed span."""

    def __init__(self, readings: Sequence[float]) -> None:
        self.readings = list(readings)
        self.peak_rss = 3 * 2**20
        self.stopped = False

    def cpu_seconds(self) -> float:
        return self.readings.pop(0)

    def stop(self) -> None:
        self.stopped = True


class FakeContender:
    """Batch k takes ``durations[k]`` seconds of the fake clock and holds ``size`` images."""

    name, label = "fake", "a fake contender"

    def __init__(self, clock: FakeClock, durations: Sequence[float], size: int = 8, fail_at: int = -1) -> None:
        self.clock, self.durations, self.size, self.fail_at = clock, list(durations), size, fail_at
        self.detail = {"kind": "fake"}
        self.closed = False

    def batches(self, job) -> Iterator:
        try:
            for k, d in enumerate(self.durations):
                self.clock.now += d
                if k == self.fail_at:
                    raise RuntimeError("decoder fell over")
                yield SimpleNamespace(shape=(self.size, 3, 4, 4)), None
            raise AssertionError("the runner asked for more batches than the test planned")
        finally:
            self.closed = True


JOB = SimpleNamespace(device="cpu")
# Warm-up: 2 batches of 1 s (budget 10: at least 2 batches and 2 s). Timed: eight batches of
# 0.5 s, then one of 4 s, which ends the budget (2 + 4 + 4 = 10 s after the start).
WARM = [1.0, 1.0]
TIMED = [0.5] * 8 + [4.0]


def run(durations: Sequence[float], budget: float = 10.0, cpu=(50.0, 54.0), step: float = 0.0, size: int = 8,
        fail_at: int = -1):
    clock = FakeClock()
    usage = FakeUsage(cpu)
    contender = FakeContender(clock, durations, size=size, fail_at=fail_at)
    r = bench_runner.measure(contender, JOB, budget, clock=clock, sleep=clock.sleep, usage_factory=lambda: usage,
                             step_seconds=step)
    assert contender.closed and usage.stopped  # the loader and the sampler are shut down
    return r


def test_statistic_is_timed_images_over_timed_seconds():
    r = run(WARM + TIMED)
    assert r["status"] == "ok"
    assert (r["warmup_batches"], r["timed_batches"], r["timed_images"]) == (2, 9, 72)
    assert r["first_batch_seconds"] == pytest.approx(1.0)
    assert r["timed_seconds"] == pytest.approx(8.0)
    assert r["images_per_s"] == pytest.approx(72 / 8.0)  # 9 img/s: the slow batch counts in full
    assert r["mean_images_per_s"] == r["images_per_s"]
    # Spread: 5 windows of 2, 2, 1, 2, 2 batches; the median of them (16) is NOT the statistic.
    assert r["window_rates"] == pytest.approx([16.0, 16.0, 16.0, 16.0, 16 / 4.5])
    assert r["spread"]["min"] == pytest.approx(16 / 4.5) and r["spread"]["max"] == pytest.approx(16.0)
    assert r["spread"]["min"] <= r["images_per_s"] <= r["spread"]["max"]
    assert r["round_rates"] == pytest.approx([9.0])
    # CPU: 4 s over the 8 timed seconds; every batch was waited for in full (no step).
    assert r["cpu_cores_busy"] == pytest.approx(0.5)
    assert r["wait_fraction"] == pytest.approx(1.0) and r["wait_ms_p50"] == pytest.approx(500.0)
    assert r["peak_rss_mb"] == pytest.approx(3.0) and r["detail"] == {"kind": "fake"}
    assert r["total_seconds"] == pytest.approx(10.0)


def test_a_simulated_step_counts_in_the_span_not_in_the_wait():
    # Warm-up 2 x 1 s; then 0.5 s per batch + a 0.5 s step: one batch per second.
    r = run(WARM + [0.5] * 8, budget=10.0, step=0.5)
    assert r["timed_batches"] == 8
    assert r["images_per_s"] == pytest.approx(8.0 * 8 / 7.5)  # 8 batches, last arrival at 7.5 s
    assert r["wait_ms_p50"] == pytest.approx(500.0)
    assert r["wait_fraction"] == pytest.approx(8 * 0.5 / 7.5)


def test_a_start_up_longer_than_the_share_still_gets_a_timed_window():
    # The first batch arrives 12 s into a 10 s budget (a pipeline compile): warm-up ends there,
    # and the run is timed for 40% of the budget (4 s: eight batches of 0.5 s), not two batches.
    r = run([12.0] + [0.5] * 8, budget=10.0)
    assert (r["warmup_batches"], r["timed_batches"]) == (1, 8)
    assert r["timed_seconds"] == pytest.approx(4.0)
    assert r["images_per_s"] == pytest.approx(8 * 8 / 4.0)
    assert r["total_seconds"] == pytest.approx(16.0)


def test_rounds_pool_as_a_ratio_of_sums():
    a = run(WARM + TIMED)  # 72 images in 8 s
    b = run(WARM + [0.25] * 16, budget=6.0, size=4, cpu=(0.0, 1.0))  # 16 x 4 = 64 images in 4 s
    assert b["images_per_s"] == pytest.approx(16.0) and b["timed_seconds"] == pytest.approx(4.0)
    pooled = bench_runner.pool([a, b])
    assert pooled["status"] == "ok"
    assert (pooled["timed_images"], pooled["timed_batches"]) == (136, 25)
    assert pooled["images_per_s"] == pytest.approx(136 / 12.0)  # every second weighs the same
    assert pooled["images_per_s"] != pytest.approx((9.0 + 16.0) / 2)  # not a mean of the rounds' rates
    assert pooled["round_rates"] == pytest.approx([9.0, 16.0])
    assert pooled["window_rates"] == pytest.approx(a["window_rates"] + b["window_rates"])
    assert pooled["cpu_cores_busy"] == pytest.approx((4.0 + 1.0) / 12.0)
    assert "waits" not in pooled  # per-batch waits are summarised, not written out
    one = bench_runner.pool([a])
    assert one["images_per_s"] == pytest.approx(9.0) and "waits" not in one


def test_a_failing_contender_is_reported_and_fails_the_pool():
    bad = run(WARM + TIMED, fail_at=4)
    assert bad["status"] == "failed" and bad["reason"] == "RuntimeError: decoder fell over"
    for during_warm_up in (0, 1):  # failing before the timed window is reported the same way
        early = run(WARM + TIMED, fail_at=during_warm_up)
        assert early["status"] == "failed" and early["reason"] == "RuntimeError: decoder fell over"
    good = run(WARM + TIMED)
    assert bench_runner.pool([good, bad])["status"] == "failed"


def test_windows_partition_the_span():
    times: List[float] = [0.1 * (k + 1) for k in range(10)] + [2.0]
    rates = bench_runner.windows(times, [4] * 11, 0.0)
    assert len(rates) == bench_runner.MAX_WINDOWS
    assert rates[:4] == pytest.approx([40.0] * 4) and rates[4] == pytest.approx(8 / 1.1)


def test_thread_cpu_seconds_names_python_and_native_threads():
    """fastdata-bench's per-thread CPU: a busy Python thread counts under its name (pool
    suffix dropped), the decode engine's native threads under their OS name."""
    import threading

    import numpy as np

    import fastdata
    from fastdata.cli.demo import photo_like_jpeg
    from fastdata.io.host import thread_cpu_seconds
    from fastdata.loader.pipeline import make_backend

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin, name="busy-worker_3")
    busy.start()
    try:
        time.sleep(0.4)
        datas = [np.frombuffer(photo_like_jpeg(0, i, 400, 300), np.uint8) for i in range(32)]
        with make_backend("native", fastdata.RandomResizedCrop(64), device="cpu", dtype=None, threads=2) as p:
            p.run(datas, np.arange(len(datas)), 0)
            seconds = thread_cpu_seconds()  # while the engine's threads are alive
    finally:
        stop.set()
        busy.join()
    assert seconds.get("py:busy-worker", 0.0) > 0.05  # "_3" dropped: one entry per pool
    assert "fastdata-native" in seconds  # the engine's second thread, named by the C++ pool (its time may round to 0)


def test_thread_minor_faults_counts_fresh_pages_touched_by_each_thread():
    """fastdata-bench's per-thread minor page faults: a thread that writes one byte in each page
    of 32 MiB of fresh anonymous memory (huge pages refused, so that each 4 KiB page is its own
    fault) faults at least once per page, under its own label; an idle thread beside it does not."""
    import mmap
    import threading

    from fastdata.io.host import thread_minor_faults

    page = mmap.PAGESIZE
    pages = (32 << 20) // page
    go, done, idle_stop = threading.Event(), threading.Event(), threading.Event()

    def toucher() -> None:
        go.wait()
        fresh = mmap.mmap(-1, pages * page)
        fresh.madvise(mmap.MADV_NOHUGEPAGE)
        for k in range(pages):
            fresh[k * page] = 1
        done.set()
        idle_stop.wait()  # alive while the counts are read
        fresh.close()

    threads = [threading.Thread(target=toucher, name="page-toucher_0"),
               threading.Thread(target=idle_stop.wait, name="page-idler_0")]
    for t in threads:
        t.start()
    try:
        before = thread_minor_faults()
        go.set()
        assert done.wait(30)
        after = thread_minor_faults()
    finally:
        go.set()
        idle_stop.set()
        for t in threads:
            t.join()
    touched = after["py:page-toucher"] - before.get("py:page-toucher", 0)
    assert touched >= pages, (touched, pages)
    assert after.get("py:page-idler", 0) - before.get("py:page-idler", 0) < 64


def test_thread_runqueue_seconds_is_time_runnable_without_a_core():
    """fastdata-bench's per-thread run-queue wait: more busy threads than cores wait, per CPU
    second, at least half a second more than one busy thread does (hashlib hashes with the GIL
    released, so they compete for cores, not for the GIL)."""
    import hashlib
    import threading

    from fastdata.io.host import thread_cpu_seconds, thread_runqueue_seconds, usable_cores

    data = bytes(4 << 20)

    def busy(go: threading.Event, seconds: float) -> None:
        go.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            hashlib.sha256(data).digest()

    def cpu_and_wait(n: int, name: str):
        go = threading.Event()
        threads = [threading.Thread(target=busy, args=(go, 1.5), name=f"{name}_{k}") for k in range(n)]
        for t in threads:
            t.start()
        try:
            cpu0, wait0 = thread_cpu_seconds(), thread_runqueue_seconds()  # all alive, all blocked
            go.set()
            time.sleep(1.0)
            cpu1, wait1 = thread_cpu_seconds(), thread_runqueue_seconds()  # all alive, all busy
        finally:
            go.set()
            for t in threads:
                t.join()
        label = "py:" + name
        return cpu1[label] - cpu0.get(label, 0.0), wait1[label] - wait0.get(label, 0.0)

    if not thread_runqueue_seconds():
        pytest.skip("this kernel keeps no run-queue figures (/proc/self/schedstat)")
    one_cpu, one_wait = cpu_and_wait(1, "one-hasher")
    many_cpu, many_wait = cpu_and_wait(2 * usable_cores() + 1, "many-hashers")
    # Other work on the box makes both wait more; more hashers than cores always add at least
    # (threads - cores) / cores = 1 + 1/cores of waiting per CPU second to what one hasher sees.
    assert one_cpu > 0.05 and many_cpu > 0.05, (one_cpu, many_cpu)
    assert many_wait / many_cpu > one_wait / one_cpu + 0.5, (one_cpu, one_wait, many_cpu, many_wait)


class SlowFakeContender(FakeContender):
    """FakeContender whose batches also take 20 ms of real time (the JPEG sampler's thread
    runs on the real clock)."""

    def batches(self, job) -> Iterator:
        for item in super().batches(job):
            time.sleep(0.02)
            yield item


def test_jpeg_engines_are_sampled_through_the_timed_window_on_cuda_only(monkeypatch):
    monkeypatch.setattr(bench_runner, "device_sync", lambda device: (lambda: None))  # no CUDA here
    monkeypatch.setattr(bench_runner, "JPEG_SAMPLE_PERIOD_S", 0.002)
    reads = {"cpu": [], "cuda:0": [], "failing": []}
    results = {}
    for device in reads:
        clock = FakeClock()  # warm-up is its first 2 s: 100..102

        def reader(device=device, clock=clock) -> float:
            reads[device].append(clock.now)
            return 40.0

        contender = SlowFakeContender(clock, WARM + TIMED, fail_at=5 if device == "failing" else -1)
        results[device] = bench_runner.measure(contender, SimpleNamespace(device=device.replace("failing", "cuda")),
                                               10.0, clock=clock, sleep=clock.sleep,
                                               usage_factory=lambda: FakeUsage((50.0, 54.0)),
                                               jpeg_reader=lambda reader=reader: (reader, "fake"))
        assert "fastdata-bench-jpeg" not in [t.name for t in threading.enumerate()]  # stopped, also after a failure
    assert not reads["cpu"] and results["cpu"]["jpeg_engines_busy_percent"] is None  # never read off CUDA
    assert reads["cuda:0"] and min(reads["cuda:0"]) >= 102.0  # the timed window only, not the warm-up
    assert results["cuda:0"]["jpeg_engines_busy_percent"] == pytest.approx(40.0)
    assert results["failing"]["status"] == "failed"
    # rounds pool as a mean weighted by timed seconds, skipping rounds without the counter
    rounds = [dict(results["cuda:0"], timed_seconds=t, jpeg_engines_busy_percent=b, waits=[0.1])
              for t, b in ((3.0, 30.0), (1.0, 70.0), (5.0, None))]
    assert bench_runner.pool(rounds)["jpeg_engines_busy_percent"] == pytest.approx(40.0)


def test_calling_thread_cpu_splits_the_kernels_part_from_user_code():
    """Reading /dev/zero in large blocks is nearly all kernel time (the kernel zeroes the
    buffer), hashing in Python nearly all user time: the split must tell them apart."""
    import hashlib

    from fastdata.io.host import THREAD_CPU_SPLIT, calling_thread_cpu

    if not THREAD_CPU_SPLIT or not os.path.exists("/dev/zero"):
        pytest.skip("no per-thread user/system split (getrusage RUSAGE_THREAD), or no /dev/zero")

    def measure(work):
        # 0.3 s of CPU, however busy the machine (10 s of wall at most), on a fresh thread: the
        # kernel scales a thread's tick-sampled split to its whole history, so on a busy machine
        # (ticks undercounting the thread's run time) a window's difference on this long-lived
        # thread was skewed by pytest's own work before it (0.12-0.92 kernel share for the
        # /dev/zero reads beside three busy loops on the 2-core box; 0.98-1.00 on fresh threads)
        def run():
            try:
                cpu0, sys0 = calling_thread_cpu()
                end = time.perf_counter() + 10.0
                while time.thread_time() - cpu0 < 0.3 and time.perf_counter() < end:
                    work()
                cpu1, sys1 = calling_thread_cpu()
                result.extend((cpu1 - cpu0, sys1 - sys0))
            except BaseException as e:  # raised below, in the test's own thread
                result.append(e)

        result = []
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        if isinstance(result[0], BaseException):
            raise result[0]
        return tuple(result)

    fd = os.open("/dev/zero", os.O_RDONLY)
    buffer = bytearray(8 << 20)
    try:
        kernel_cpu, kernel_sys = measure(lambda: os.readv(fd, [buffer]))
    finally:
        os.close(fd)
    data = bytes(1 << 20)
    user_cpu, user_sys = measure(lambda: hashlib.sha256(data).digest())
    assert kernel_cpu >= 0.3 and user_cpu >= 0.3, (kernel_cpu, user_cpu)
    assert kernel_sys / kernel_cpu > 0.6, (kernel_sys, kernel_cpu)
    assert user_sys / user_cpu < 0.2, (user_sys, user_cpu)


def test_gpu_side_line_says_where_a_gpu_decoders_time_goes():
    from fastdata.cli import bench_report

    hybrid = {"name": "fastdata-hybrid", "label": "hybrid", "status": "ok", "images_per_s": 20000.0,
              "timed_seconds": 10.0,
              "detail": {"gpu_rows": 120000, "native_rows": 80000, "gpu_share": 0.6, "native_busy_in_runs": 0.834,
                         "gpu_stage_seconds": {"decode": 9.0, "decode_cpu": 6.0, "resample": 4.0, "gpu_wait": 0.1}},
              "thread_cpu_seconds": {"py:fastdata-gpu-decode": 7.0, "py:fastdata-gpu-resample": 2.0,
                                     "[NVIMGCODEC][TP": 1.0, "fastdata-native": 100.0, "fastdata-inline": 8.0,
                                     "py:fastdata-loader": 3.0},
              "thread_runqueue_seconds": {"py:fastdata-gpu-decode": 3.0, "[NVIMGCODEC][TP": 1.0,
                                          "fastdata-native": 50.0, "py:fastdata-loader": 9.0}}
    native = {"name": "fastdata", "label": "native", "status": "ok", "images_per_s": 9000.0, "detail": {}}
    lines = bench_report.gpu_side_lines({"results": [native, hybrid]})
    # 12,000 GPU rows/s at 75 us of stage wall per row: 90% busy; feeders 4 of 10 CPU-s waiting
    assert lines == ["hybrid: GPU side 12,000 rows/s; its decode calls 75 us of wall and 50 us of CPU per row, "
                     "the stage busy 90%; its threads waited for a core 40% of their CPU time; "
                     "native decode threads 10.0 cores, busy 83% within their runs, 5.0 threads runnable but "
                     "waiting for a core; planning threads 0.8 cores"]
    # under 5% of the window's thread-seconds waiting is left out (it would print as 0.0)
    hybrid["thread_runqueue_seconds"]["fastdata-native"] = 0.4
    assert "waiting for a core; planning" not in bench_report.gpu_side_lines({"results": [hybrid]})[0]
    hybrid["thread_runqueue_seconds"]["fastdata-native"] = 50.0
    # the planning threads' minor page faults per row they read (bench_runner's thread_minor_faults)
    hybrid["thread_minor_faults"] = {"fastdata-inline": 36000.0, "fastdata-native": 5.0}
    hybrid["detail"]["rows_read_to_route"] = 120000
    assert bench_report.gpu_side_lines({"results": [hybrid]})[0].endswith(
        "planning threads 0.8 cores (0.3 minor page faults per row read)")
    del hybrid["thread_minor_faults"], hybrid["detail"]["rows_read_to_route"]
    # the whole process's cores out of the machine's usable ones (the report's machine info)
    hybrid["cpu_cores_busy"] = 13.26
    assert bench_report.gpu_side_lines({"machine": {"cores_usable": 16}, "results": [hybrid]})[0].endswith(
        "planning threads 0.8 cores; the process 13.3 of 16 cores busy")
    del hybrid["cpu_cores_busy"]
    hybrid["thread_runqueue_seconds"] = None  # not kept by the kernel (or an older result): left out, not 0%
    hybrid["detail"]["gpu_stage_seconds"]["decode"] = 12.0  # 100 us per row at 12,000 rows/s: capped
    del hybrid["thread_cpu_seconds"]["fastdata-native"]  # gpu-only: no native decode threads busy
    assert bench_report.gpu_side_lines({"results": [hybrid]}) == [
        "hybrid: GPU side 12,000 rows/s; its decode calls 100 us of wall and 50 us of CPU per row, "
        "the stage busy 100%; planning threads 0.8 cores"]
    hybrid["detail"]["gpu_decode_lanes"] = 2  # two lanes decode at once: each is busy half the summed wall
    assert bench_report.gpu_side_lines({"results": [hybrid]}) == [
        "hybrid: GPU side 12,000 rows/s; its decode calls 100 us of wall and 50 us of CPU per row, "
        "the stage busy 60% (each of 2 lanes); planning threads 0.8 cores"]
    hybrid["detail"]["split_from_waits"] = {"share": 0.683, "up": 40, "down": 38}  # SplitBalancer.moves
    assert bench_report.gpu_side_lines({"results": [hybrid]})[0].endswith(
        "planning threads 0.8 cores; the split from the waits ended at 68% after 40 moves up and 38 down")
    # with the rates' share beside it, and the moves up that started from it (SplitBalancer.lifts)
    hybrid["detail"]["split_from_waits"].update(rates=0.652, lifts=3)
    assert bench_report.gpu_side_lines({"results": [hybrid]})[0].endswith(
        "planning threads 0.8 cores; the split from the waits ended at 68% (the rates' 65%) after 40 moves up "
        "(3 from the rates' share) and 38 down")
    del hybrid["detail"]["split_from_waits"]
    # the kernel's part of the calls' CPU (NvImageCodecDecoder.stage_seconds["decode_sys"])
    hybrid["detail"]["gpu_stage_seconds"]["decode_sys"] = 1.5
    assert bench_report.gpu_side_lines({"results": [hybrid]})[0].startswith(
        "hybrid: GPU side 12,000 rows/s; its decode calls 100 us of wall and 50 us of CPU per row "
        "(25% of it in the kernel), the stage busy 60% (each of 2 lanes)")
    del hybrid["detail"]["gpu_stage_seconds"]["decode_sys"]
    # making the decoder's nvImageCodec decoders, once per Loader (NvImageCodecDecoder.creation_seconds)
    hybrid["detail"]["gpu_decoder_creation"] = {"wall": 16.48, "instance_create": 16.3, "decoder_create": 0.12,
                                                "decoders": 16, "instances": 16}
    assert bench_report.gpu_side_lines({"results": [hybrid]})[0].endswith(
        "planning threads 0.8 cores; making its nvImageCodec decoders took 16.5 s (16 decoders on 16 instances: "
        "16.3 s making instances, 0.1 s the decoders)")
    hybrid["detail"]["gpu_decoder_creation"].update(wall=1.2, instance_create=1.03, instances=1)  # one shared
    assert bench_report.gpu_side_lines({"results": [hybrid]})[0].endswith(
        "making its nvImageCodec decoders took 1.2 s (16 decoders on 1 instance: 1.0 s making instances, "
        "0.1 s the decoders)")


def test_jpeg_engines_line_lists_the_contenders_measured_with_the_counter():
    from fastdata.cli import bench_report

    def ok(label, busy):
        return {"label": label, "status": "ok", "jpeg_engines_busy_percent": busy}

    results = [ok("native", None), ok("gpu", 93.4), {"label": "dali", "status": "skipped"}, ok("hybrid", 61.0)]
    assert bench_report.jpeg_engines_line({"results": results}) == \
        "JPEG engines busy (NVML, timed window): gpu 93%, hybrid 61%"
    assert bench_report.jpeg_engines_line({"results": results[:1]}) is None  # a CPU run says nothing


def test_ceiling_line_puts_gpu_against_the_engines():
    from fastdata.cli import bench_report

    def ok(name, rate, cores=1.0, detail=None):
        return {"name": name, "status": "ok", "images_per_s": rate, "cpu_cores_busy": cores, "detail": detail or {}}

    report = {"results": [ok("fastdata", 10000.0), ok("fastdata-gpu", 12000.0, 2.25),
                          ok("fastdata-hybrid", 15400.0, detail={"gpu_share": 0.6}), ok("engines", 15000.0)]}
    line = bench_report.ceiling_line(report)
    assert line == ("ceiling (native + gpu, same run): 22,000 img/s; hybrid 70% of it, GPU share 60%; "
                    "gpu 0.80x the engines' decode-only rate at 2.2 cores")
    # A mixed set: 15% of gpu's rows went to its native threads, which the engines' rate leaves out.
    report["results"][1]["detail"] = {"gpu_share": 0.85}
    assert bench_report.ceiling_line(report).endswith(
        "gpu 0.80x the engines' decode-only rate at 2.2 cores (its GPU rows alone 0.68x, 15% of its rows native)")
    report["results"] = report["results"][:2]
    assert bench_report.ceiling_line(report) == "ceiling (native + gpu, same run): 22,000 img/s"


def test_ceiling_line_adds_the_cpu_budget_ceiling():
    """The sum counts both sides with the whole CPU: the CPU-budget ceiling gives native only
    the cores the gpu contender leaves, at native's own rate per busy core."""
    from fastdata.cli import bench_report

    def ok(name, rate, cores, detail=None):
        return {"name": name, "status": "ok", "images_per_s": rate, "cpu_cores_busy": cores, "detail": detail or {}}

    # The twentieth session's H100 run: native 17,281 at 15.9 cores, gpu 23,265 at 2.9, hybrid 34,020.
    report = {"machine": {"cores_usable": 16},
              "results": [ok("fastdata", 17281.0, 15.9), ok("fastdata-gpu", 23265.0, 2.9),
                          ok("fastdata-hybrid", 34020.0, 14.4, {"gpu_share": 0.63})]}
    budget = 23265.0 + 17281.0 / 15.9 * (16 - 2.9)  # 37,503
    assert bench_report.ceiling_line(report) == (
        "ceiling (native + gpu, same run): 40,546 img/s; hybrid 84% of it, GPU share 63%; "
        "CPU-budget ceiling (gpu + native at its full-load rate per core on the 13.1 of 16 cores gpu leaves; "
        f"a low estimate): {budget:,.0f} img/s, "
        f"hybrid {34020.0 / budget:.0%} of it")
    assert f"{budget:,.0f}" == "37,503" and f"{34020.0 / budget:.0%}" == "91%"
    # With the native threads' CPU time (fastdata-bench's per-thread figures): their rows per
    # second of it, hybrid's against native alone's. The thirty-second session's H100 run
    # (waits_ceiling.json, waits_3_True.json): 16,642 img/s on 254.03 native CPU-s in 15.998 s;
    # hybrid 28,862 at a GPU share of 71.8% on 165.58 native CPU-s in 16.001 s.
    report["results"][0].update(images_per_s=16642.0, timed_seconds=15.998,
                                thread_cpu_seconds={"fastdata-native": 254.03, "py:fastdata-loader": 0.79})
    # Its rows: 346,979 on the GPU, 136,349 native, none handed back.
    report["results"][2].update(images_per_s=28862.0, timed_seconds=16.001,
                                detail={"gpu_share": 0.718, "gpu_rows": 346979, "native_rows": 136349,
                                        "gpu_rejected": 0},
                                thread_cpu_seconds={"fastdata-native": 165.58, "fastdata-inline": 13.56})
    own = 136349 / (346979 + 136349)
    alone, beside = 16642.0 * 15.998 / 254.03, 28862.0 * own * 16.001 / 165.58
    assert bench_report.ceiling_line(report).endswith(
        f"; hybrid's native threads about {beside:,.0f} rows per core-second, native alone's {alone:,.0f}")
    assert (f"{beside:,.0f}", f"{alone:,.0f}") == ("787", "1,048")
    # Rows the GPU handed back are the inline engine's to decode, not the native threads'.
    report["results"][2]["detail"]["gpu_rejected"] = 36349
    assert f"native threads about {28862.0 * 100000 / 483328 * 16.001 / 165.58:,.0f} rows per core-second" in \
        bench_report.ceiling_line(report)
    del report["results"][2]["detail"]["gpu_rows"]  # no row counts (a decoder without them): no such clause
    assert "rows per core-second" not in bench_report.ceiling_line(report)
    report["results"][2]["detail"]["gpu_rows"] = 346979
    del report["results"][2]["thread_cpu_seconds"]  # no per-thread figures (not Linux): no such clause
    assert "rows per core-second" not in bench_report.ceiling_line(report)
    # A gpu contender busier than the machine leaves native nothing: the ceiling is the gpu's rate.
    report["results"][1]["cpu_cores_busy"] = 17.0
    assert "on the 0.0 of 16 cores gpu leaves; a low estimate): 23,265 img/s" in \
        bench_report.ceiling_line(report)


def test_contenders_timed_too_briefly_are_marked_and_named():
    from fastdata.cli import bench_report

    def ok(name, rate, seconds, batches):
        return {"name": name, "label": name, "status": "ok", "images_per_s": rate, "cpu_cores_busy": 1.0,
                "peak_rss_mb": 100.0, "timed_seconds": seconds, "timed_batches": batches,
                "spread": {"min": rate, "q1": rate, "q3": rate, "max": rate}}

    report = {"ablation": False, "config": {"seconds": 20.0},
              "results": [ok("fastdata", 10000.0, 3.0, 40), ok("dali", 22912.0, 0.02, 2),
                          {"name": "ffcv", "label": "ffcv", "status": "skipped", "reason": "not installed"}]}
    rows = bench_report.table_rows(report)
    assert [r[1] for r in rows[1:3]] == ["10,000", "22,912*"]
    assert bench_report.short_timing_line(report) == (
        "* timed for under 2 s of --seconds 20, which all contenders share: dali 0.02 s (2 batches). "
        "These rates are not reliable: raise --seconds or compare fewer contenders")
    report["results"] = report["results"][:1]
    assert bench_report.short_timing_line(report) is None


def test_shuffled_batches_cover_each_epoch_once_and_reshuffle() -> None:
    from itertools import islice

    from fastdata.cli.bench_contenders import _shuffled_batches

    batches = list(islice(_shuffled_batches(10, 3), 6))  # two epochs of 3 batches (1 index dropped each)
    assert all(len(b) == 3 for b in batches)
    for epoch in (batches[:3], batches[3:]):
        seen = [i for b in epoch for i in b]
        assert len(set(seen)) == 9 and set(seen) <= set(range(10))
    assert batches[:3] != batches[3:]  # a new order each epoch


def test_usage_leaves_out_its_own_sampling_thread(monkeypatch):
    # A sampler made costly (each RSS read burns 20 ms of its thread's CPU) while the process
    # does nothing else: the process's CPU grows, the contender's (Usage.cpu_seconds) does not.
    import psutil

    from fastdata.cli.bench_runner import Usage
    from fastdata.io.host import process_cpu_seconds

    real = psutil.Process.memory_info

    def costly_memory_info(self):
        t = time.thread_time()
        while time.thread_time() - t < 0.02:
            pass
        return real(self)

    monkeypatch.setattr(psutil.Process, "memory_info", costly_memory_info)
    usage = Usage()
    try:
        time.sleep(0.1)
        c0, p0 = usage.cpu_seconds(), process_cpu_seconds()
        # Until the sampler has burned 0.1 s (0.6 s on a quiet box; longer when the box is busy
        # and the sampler waits for a core), up to 20 s.
        deadline = time.monotonic() + 20
        while process_cpu_seconds() - p0 < 0.1 and time.monotonic() < deadline:
            time.sleep(0.1)
        c1, p1 = usage.cpu_seconds(), process_cpu_seconds()
        threads = usage.thread_seconds()
    finally:
        usage.stop()
    assert p1 - p0 >= 0.1  # the sampler burned CPU...
    assert c1 - c0 <= 0.05, (c1 - c0, p1 - p0)  # ...which is not the contender's
    assert not any("bench-rss" in k for k in threads)


def test_settle_waits_for_busy_children_and_busy_cores_then_stops():
    clock = FakeClock()
    busy = iter([3.0, 2.0, 0.4, 0.3])
    # child CPU seconds before and after each reading: pid 7 spends CPU in the first window,
    # pid 9 appears in the second (a new child counts as busy), then both idle
    kids = iter([{7: 1.0}, {7: 1.2}, {7: 1.2}, {7: 1.2, 9: 0.0}, {7: 1.2, 9: 0.0}, {7: 1.2, 9: 0.0}])

    def reading() -> float:  # each reading takes its window, as busy_cores does
        clock.now += 0.25
        return next(busy)

    r = bench_runner.settle(0.1, margin=2.5, busy=reading, children=lambda: next(kids), clock=clock)
    # 3.0 and a busy child, 2.0 <= 2.6 but a new child, then 0.4 with both idle: three windows
    assert r == {"seconds": pytest.approx(0.75), "busy_cores": 0.4, "settled": True}


def test_settle_gives_up_on_a_machine_that_stays_busy():
    clock = FakeClock()

    def reading() -> float:
        clock.now += 0.25
        return 5.0

    r = bench_runner.settle(0.2, max_seconds=2.0, margin=0.5, busy=reading, children=dict, clock=clock)
    assert r["settled"] is False and r["busy_cores"] == 5.0 and 2.0 <= r["seconds"] < 2.3


def test_settle_waits_for_a_real_child_using_a_cpu_not_for_an_idle_one():
    import subprocess
    import sys

    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert idle.stdout.readline().strip() == "ready"  # its start-up CPU is over
        # busy cores allowed up to 64 over a baseline of 0: only children can hold it back
        r = bench_runner.settle(0.0, margin=64.0, max_seconds=10.0)
        assert r["settled"] is True and r["seconds"] < 1.0, r  # the sleeping child does not count
        busy = subprocess.Popen([sys.executable, "-c", spin])
        try:
            time.sleep(0.3)
            r = bench_runner.settle(0.0, margin=64.0, max_seconds=10.0)
            assert r["settled"] is True and r["seconds"] >= 0.4, r  # waited for the spinning one to end
        finally:
            busy.kill()
            busy.wait()
    finally:
        idle.kill()
        idle.wait()
        idle.stdout.close()
