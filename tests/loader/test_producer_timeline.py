"""benchmarks/bench_producer_timeline.py: where a Loader's batch time goes, step by step. A check that
the script runs and that its table adds up, not of any machine's numbers (those are issue 14's, on a GPU)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from imagegen import photo_folder
from repo import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_producer_timeline.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_producer_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_add_up_per_thread_kind():
    m = _module()
    assert m.thread_kind("fastdata-gpu-decode_1") == m.thread_kind("fastdata-gpu-decode_0") == "fastdata-gpu-decode"
    assert m.thread_kind("fastdata-loader-7f2823882bd0") == "fastdata-loader"
    spans = [("fastdata-gpu-decode_0", "gpu_decode_stage", 0.0, 0.004, 0.003),
             ("fastdata-gpu-decode_1", "gpu_decode_stage", 0.001, 0.007, 0.001),
             ("fastdata-loader-7f2823882bd0", "plan", 0.0, 0.002, 0.0005),
             ("fastdata-loader-7f2823882bd0", "deliver", 0.003, 0.004, 0.001)]
    rows = {(r["thread"], r["step"]): r for r in m.step_table(spans, batches=2, wall=0.01)}
    decode = rows[("fastdata-gpu-decode", "gpu_decode_stage")]
    assert decode["calls"] == 2 and decode["ms_per_batch"] == pytest.approx(5.0) and decode["share"] == pytest.approx(1.0)
    assert decode["cpu_ms_per_batch"] == pytest.approx(2.0)  # 4 ms of the threads' CPU over 2 batches
    assert rows[("fastdata-loader", "plan")]["ms_per_batch"] == pytest.approx(1.0)
    assert rows[("fastdata-loader", "plan")]["cpu_ms_per_batch"] == pytest.approx(0.25)
    assert [r["step"] for r in m.step_table(spans, 2, 0.01) if r["thread"] == "fastdata-loader"] == ["plan", "deliver"]


def test_runs_on_the_cpu(tmp_path):
    root = photo_folder(tmp_path, classes=2, per_class=8, width=64, height=48, seed=3)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root), "--device", "cpu", "--backend", "native",
                           "--dtype", "uint8", "--batch-size", "4", "--threads", "1", "--seconds", "0.3",
                           "--warmup", "2", "--label", "check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("native check: ") and "img/s" in out
    # the producer's own loop, each step a row: the native run waited for, the hand-over
    for step in ("wait_native", "deliver", "queue_native", "fetch"):
        assert f"| fastdata-loader | {step} |" in out, out
    # every thread kind's CPU in the window: the native threads decoded, so theirs is there and not 0
    native = [line for line in out.splitlines() if line.startswith("| fastdata-native |")]
    assert len(native) == 1 and float(native[0].split("|")[2]) > 0 and float(native[0].split("|")[3]) >= 0, out
