"""GPU time per CUDA stream, read from a torch.profiler trace (``export_chrome_trace``).

A training step shares the GPU with its input: the model's kernels on the training stream,
the loader's on its own streams, and a library's on streams of its own (nvImageCodec decodes
on internal streams it creates, at the default priority, and makes the caller's stream wait
for them). Which stream's work took the GPU, and for how long per step, tells GPU contention
from a host-side stall. CUPTI records every kernel and copy of the process, whichever thread
queued it, and a CUDA graph's kernels one by one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

__all__ = ["StreamBusy", "stream_busy", "busy_union_us", "format_stream_busy"]

GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class StreamBusy:
    """One stream's GPU work in the trace: ``busy_us`` summed over its kernels and copies
    (work on one stream never overlaps), ``count`` of them, and ``by_name`` (name -> µs).
    ``delays_us``: for each kernel or copy whose launch the trace holds (CUPTI's runtime record
    with the same correlation id), from the end of the launch call to the start on the GPU: the
    time it waited behind its own stream's earlier work or for the GPU's units (a kernel of a CUDA
    graph counts from the graph's launch). ``calls_us``: how long those launch calls held their
    host thread (a copy from pageable memory returns only once its stream's earlier work is done)."""

    stream: int
    busy_us: float = 0.0
    count: int = 0
    by_name: Dict[str, float] = field(default_factory=dict)
    delays_us: List[float] = field(default_factory=list)
    calls_us: List[float] = field(default_factory=list)

    def delay_percentiles(self) -> Tuple[float, float]:
        """(median, 90th percentile) of ``delays_us``; raises when there are none."""
        if not self.delays_us:
            raise ValueError(f"stream {self.stream}: no launch records")
        return median_p90(self.delays_us)

    def top(self, n: int) -> List[Tuple[str, float]]:
        """The ``n`` kernel or copy names that took the most GPU time, with their µs."""
        return _largest(self.by_name, n)


def _largest(by_name: Dict[str, float], n: int) -> List[Tuple[str, float]]:
    return sorted(by_name.items(), key=lambda kv: -kv[1])[:n]


def median_p90(values: Sequence[float]) -> Tuple[float, float]:
    """(median, 90th percentile) of a non-empty sequence, each an element of it."""
    d = sorted(values)
    return d[len(d) // 2], d[min(len(d) - 1, (9 * len(d)) // 10)]


def _gpu_events(trace: dict) -> List[dict]:
    return [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATEGORIES and "dur" in e]


def stream_busy(trace_path: str) -> List[StreamBusy]:
    """Every stream's GPU work in a chrome trace, busiest first. Raises if the trace holds
    no kernel or copy (CUPTI unavailable, or nothing ran while recording)."""
    with open(trace_path) as f:
        trace = json.load(f)
    streams: Dict[int, StreamBusy] = {}
    events = _gpu_events(trace)
    if not events:
        raise RuntimeError(f"{trace_path}: the profiler recorded no GPU kernels or copies (CUPTI unavailable?)")
    # the launch calls' ends, by correlation id (CUPTI's runtime records, any thread)
    launched = {e["args"]["correlation"]: (float(e["ts"]) + float(e.get("dur", 0.0)), float(e.get("dur", 0.0)))
                for e in trace.get("traceEvents", [])
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}) and "ts" in e}
    for e in events:
        args = e.get("args", {})
        sid = int(args.get("stream", e.get("tid", -1)))
        s = streams.setdefault(sid, StreamBusy(sid))
        dur = float(e["dur"])
        s.busy_us += dur
        s.count += 1
        s.by_name[e["name"]] = s.by_name.get(e["name"], 0.0) + dur
        if args.get("correlation") in launched:
            call_end, call_us = launched[args["correlation"]]
            s.delays_us.append(max(0.0, float(e["ts"]) - call_end))
            s.calls_us.append(call_us)
    return sorted(streams.values(), key=lambda s: -s.busy_us)


def busy_union_us(trace_path: str) -> Tuple[float, float]:
    """(µs the GPU ran anything, on any stream; µs from the first GPU event's start to the last's end)."""
    with open(trace_path) as f:
        spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in _gpu_events(json.load(f)))
    if not spans:
        raise RuntimeError(f"{trace_path}: the profiler recorded no GPU kernels or copies")
    busy, end = 0.0, spans[0][0]
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy, spans[-1][1] - spans[0][0]


def format_stream_busy(streams: Sequence[StreamBusy], steps: int, top: int = 4, name_width: int = 48,
                       max_streams: int = 5) -> List[str]:
    """One line per stream, busiest first: ms of GPU work per step, how many kernels and copies,
    the largest by name. Past ``max_streams``, the rest share one line (nvImageCodec alone makes
    dozens of streams, each with a little work)."""
    def line(label: str, busy_us: float, count: int, by_name: Dict[str, float], delays: List[float],
             calls: List[float]) -> str:
        names = ", ".join(f"{name[:name_width]} {us / steps / 1e3:.2f}" for name, us in _largest(by_name, top))
        waited = ""
        if delays:
            (median, p90), (call_median, call_p90) = median_p90(delays), median_p90(calls)
            waited = (f"; launch to start median {median:.0f} us, p90 {p90:.0f} us; "
                      f"launch calls median {call_median:.0f} us, p90 {call_p90:.0f} us")
        return (f"{label}: {busy_us / steps / 1e3:.2f} ms/step in {count / steps:.0f} kernels+copies/step{waited}; "
                f"largest (ms/step): {names}")

    lines = [line(f"stream {s.stream}", s.busy_us, s.count, s.by_name, s.delays_us, s.calls_us)
             for s in streams[:max_streams]]
    rest = streams[max_streams:]
    if rest:
        by_name: Dict[str, float] = {}
        for s in rest:
            for name, us in s.by_name.items():
                by_name[name] = by_name.get(name, 0.0) + us
        lines.append(line(f"{len(rest)} more streams", sum(s.busy_us for s in rest), sum(s.count for s in rest),
                          by_name, [d for s in rest for d in s.delays_us], [c for s in rest for c in s.calls_us]))
    return lines
