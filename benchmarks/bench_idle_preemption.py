"""What SCHED_IDLE native decode threads lose per CPU-second beside threads that wake often.

Why: beside a GPU decoder the native threads run under SCHED_IDLE (pipeline.GPU_NATIVE_IDLE),
so the GPU side's host threads take a core the moment they wake, and Linux places a waking
thread on a CPU that runs only SCHED_IDLE work as if it were idle. On one H100 host (thirty-second
session) hybrid's native threads decoded 787 rows per second of their CPU time against 1,048
when native ran alone; on another, no loss. This probe asks the host itself, with no GPU:

* alone: native decode (the Engine, SCHED_IDLE, ``--threads``) with nothing else running;
* floating: the same beside ``wake_pattern.c``'s threads (normal priority, each sleeping
  SLEEP_US and spinning WORK_US), all threads free to run on every core;
* partitioned: the waking threads on the first ``--reserve`` cores, the native threads on the
  others (``sched_setaffinity``).

Reported per run: img/s, rows per native CPU-second (the native threads' own CPU time, from
/proc; Linux only) and that as a ratio of alone's in the same round. A floating ratio well
below 1 with partitioned near 1 means preemption costs the native threads throughput per
core, which keeping the GPU side's threads off their cores would save.

    python benchmarks/bench_idle_preemption.py --patterns 200:100,50:20 --wakers 4 --reserve 3
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
from fastdata.io.host import usable_cores  # noqa: E402

HERE = Path(__file__).resolve().parent
NATIVE_THREAD = "fastdata-native"  # the Engine's OS thread name
TICKS = os.sysconf("SC_CLK_TCK")


def native_tids():
    tids = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == NATIVE_THREAD:
                tids.append(int(tid))
    return tids


def native_cpu_seconds() -> float:
    total = 0
    for tid in native_tids():
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / TICKS


def timed(engine: Engine, paths, transform, out, seconds: float):
    """(img/s, rows per native CPU-second, native cores) over whole batches for ``seconds``."""
    rows, epoch = 0, 0
    cpu0, t0 = native_cpu_seconds(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        engine.start(paths, transform, out, seed=1, epoch=epoch).finish()
        rows, epoch = rows + len(paths), epoch + 1
    cpu, wall = native_cpu_seconds() - cpu0, time.perf_counter() - t0
    if cpu <= 0:
        raise RuntimeError("the native threads' CPU time did not grow: are they named "
                           f"{NATIVE_THREAD!r} (/proc/self/task/*/comm)?")
    return rows / wall, rows / cpu, cpu / wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", default="200:100,50:20", help="SLEEP_US:WORK_US of each waking thread, comma-separated")
    ap.add_argument("--wakers", type=int, default=4, help="waking threads")
    ap.add_argument("--reserve", type=int, default=1, help="cores for the waking threads when partitioned")
    ap.add_argument("--threads", type=int, default=None, help="native threads (default: usable cores - reserve)")
    ap.add_argument("--images", type=int, default=128, help="photo-like 500x375 JPEGs per batch")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("needs Linux (/proc per-thread CPU time, sched_setaffinity)")
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < args.reserve < len(cpus):
        raise SystemExit(f"--reserve must leave the native threads a core: 1..{len(cpus) - 1}")
    patterns = []
    for p in args.patterns.split(","):
        sleep_us, work_us = (int(x) for x in p.split(":"))
        patterns.append((sleep_us, work_us))
    threads = args.threads or max(1, usable_cores() - args.reserve)
    with tempfile.TemporaryDirectory() as tmp:
        waker = Path(tmp) / "wake_pattern"
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(waker), str(HERE / "wake_pattern.c")], check=True)
        build_set(Path(tmp) / "set", args.images, 500, 375, 4)
        paths = sorted(str(p) for p in (Path(tmp) / "set").rglob("*.jpg"))[:args.images]
        transform = fastdata.RandomResizedCrop(224)
        out = np.empty((len(paths), 224, 224, 3), np.uint8)
        engine = Engine(threads + 1, idle=True)  # start(): the pool's threads decode, the caller waits
        timed(engine, paths, transform, out, 2.0)  # warm-up
        reserved, rest = set(cpus[:args.reserve]), set(cpus[args.reserve:])
        print(f"{len(native_tids())} native threads (SCHED_IDLE) on {len(cpus)} cores; {args.wakers} waking threads; "
              f"partitioned: waking on {sorted(reserved)}, native on the other {len(rest)}")
        rows = []
        for sleep_us, work_us in patterns:
            ratios = {"floating": [], "partitioned": []}
            for _ in range(args.rounds):
                per_cpu = {}
                for mode in ("alone", "floating", "partitioned"):
                    for tid in native_tids():
                        os.sched_setaffinity(tid, rest if mode == "partitioned" else set(cpus))
                    cmd = [str(waker), str(args.wakers), str(sleep_us), str(work_us)]
                    if mode == "partitioned":
                        cmd = ["taskset", "-c", ",".join(map(str, sorted(reserved)))] + cmd
                    proc = subprocess.Popen(cmd) if mode != "alone" else None
                    try:
                        time.sleep(0.2)
                        rate, per_cpu[mode], cores = timed(engine, paths, transform, out, args.seconds)
                    finally:
                        if proc is not None:
                            proc.kill()
                            proc.wait()
                    if mode != "alone":
                        ratios[mode].append(per_cpu[mode] / per_cpu["alone"])
                    rows.append((f"{sleep_us}:{work_us}", mode, rate, per_cpu[mode],
                                 per_cpu[mode] / per_cpu["alone"], cores))
            for mode, r in ratios.items():
                print(f"pattern {sleep_us}:{work_us} us, {mode}: rows per native CPU-second {median(r):.3f}x alone's "
                      f"(median of {len(r)} rounds)")
        print(f"\n{'sleep:work us':>13} {'mode':>12} {'img/s':>8} {'rows/CPU-s':>11} {'vs alone':>9} {'cores':>6}")
        for pattern, mode, rate, per_cpu, ratio, cores in rows:
            print(f"{pattern:>13} {mode:>12} {rate:8,.0f} {per_cpu:11,.0f} {ratio:8.3f}x {cores:6.2f}")


if __name__ == "__main__":
    main()
