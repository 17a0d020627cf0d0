"""benchmarks/bench_idle_preemption.py: SCHED_IDLE native threads beside threads that wake often.
A check that the probe runs, compares each run with the right one, and keeps the native threads
off the reserved cores where it says so; not of any machine's numbers (docs/results.md has those)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from repo import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_idle_preemption.py"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None
                    or shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux, gcc, taskset and two cores")
def test_probe_runs_and_keeps_native_threads_off_the_reserved_cores():
    cores = len(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--patterns", "200:100", "--wakers", "1", "--reserve", "1",
                           "--images", "16", "--seconds", "1", "--rounds", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("sleep:work us", 1)[1].split("\n\n")[0].splitlines()[1:]
    runs = {}
    for line in table:
        pattern, round_, name, rate, per_cpu, ratio, native_cores = line.split()
        runs.setdefault(name, []).append((float(rate.replace(",", "")), float(per_cpu.replace(",", "")),
                                          float(ratio.rstrip("x")), float(native_cores)))
    assert sorted(runs) == ["alone", "floating", "kept_alone", "partitioned"] and all(len(v) == 2 for v in runs.values())
    by_round = [{name: runs[name][k] for name in runs} for k in range(2)]
    for r in by_round:  # each ratio is its run against the alone run on the same cores, that round
        assert r["floating"][2] == pytest.approx(r["floating"][1] / r["alone"][1], rel=2e-3)
        assert r["partitioned"][2] == pytest.approx(r["partitioned"][1] / r["kept_alone"][1], rel=2e-3)
        # Kept off the reserved core, the native threads' CPU time per second of wall time
        # cannot exceed the cores left to them, whatever else the machine runs.
        assert r["kept_alone"][3] <= cores - 1 + 0.05 and r["partitioned"][3] <= cores - 1 + 0.05, r
    assert "floating: rows per native CPU-second" in proc.stdout and "partitioned: rows per native" in proc.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None,
                    reason="needs Linux (SCHED_IDLE, sched_getcpu) and gcc")
def test_wake_placement_probe_builds_runs_and_refuses_bad_arguments(tmp_path):
    """benchmarks/wake_placement.c (gpu_suite.sh priority runs it first): where a thread woken by
    a busy SCHED_IDLE thread lands. Checked: it runs under each policy, with and without a crowd,
    and what it prints parses and holds together; not where this machine's kernel puts the
    thread (a loaded box starves SCHED_IDLE threads, so the wake count is only bounded above:
    a post every 5 ms gives at most about 100 in 0.5 s)."""
    exe = tmp_path / "wake_placement"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(exe),
                    str(ROOT / "benchmarks" / "wake_placement.c")], check=True)
    for policy, crowd in (("idle", "0"), ("nice19", "0"), ("normal", "1")):
        proc = subprocess.run([str(exe), policy, "0.5", crowd], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"{policy}") and f"crowd {crowd}: wakes " in proc.stdout, proc.stdout
        wakes = int(proc.stdout.split("wakes ")[1].split(",")[0])
        share = float(proc.stdout.split("waker's core ")[1].split("%")[0])
        took_ms = float(proc.stdout.split("took ")[1].split(" ms")[0])
        assert 1 <= wakes <= 110 and 0 <= share <= 100 and took_ms > 0, proc.stdout
    for bad in (["busy"], ["idle", "0"], ["idle", "1", "-1"], []):
        assert subprocess.run([str(exe), *bad], capture_output=True, timeout=10).returncode == 2, bad
