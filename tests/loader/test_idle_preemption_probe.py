"""benchmarks/bench_idle_preemption.py: SCHED_IDLE native threads beside threads that wake often.
A check that the probe runs and that its partition holds (the native threads stay off the
reserved cores), not of any machine's numbers (those are docs/results.md's)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from repo import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_idle_preemption.py"


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None
                    or shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux, gcc, taskset and two cores")
def test_probe_runs_and_the_partition_keeps_native_threads_off_the_reserved_cores():
    cores = len(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--patterns", "200:100", "--wakers", "1", "--reserve", "1",
                           "--images", "16", "--seconds", "1", "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("sleep:work us", 1)[1].splitlines()[1:]
    runs = {line.split()[1]: [float(x.replace(",", "").rstrip("x")) for x in line.split()[2:]] for line in table}
    assert sorted(runs) == ["alone", "floating", "partitioned"]
    for rate, per_cpu, ratio, native_cores in runs.values():
        assert rate > 0 and per_cpu > 0 and native_cores > 0
    assert runs["alone"][2] == 1.0
    # Partitioned, the native threads may use every core but the reserved one: their CPU time
    # per second of wall time cannot exceed that (alone they use more where cores allow).
    assert runs["partitioned"][3] <= cores - 1 + 0.05, runs
    if cores == 2:
        assert runs["alone"][3] > 1.3, runs  # two native threads on two free cores
