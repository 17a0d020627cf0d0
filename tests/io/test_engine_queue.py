"""Engine.start: batches queued on the engine's own thread, and the native threads' priority.

Oracles: ``Engine.run`` (the synchronous call, itself checked against Pillow in
test_decode_batch.py) for pixels and reports, and the kernel's own view of each thread's
nice value (/proc/self/task/*/stat).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import fastdata
from fastdata.io.engine import Engine
from imagegen import encode_jpeg, encode_other, photo_like

RRC = fastdata.RandomResizedCrop((40, 56))


@pytest.fixture(scope="module")
def items():
    """Good JPEGs of several kinds, a PNG (the Pillow fallback) and two bad buffers."""
    good = [encode_jpeg(photo_like(90 + 7 * i, 120 - 5 * i, index=i), progressive=i % 3 == 0) for i in range(10)]
    return good + [encode_other(photo_like(60, 80, index=10), "PNG"), b"\xff\xd8\xff garbage", good[1][:200]]


def _report_facts(report):
    return ([str(e) for e in report.failures], report.failed_rows, report.warnings, report.fallbacks)


def test_started_runs_equal_run_in_pixels_and_report(items):
    with Engine(3) as engine:
        want = np.empty((len(items), 40, 56, 3), np.uint8)
        ref = engine.run(items, RRC, want, seed=4, epoch=2, indices=range(50, 50 + len(items)))
        outs = [np.full_like(want, 7) for _ in range(3)]
        runs = [engine.start(items, RRC, out, seed=4, epoch=2, indices=range(50, 50 + len(items))) for out in outs]
        for run, out in zip(runs, outs):
            report = run.finish()
            assert np.array_equal(out, want)
            assert _report_facts(report) == _report_facts(ref)
            assert report.wall_seconds > 0
        assert ref.fallbacks == 1 and ref.failed_rows == [11, 12]


def test_runs_finish_in_the_order_started_and_a_run_finishes_once(items):
    with Engine(2) as engine:
        outs = [np.empty((len(items), 40, 56, 3), np.uint8) for _ in range(4)]
        runs = [engine.start(items, RRC, out, epoch=e) for e, out in enumerate(outs)]
        runs[-1].finish()  # the last one done means every one before it is done: one queue
        assert all(r.done() for r in runs)
        for r in runs[:-1]:
            r.finish()
        with pytest.raises(RuntimeError, match="already waited"):
            runs[0].finish()


def test_dropping_or_closing_waits_for_queued_runs(items):
    """Nothing a queued run reads or writes is released under it: a dropped handle waits for
    its run, and closing the engine runs what is queued first."""
    engine = Engine(2)
    out = np.zeros((len(items), 40, 56, 3), np.uint8)
    run = engine.start(items * 1, RRC, out, seed=1)
    del run  # waits for the run
    assert out[:10].any()
    outs = [np.zeros_like(out) for _ in range(3)]
    runs = [engine.start(items, RRC, o, seed=1) for o in outs]
    engine.close()
    for r, o in zip(runs, outs):
        assert r.done() and o[:10].any()
        report = r.finish()  # the PNG's Pillow fallback needs the engine: its row fails, named
        assert report.failed_rows == [10, 11, 12] and "engine was closed" in str(report.failures[0])
    with pytest.raises(RuntimeError, match="closed"):
        engine.start(items, RRC, out)


def test_start_checks_its_arguments_before_queuing(items):
    with Engine(1) as engine:
        with pytest.raises(ValueError, match="shape"):
            engine.start(items, RRC, np.empty((2, 40, 56, 3), np.uint8))
        with pytest.raises(ValueError, match="indices"):
            engine.start(items, RRC, np.empty((len(items), 40, 56, 3), np.uint8), indices=[1, 2])


def test_a_synchronous_call_meanwhile_waits_for_the_pool_and_is_correct(items):
    with Engine(2) as engine:
        ref = np.empty((len(items), 40, 56, 3), np.uint8)
        engine.run(items, RRC, ref, seed=9)
        outs = [np.empty_like(ref) for _ in range(3)]
        runs = [engine.start(items, RRC, o, seed=9) for o in outs]
        out = np.empty_like(ref)
        engine.run(items, RRC, out, seed=9)  # between queued runs, on the same pool
        for r in runs:
            r.finish()
        assert all(np.array_equal(o, ref) for o in outs + [out])


def _nice_by_thread_name() -> dict:
    out: dict = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        out.setdefault(name, []).append(int(fields[16]))  # field 19 of stat: nice
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_nice_lowers_the_native_threads_priority_only(items):
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base > 14:
        pytest.skip(f"this process already runs at nice {base}")
    before = len(_nice_by_thread_name().get("fastdata-native", []))
    with Engine(3, nice=5) as engine:
        out = np.empty((len(items), 40, 56, 3), np.uint8)
        engine.run(items, RRC, out)  # every worker has started (each takes part in every loop)
        engine.start(items, RRC, out).finish()  # and the queue thread
        nices = _nice_by_thread_name()
        native = nices["fastdata-native"]
        assert sorted(native)[-3:] == [base + 5] * 3 and len(native) >= before + 3
        assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the calling thread keeps its own
        assert engine.priority_lowered
    deadline = time.monotonic() + 5
    while len(_nice_by_thread_name().get("fastdata-native", [])) > before and time.monotonic() < deadline:
        time.sleep(0.01)  # joined on close
    assert len(_nice_by_thread_name().get("fastdata-native", [])) == before


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs Linux scheduling policies")
def test_idle_puts_every_native_thread_under_sched_idle_and_no_other(items):
    def policies():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = f.read().strip()
                out.setdefault(name, []).append(os.sched_getscheduler(int(tid)))
            except OSError:  # a thread that ended meanwhile
                continue
        return out

    before = policies()
    with Engine(3, idle=True) as engine, Engine(3, thread_name="fastdata-plain") as plain:
        out, ref = np.empty((len(items), 40, 56, 3), np.uint8), np.empty((len(items), 40, 56, 3), np.uint8)
        engine.run(items, RRC, out)
        engine.start(items, RRC, out).finish()  # the queue thread has started too
        plain.run(items, RRC, ref)
        plain.start(items, RRC, ref).finish()
        if not engine.priority_lowered:
            pytest.skip("this kernel (or a seccomp filter) refuses SCHED_IDLE")
        now = policies()
        idle = before.get("fastdata-native", []).count(os.SCHED_IDLE)
        assert now["fastdata-native"].count(os.SCHED_IDLE) == idle + 3  # 2 workers + the queue thread
        assert now["fastdata-plain"] == [os.SCHED_OTHER] * 3  # an engine without idle: untouched
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the calling thread keeps its own
        assert engine.idle and not plain.idle
        assert np.array_equal(out, ref)


@pytest.mark.parametrize("nice", [-1, 20, 1.5, True])
def test_nice_must_be_a_small_non_negative_int(nice):
    with pytest.raises(ValueError, match="nice"):
        Engine(1, nice=nice)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_an_engine_names_its_native_threads(items):
    # Per-thread CPU figures (fastdata-bench) tell engines apart by these names: the Loader's
    # inline engine, which plans for a GPU decoder, is not counted as native decoding.
    with Engine(3, thread_name="fastdata-test") as engine:
        out = np.empty((len(items), 40, 56, 3), np.uint8)
        engine.run(items, RRC, out)  # every worker has started
        engine.start(items, RRC, out).finish()  # and the queue thread
        assert len(_nice_by_thread_name().get("fastdata-test", [])) == 3  # two workers + the queue thread


@pytest.mark.parametrize("name", ["", "sixteen-chars-xx", 7])
def test_a_thread_name_is_1_to_15_characters(name):
    with pytest.raises(ValueError, match="thread_name"):
        Engine(1, thread_name=name)
