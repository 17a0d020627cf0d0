"""GPU time per CUDA stream, read from a torch.profiler trace (``export_chrome_trace``).

A training step shares the GPU with its input: the model's kernels on the training stream,
the loader's on its own streams, and a library's on streams of its own (nvJPEG's hardware
decode, called directly on a stream of the caller's, ran its copies and color conversion on 28
internal streams: docs/results.md, twenty-fifth session). Which stream's work took the GPU, for
how long per step, and how long that work waited to start, tells GPU contention from a host-side stall. CUPTI
records every kernel and copy of the process, whichever thread queued it, and a CUDA graph's
kernels one by one (on the stream the graph was launched on).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Set, Tuple

from .stall import _quantile

__all__ = ["StreamBusy", "load_trace", "stream_busy", "busy_union_us", "format_stream_busy"]

GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# CUPTI's records of the host calls that queued GPU work (cudaLaunchKernel, cudaMemcpyAsync,
# cudaGraphLaunch; cuLaunchKernel for Triton's kernels and libraries that use the driver API)
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


@dataclass
class StreamBusy:
    """One stream's GPU work in the trace: ``busy_us`` summed over its kernels and copies,
    ``count`` of them, and ``by_name`` (name -> µs). Work on one stream runs one item at a time,
    except a CUDA graph's parallel branches, which CUPTI reports on the launch stream: there
    ``busy_us`` can exceed the wall time.

    ``delays_us``: for each kernel or copy whose launch record the trace holds (same correlation
    id), from the end of the launch call to the start on the GPU: the time it waited behind its
    own stream's earlier work or for the GPU's units (a graph's kernels count from the graph's
    launch). ``calls_us``: how long each of those launch calls held its host thread, once per
    call (a copy from pageable memory may return only once its stream's earlier work is done)."""

    stream: int
    busy_us: float = 0.0
    count: int = 0
    by_name: Dict[str, float] = field(default_factory=dict)
    delays_us: List[float] = field(default_factory=list)
    calls_us: List[float] = field(default_factory=list)



def load_trace(path: str) -> dict:
    """A chrome trace as written by ``torch.profiler.profile.export_chrome_trace``."""
    with open(path) as f:
        return json.load(f)


def _gpu_events(trace: dict) -> List[dict]:
    events = [e for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATEGORIES and "dur" in e]
    if not events:
        raise RuntimeError("the profiler recorded no GPU kernels or copies (CUPTI unavailable, or no GPU work ran)")
    return events


def stream_busy(trace: dict) -> List[StreamBusy]:
    """Every stream's GPU work in a loaded trace, busiest first. Raises if the trace holds no
    kernel or copy."""
    events = _gpu_events(trace)
    # the launch calls (start, duration), by correlation id, from any host thread
    launches = {e["args"]["correlation"]: (float(e["ts"]), float(e.get("dur", 0.0)))
                for e in trace.get("traceEvents", [])
                if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {}) and "ts" in e}
    streams: Dict[int, StreamBusy] = {}
    calls_counted: Set[int] = set()  # a graph launch queues many kernels: its call counts once
    for e in events:
        args = e.get("args", {})
        sid = int(args.get("stream", e.get("tid", -1)))
        s = streams.setdefault(sid, StreamBusy(sid))
        dur = float(e["dur"])
        s.busy_us += dur
        s.count += 1
        s.by_name[e["name"]] = s.by_name.get(e["name"], 0.0) + dur
        correlation = args.get("correlation")
        if correlation in launches:
            call_start, call_us = launches[correlation]
            s.delays_us.append(max(0.0, float(e["ts"]) - (call_start + call_us)))
            if correlation not in calls_counted:
                calls_counted.add(correlation)
                s.calls_us.append(call_us)
    return sorted(streams.values(), key=lambda s: -s.busy_us)


def busy_union_us(trace: dict) -> Tuple[float, float]:
    """(µs the GPU ran anything, on any stream; µs from the first GPU event's start to the last's end)."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in _gpu_events(trace))
    busy, end = 0.0, spans[0][0]
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy, max(stop for _, stop in spans) - spans[0][0]


def format_stream_busy(streams: Sequence[StreamBusy], steps: int, top: int = 4, name_width: int = 48,
                       max_streams: int = 5) -> List[str]:
    """One line per stream, busiest first: ms of GPU work per step, how many kernels and copies,
    how long they waited to start (over those whose launch the trace holds), the largest by
    name. Past ``max_streams``, the rest share one line (nvImageCodec alone makes dozens of
    streams, each with a little work)."""
    def line(label: str, group: Sequence[StreamBusy]) -> str:
        by_name: Dict[str, float] = {}
        for s in group:
            for name, us in s.by_name.items():
                by_name[name] = by_name.get(name, 0.0) + us
        busy, count = sum(s.busy_us for s in group), sum(s.count for s in group)
        delays = [d for s in group for d in s.delays_us]
        calls = [c for s in group for c in s.calls_us]
        largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
        names = ", ".join(f"{name[:name_width]} {us / steps / 1e3:.2f}" for name, us in largest)
        waited = ""
        if delays:
            waited = (f"; launch to start median {_quantile(delays, 0.5):.0f} us, p90 {_quantile(delays, 0.9):.0f} us "
                      f"(of {len(delays)}/{count}); launch calls median {_quantile(calls, 0.5):.0f} us, "
                      f"p90 {_quantile(calls, 0.9):.0f} us")
        return (f"{label}: {busy / steps / 1e3:.2f} ms/step in {count / steps:.0f} kernels+copies/step{waited}; "
                f"largest (ms/step): {names}")

    lines = [line(f"stream {s.stream}", [s]) for s in streams[:max_streams]]
    rest = streams[max_streams:]
    if rest:
        lines.append(line(f"{len(rest)} more streams", rest))
    return lines
