"""Where a Loader's batch time goes, step by step: the producer thread's steps and the gpu decoder's stages.

Issue 14's hybrid loses a third of its GPU side beside busy native threads (H200, 8,192 set, 2026-12-05:
11,796 GPU rows/s against 18,371 alone) while neither side is saturated (the engines busy 66%, the native
threads 81% of the time). Whether the producer thread's own loop (plan, route, start, wait, upload) is the
pace, or one side keeps the other waiting, is what this prints: each step's wall time per batch and its share
of the timed window, per thread kind, from clocks wrapped around the steps (this script only: the Loader
itself is not changed), and the calling thread's CPU time in the step; then each thread kind's whole CPU
time in the window, per batch (``thread_cpu_seconds``), so that the CPU outside the wrapped steps shows too,
with its minor page faults (``thread_minor_faults``: fresh memory touched, such as file buffers malloc
gave back to the kernel and took again).
The forty-second session's proof put gpu-only's producer thread at 0.89 cores (53 us per row) against
hybrid's 21 us per row: the CPU column is there to say where that goes.

    python benchmarks/bench_producer_timeline.py /tmp/set8192 --device cuda --backend hybrid --seconds 10
    python benchmarks/bench_producer_timeline.py /tmp/set8192 --device cuda --backend hybrid --depth 5

The steps (fastdata/loader/producer.py, pipeline.py, decoders/nvimgcodec.py):

* producer ``start``: ``fetch`` (the source) + ``submit``: ``plan`` (read bytes and plan crops on the
  inline engine), ``route``, ``gpu_start``, ``queue_native``;
* producer ``finish``: ``decode`` (``wait_native`` for the batch's native run, ``wait_gpu`` for its GPU
  rows) + ``deliver`` (upload, placement, normalize); ``queue_put_wait``: room in the consumer's queue;
* gpu decoder threads: ``gpu_decode_stage`` (the nvImageCodec calls of one batch, per lane) and
  ``gpu_resample_stage`` (waiting for that, the resample kernels, the stream sync).

The knobs set the module defaults the decoders and the pipeline read at construction: ``--depth``
(nvimgcodec.DEPTH and HYBRID_DEPTH, batches in flight), ``--lanes`` (DECODE_LANES and HYBRID_DECODE_LANES), ``--inline`` (pipeline.INLINE_THREADS_GPU),
``--host-cores`` (HYBRID_HOST_CORES). With ``--device cpu --backend native`` it runs anywhere (the CI
checks it does).
"""
from __future__ import annotations

import argparse
import collections
import functools
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loader_window import add_loader_args, make_loader, timed_window  # noqa: E402

from fastdata.decoders import native as native_decoder  # noqa: E402
from fastdata.loader import pipeline as pipeline_mod  # noqa: E402
from fastdata.io.host import thread_cpu_seconds, thread_minor_faults  # noqa: E402
from fastdata.loader import producer as producer_mod  # noqa: E402

# (thread name, step, start, end, the thread's CPU seconds in it) of every step that ended inside the timed window
_SPANS: List[Tuple[str, str, float, float, float]] = []
_TIMING = [False]


def _clock(owner: Any, attr: str, step: str) -> None:
    """Wrap ``owner.attr`` so that each call inside the timed window is recorded as ``step``."""
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            if _TIMING[0]:
                _SPANS.append((threading.current_thread().name, step, t0, time.perf_counter(), time.thread_time() - c0))
    setattr(owner, attr, timed)


def _wrap_steps(gpu: bool) -> None:
    for owner, attr, step in (
            (pipeline_mod, "plan_batch", "plan"), (pipeline_mod, "route", "route"),
            (pipeline_mod.BatchPipeline, "_start_native", "queue_native"), (pipeline_mod.BatchPipeline, "submit", "submit"),
            (native_decoder.NativeDecoder, "finish", "wait_native"),
            (pipeline_mod.BatchPipeline, "decode", "decode"), (pipeline_mod.BatchPipeline, "deliver", "deliver"),
            (producer_mod.BatchProducer, "start", "start"), (producer_mod.BatchProducer, "finish", "finish"),
            (producer_mod.BatchProducer, "_fetch", "fetch"), (producer_mod.Feed, "_put", "queue_put_wait")):
        _clock(owner, attr, step)
    if gpu:
        from fastdata.decoders import nvimgcodec

        for attr, step in (("start", "gpu_start"), ("finish", "wait_gpu"), ("_decode_stage", "gpu_decode_stage"),
                           ("_resample_stage", "gpu_resample_stage")):
            _clock(nvimgcodec.NvImageCodecDecoder, attr, step)


def thread_kind(name: str) -> str:
    """A thread's name without its pool index or object id: "fastdata-gpu-decode_1" -> "fastdata-gpu-decode"."""
    return re.sub(r"([-_][0-9a-f]{6,}|_[0-9]+)$", "", name)


