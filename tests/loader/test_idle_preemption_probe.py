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
