"""fastdata.diagnostics.gpu_streams: GPU time per CUDA stream from a torch.profiler chrome trace."""
from __future__ import annotations

import json

import pytest
import torch

from fastdata.diagnostics.gpu_streams import busy_union_us, format_stream_busy, load_trace, stream_busy


def _kernel(name, stream, ts, dur, cat="kernel", correlation=None):
    args = {"stream": stream, "device": 0}
    if correlation is not None:
        args["correlation"] = correlation
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream, "args": args}


def _launch(correlation, ts, dur, cat="cuda_runtime"):  # CUPTI's record of the host call, on a host thread
    return {"ph": "X", "cat": cat, "name": "cudaLaunchKernel", "ts": ts, "dur": dur, "pid": 1, "tid": 99,
            "args": {"correlation": correlation}}


def _trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return load_trace(str(path))


def test_streams_are_summed_apart_and_the_union_counts_overlaps_once(tmp_path):
    # stream 7: two kernels of 100 us; stream 21: a 50 us kernel overlapping the first by 30 us,
    # and a copy; CPU-side events and instant markers are not GPU work.
    trace = _trace(tmp_path, [
        _kernel("conv", 7, 1000, 100), _kernel("conv", 7, 1200, 100),
        _kernel("nvjpeg::convert", 21, 1070, 50), _kernel("Memcpy HtoD", 21, 1400, 20, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 900, "dur": 800, "pid": 0, "tid": 1},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 1500, "pid": 0, "tid": 7}])
    streams = stream_busy(trace)
    assert [(s.stream, s.busy_us, s.count) for s in streams] == [(7, 200.0, 2), (21, 70.0, 2)]
    assert streams[1].by_name == {"nvjpeg::convert": 50.0, "Memcpy HtoD": 20.0}
    # busy: 1000-1120 (conv + the overlapping 50 us), 1200-1300, 1400-1420 = 240 of a 420 us span
    assert busy_union_us(trace) == (240.0, 420.0)
    lines = format_stream_busy(streams, steps=2)
    assert len(lines) == 2
    assert lines[0].startswith("stream 7: 0.10 ms/step in 1 kernels+copies/step") and "conv 0.10" in lines[0]
    # past max_streams, the rest share a line with their kernels summed by name
    rest = format_stream_busy(streams, steps=2, max_streams=1)
    assert rest[0] == lines[0] and rest[1].startswith("1 more streams: 0.04 ms/step in 1 kernels+copies/step")
    assert "nvjpeg::convert 0.03" in rest[1] and "Memcpy HtoD 0.01" in rest[1]


def test_the_span_ends_at_the_latest_end_not_the_last_start(tmp_path):
    trace = _trace(tmp_path, [_kernel("long", 7, 0, 500), _kernel("short", 9, 100, 10)])
    assert busy_union_us(trace) == (500.0, 500.0)


def test_launch_delays_pair_each_kernel_with_its_launch_record(tmp_path):
    # stream 7's three kernels start 5, 300 and 40 us after their launch calls end (one launched
    # through the driver API); stream 9's kernel has no launch record (a thread the trace missed);
    # a launch record of a kernel outside the trace is ignored.
    trace = _trace(tmp_path, [
        _launch(1, 100, 10), _kernel("a", 7, 115, 20, correlation=1),
        _launch(2, 120, 5), _kernel("b", 7, 425, 20, correlation=2),
        _launch(3, 500, 10, cat="cuda_driver"), _kernel("c", 7, 550, 20, correlation=3),
        _kernel("d", 9, 600, 20, correlation=4), _launch(5, 700, 3)])
    by_stream = {s.stream: s for s in stream_busy(trace)}
    assert sorted(by_stream[7].delays_us) == [5.0, 40.0, 300.0] and sorted(by_stream[7].calls_us) == [5.0, 10.0, 10.0]
    assert by_stream[9].delays_us == [] and by_stream[9].calls_us == []
    lines = format_stream_busy([by_stream[7], by_stream[9]], steps=1)
    assert "launch to start median 40 us, p90 300 us (of 3/3); launch calls median 10 us, p90 10 us" in lines[0]
    assert "launch to start" not in lines[1]


def test_a_graph_launch_counts_its_call_once_and_each_kernel_from_it(tmp_path):
    # one cudaGraphLaunch of 30 us queues three kernels: three delays, one call
    trace = _trace(tmp_path, [_launch(8, 0, 30), _kernel("k1", 7, 40, 10, correlation=8),
                              _kernel("k2", 7, 50, 10, correlation=8), _kernel("k3", 7, 60, 10, correlation=8)])
    (s,) = stream_busy(trace)
    assert s.delays_us == [10.0, 20.0, 30.0] and s.calls_us == [30.0]


def test_a_trace_without_gpu_work_raises(tmp_path):
    # a real profiler trace of CPU work only (this box has no CUDA; on a GPU box nothing ran on it)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    path = str(tmp_path / "cpu.json")
    prof.export_chrome_trace(path)
    trace = load_trace(path)
    with pytest.raises(RuntimeError, match="no GPU kernels"):
        stream_busy(trace)
    with pytest.raises(RuntimeError, match="no GPU kernels"):
        busy_union_us(trace)
