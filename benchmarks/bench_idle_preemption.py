"""What SCHED_IDLE native decode threads lose per CPU-second beside threads that wake often.

Why: beside a GPU decoder the native threads run under SCHED_IDLE (pipeline.GPU_NATIVE_IDLE),
so the GPU side's host threads take a core the moment they wake, and Linux places a waking
thread on a CPU that runs only SCHED_IDLE work as if it were idle. On one H100 host (thirty-second
session) hybrid's native threads decoded about 787 rows per second of their CPU time against
1,048 when native ran alone; on another, no loss. This probe asks the host itself, with no GPU.
Four runs per round, in an order that rotates from round to round:

* alone: native decode (the Engine, SCHED_IDLE, ``--threads``) with nothing else running;
* floating: the same beside ``wake_pattern.c``'s threads (normal priority, each sleeping
  SLEEP_US and spinning WORK_US), all threads free to run on every core;
* kept_alone: the native threads kept off the first ``--reserve`` cores, nothing else running;
* partitioned: the same, with the waking threads on those reserved cores.

Reported: img/s, rows per native CPU-second (the native threads' own CPU time) and that as a
ratio of the same cores' run alone in the round (floating against alone, partitioned against
kept_alone). A floating ratio well below 1 with partitioned near 1 means preemption costs the
native threads throughput per core, which keeping the GPU side's threads off their cores
would save.

A pattern of 0:1000000 is a busy loop per waking thread: its partitioned ratio is what the cores
cost each other with no thread shared between them (a physical core beneath two of the VM's, or a
clock shared by all). On one H100 host (thirty-third session, the same measure made by hand:
native on cores 0-10, five busy loops on 11-15) 0.85-0.91x, beside gpu-only there 0.92-0.94x;
on the 2-core box 1.00x (0.99-1.06, four rounds). That host's hybrid native threads lost about
as much per core (769 rows per CPU-second against native alone's 839): most of that loss is
not the scheduler's to win back.

    python benchmarks/bench_idle_preemption.py --patterns 200:100,50:20 --wakers 4 --reserve 3
    python benchmarks/bench_idle_preemption.py --patterns 0:1000000 --wakers 5 --reserve 5
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu_decode import build_set  # noqa: E402

import fastdata  # noqa: E402
from fastdata.io.engine import Engine  # noqa: E402
from fastdata.io.host import thread_cpu_seconds, usable_cores  # noqa: E402

HERE = Path(__file__).resolve().parent
NATIVE_THREAD = "fastdata-native"  # the Engine's OS thread name (thread_cpu_seconds' label for them)
# run -> (native threads kept off the reserved cores, waking threads running, the run it is compared with)
RUNS = {"alone": (False, False, "alone"), "floating": (False, True, "alone"),
        "kept_alone": (True, False, "kept_alone"), "partitioned": (True, True, "kept_alone")}


def native_tids():
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == NATIVE_THREAD:
                    tids.append(int(tid))
        except OSError:
            continue  # a thread that ended between listing and reading
    return tids


def native_cpu_seconds() -> float:
    return thread_cpu_seconds().get(NATIVE_THREAD, 0.0)


def keep_native_threads_on(cpus) -> None:
    for tid in native_tids():
        os.sched_setaffinity(tid, cpus)
        if os.sched_getaffinity(tid) != set(cpus):
            raise RuntimeError(f"native thread {tid} runs on {sorted(os.sched_getaffinity(tid))}, not {sorted(cpus)}")


def timed(engine: Engine, paths, transform, out, seconds: float):
    """(img/s, rows per native CPU-second, native cores) over whole batches for ``seconds``."""
    rows, epoch = 0, 0
    cpu0, t0 = native_cpu_seconds(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        engine.start(paths, transform, out, seed=1, epoch=epoch).finish()
        rows, epoch = rows + len(paths), epoch + 1
    cpu, wall = native_cpu_seconds() - cpu0, time.perf_counter() - t0
    if cpu <= 0:
        raise RuntimeError(f"the native threads' CPU time did not grow: are they named {NATIVE_THREAD!r}?")
    return rows / wall, rows / cpu, cpu / wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", default="200:100,50:20", help="SLEEP_US:WORK_US of each waking thread, comma-separated")
    ap.add_argument("--wakers", type=int, default=4, help="waking threads")
    ap.add_argument("--reserve", type=int, default=1, help="cores kept for the waking threads in the kept runs")
    ap.add_argument("--threads", type=int, default=None,
                    help="native threads, the engine's queue thread among them (default: usable cores - reserve)")
    ap.add_argument("--images", type=int, default=128, help="photo-like 500x375 JPEGs per batch")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per run")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("needs Linux (per-thread CPU time, sched_setaffinity)")
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < args.reserve < len(cpus):
        raise SystemExit(f"--reserve must leave the native threads a core: 1..{len(cpus) - 1}")
    try:
        patterns = [tuple(int(x) for x in p.split(":")) for p in args.patterns.split(",")]
    except ValueError:
        raise SystemExit(f"--patterns: SLEEP_US:WORK_US pairs of whole numbers, comma-separated, got {args.patterns!r}")
    if any(len(p) != 2 for p in patterns):
        raise SystemExit(f"--patterns: SLEEP_US:WORK_US pairs, got {args.patterns!r}")
    threads = args.threads or max(1, usable_cores() - args.reserve)
    reserved, rest = set(cpus[:args.reserve]), set(cpus[args.reserve:])
    with tempfile.TemporaryDirectory() as tmp:
        waker = Path(tmp) / "wake_pattern"
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(waker), str(HERE / "wake_pattern.c")], check=True)
        build_set(Path(tmp) / "set", args.images, 500, 375, 4)
        paths = sorted(str(p) for p in (Path(tmp) / "set").rglob("*.jpg"))[:args.images]
        transform = fastdata.RandomResizedCrop(224)
        out = np.empty((len(paths), 224, 224, 3), np.uint8)
        # start(): the pool's workers and its queue thread decode, the calling thread waits
        engine = Engine(threads, idle=True)
        timed(engine, paths, transform, out, 2.0)  # warm-up
        print(f"{len(native_tids())} native threads (SCHED_IDLE) on {len(cpus)} cores; {args.wakers} waking threads; "
              f"kept runs: the native threads off cores {sorted(reserved)}, the waking threads (partitioned) on them")
        table, summary = [], []
        for sleep_us, work_us in patterns:
            ratios = {"floating": [], "partitioned": []}
            for k in range(args.rounds):
                order = list(RUNS)[k % len(RUNS):] + list(RUNS)[:k % len(RUNS)]  # drift spread over the runs
                results = {}  # run -> (img/s, rows per native CPU-second, native cores)
                for name in order:
                    kept, waking, _ = RUNS[name]
                    keep_native_threads_on(rest if kept else set(cpus))
                    cmd = [str(waker), str(args.wakers), str(sleep_us), str(work_us)]
                    if kept:
                        cmd = ["taskset", "-c", ",".join(map(str, sorted(reserved)))] + cmd
                    proc = subprocess.Popen(cmd) if waking else None
                    try:
                        time.sleep(0.2)
                        results[name] = timed(engine, paths, transform, out, args.seconds)
                        if proc is not None and proc.poll() is not None:  # nothing woke: the run would read as no loss
                            raise RuntimeError(f"the waking threads' process ({' '.join(cmd)}) exited with "
                                               f"{proc.returncode} during the run")
                    finally:
                        if proc is not None and proc.poll() is None:
                            proc.kill()
                            proc.wait()
                for name in RUNS:
                    ratio = results[name][1] / results[RUNS[name][2]][1]
                    if name in ratios:
                        ratios[name].append(ratio)
                    rate, rows_per_cpu, cores = results[name]
                    table.append((f"{sleep_us}:{work_us}", k + 1, name, rate, rows_per_cpu, ratio, cores))
            for name, r in ratios.items():
                summary.append(f"pattern {sleep_us}:{work_us} us, {name}: rows per native CPU-second "
                               f"{median(r):.3f}x its alone run's (median of {len(r)} rounds; {min(r):.3f}-{max(r):.3f})")
        print(f"\n{'sleep:work us':>13} {'round':>5} {'run':>12} {'img/s':>8} {'rows/CPU-s':>11} {'vs alone':>9} "
              f"{'cores':>6}")
        for pattern, k, name, rate, rows_per_cpu, ratio, cores in table:
            print(f"{pattern:>13} {k:>5} {name:>12} {rate:8,.0f} {rows_per_cpu:11,.0f} {ratio:8.3f}x {cores:6.2f}")
        print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