def step_table(spans: List[Tuple[str, str, float, float, float]], batches: int, wall: float) -> List[Dict[str, Any]]:
    """Per (thread kind, step): calls, milliseconds per batch of wall and of the calling threads' CPU,
    share of the window (over 100% where several threads of a kind run the step at once), the
    largest first within each kind. Steps nest (submit holds plan and route): each is inclusive."""
    seconds: Dict[Tuple[str, str], float] = collections.defaultdict(float)
    cpu: Dict[Tuple[str, str], float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for thread, step, t0, t1, c in spans:
        key = (thread_kind(thread), step)
        seconds[key] += t1 - t0
        cpu[key] += c
        calls[key] += 1
    return [{"thread": kind, "step": step, "calls": calls[(kind, step)], "ms_per_batch": 1000 * s / batches,
             "cpu_ms_per_batch": 1000 * cpu[(kind, step)] / batches, "share": s / wall}
            for (kind, step), s in sorted(seconds.items(), key=lambda kv: (kv[0][0], -kv[1]))]


def _set_defaults(args: argparse.Namespace, gpu: bool) -> None:
    """The knobs given, into the module defaults read when the Loader is made."""
    settings = [(pipeline_mod, "INLINE_THREADS_GPU", args.inline), (pipeline_mod, "HYBRID_HOST_CORES", args.host_cores)]
    if gpu:
        from fastdata.decoders import nvimgcodec

        settings += [(nvimgcodec, "DEPTH", args.depth), (nvimgcodec, "DECODE_LANES", args.lanes),
                     (nvimgcodec, "HYBRID_DEPTH", args.depth), (nvimgcodec, "HYBRID_DECODE_LANES", args.lanes)]
    for module, name, value in settings:
        if value is not None:
            setattr(module, name, value)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    gpu = args.backend in ("gpu", "hybrid")
    _set_defaults(args, gpu)
    _wrap_steps(gpu)
    loader = make_loader(args)
    cpu_at: List[Dict[str, float]] = []  # every thread kind's CPU seconds at the window's two ends
    faults_at: List[Dict[str, int]] = []  # and its minor page faults

    def mark(timing: bool) -> None:
        cpu_at.append(thread_cpu_seconds())
        faults_at.append(thread_minor_faults())
        _TIMING[0] = timing
    try:
        s0, s1, batches, wall = timed_window(loader, args.warmup, args.seconds,
                                             on_start=lambda: mark(True), on_end=lambda: mark(False))
    finally:
        loader.close()
    threads_cpu = {k: 1000 * (v - cpu_at[0].get(k, 0.0)) / batches for k, v in cpu_at[1].items()
                   if v - cpu_at[0].get(k, 0.0) > 0}
    faults = {k: (v - faults_at[0].get(k, 0)) / batches for k, v in faults_at[1].items()}
    return {"backend": args.backend, "label": args.label, "images_per_s": batches * args.batch_size / wall,
            "ms_per_batch": 1000 * wall / batches, "batches": batches, "wall": wall,
            "gpu_rows": s1.gpu_rows - s0.gpu_rows, "native_rows": s1.native_rows - s0.native_rows,
            "native_occupancy": (s1.native_run_seconds - s0.native_run_seconds) / wall,
            "steps": step_table(_SPANS, batches, wall),
            "thread_cpu_ms_per_batch": dict(sorted(threads_cpu.items(), key=lambda kv: -kv[1])),
            "thread_minor_faults_per_batch": {k: faults.get(k, 0.0) for k in threads_cpu}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_loader_args(p, device="cuda", backend="hybrid", seconds=10.0, warmup=30)
    p.add_argument("--depth", type=int, default=None, help="gpu decoder batches in flight, either backend (nvimgcodec.DEPTH, HYBRID_DEPTH)")
    p.add_argument("--lanes", type=int, default=None, help="gpu decoder lanes, either backend (nvimgcodec.DECODE_LANES, HYBRID_DECODE_LANES)")
    p.add_argument("--inline", type=int, default=None, help="planning threads (pipeline.INLINE_THREADS_GPU)")
    p.add_argument("--host-cores", type=int, default=None, help="cores hybrid leaves to the GPU's feeders")
    p.add_argument("--label", default="", help="a name for this setting in the output")
    args = p.parse_args()
    r = run(args)
    print(f"{r['backend']} {r['label']}: {r['images_per_s']:,.0f} img/s, {r['ms_per_batch']:.2f} ms per batch over "
          f"{r['wall']:.1f} s; GPU rows {r['gpu_rows']}, native rows {r['native_rows']}, native threads had a run "
          f"{100 * r['native_occupancy']:.0f}% of the time")
    print("| thread | step | calls | ms per batch | CPU ms per batch | share of the window |")
    print("|---|---|---:|---:|---:|---:|")
    for s in r["steps"]:
        print(f"| {s['thread']} | {s['step']} | {s['calls']} | {s['ms_per_batch']:.2f} | {s['cpu_ms_per_batch']:.2f} "
              f"| {100 * s['share']:.0f}% |")
    print("\n| thread (OS name) | CPU ms per batch, whole window | minor page faults per batch |")
    print("|---|---:|---:|")
    for name, ms in r["thread_cpu_ms_per_batch"].items():
        print(f"| {name} | {ms:.2f} | {r['thread_minor_faults_per_batch'][name]:.0f} |")


if __name__ == "__main__":
    main()
