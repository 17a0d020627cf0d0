"""Fixed cost of one native batch call: ``decode_batch`` and ``Engine.run`` on tiny images;
and the routing a pipeline with a GPU decoder does per batch.

Exact command (the number issue #13's typed engine contract was checked against):

    python benchmarks/bench_call_overhead.py --json call_overhead.json

Data: ``--batch`` (default 4) JPEGs of 32x32, decoded to 32x32 with RandomResizedCrop on one
native thread, so the decode itself is a few microseconds and the time per call is mostly
what Python and the binding layer add per batch; the empty-batch row is that cost alone (argument checks, the transform spec, the
batch report). With one thread the engine works on the calling thread, so that thread's CPU
time (``time.thread_time``) is the whole cost of a call and, unlike wall time, does not grow
when other processes take the cores. Each round times ``--calls`` calls; reported: median
CPU and wall microseconds per call over ``--repeats`` rounds, with the CPU min and max.
Compare builds by running this script against each in turn, several times interleaved.

The ``route`` row: ``fastdata.decoders.routing.route`` over a planned batch of ``--route-rows``
photo-like 500x375 JPEGs (16 distinct ones repeated) between a decoder taking
``gpu_decodable`` rows (nvJPEG's and DALI's rule) and the native one: the producer thread's
Python per batch for the choice of decoder (measured on the calling thread, as above).
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

import fastdata
from fastdata.cli.demo import photo_like_jpeg
from fastdata.decoders.base import PlannedBatch
from fastdata.decoders.native import NativeDecoder
from fastdata.decoders.routing import gpu_decodable, plan_batch, route


def tiny_jpegs(n: int, size: int = 32) -> List[bytes]:
    rng = np.random.default_rng(0)
    datas = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        datas.append(buf.getvalue())
    return datas


class _GpuDecodable:
    """A stand-in GPU decoder for routing: it takes what nvJPEG and DALI take."""

    name = "gpu-decodable"

    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        return gpu_decodable(batch)


def routed_batch(engine: "fastdata.Engine", rows: int) -> Tuple[PlannedBatch, list]:
    """A planned batch of ``rows`` photo-like JPEGs and the decoders to route it between."""
    distinct = [photo_like_jpeg(0, i, 500, 375) for i in range(16)]
    items = [distinct[i % 16] for i in range(rows)]
    transform = fastdata.RandomResizedCrop(224)
    batch = plan_batch(items, np.arange(rows), 0, [None] * rows, engine, transform, seed=0)
    return batch, [_GpuDecodable(), NativeDecoder(engine, transform, seed=0)]


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> Dict[str, float]:
    fn()  # warm-up: the shared engine and its threads exist before timing
    cpu, wall = [], []
    for _ in range(repeats):
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            fn()
        cpu.append((time.thread_time() - c0) / calls * 1e6)
        wall.append((time.perf_counter() - t0) / calls * 1e6)
    return {"cpu_median_us": statistics.median(cpu), "cpu_min_us": min(cpu), "cpu_max_us": max(cpu),
            "wall_median_us": statistics.median(wall)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--route-rows", type=int, default=256)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    datas = tiny_jpegs(args.batch)
    rrc = fastdata.RandomResizedCrop(32)
    out = np.empty((args.batch, 32, 32, 3), np.uint8)
    empty = np.empty((0, 32, 32, 3), np.uint8)  # an empty batch: nothing but the fixed cost
    engine = fastdata.Engine(threads=1)
    rows = {
        "decode_batch": per_call_us(lambda: fastdata.decode_batch(datas, rrc, out, threads=1), args.calls,
                                    args.repeats),
        "Engine.run": per_call_us(lambda: engine.run(datas, rrc, out), args.calls, args.repeats),
        "Engine.run([])": per_call_us(lambda: engine.run([], rrc, empty), args.calls, args.repeats),
    }
    batch, deciders = routed_batch(engine, args.route_rows)
    rows["route"] = per_call_us(lambda: route(batch, deciders), max(1, args.calls // 10), args.repeats)
    engine.close()
    for name, r in rows.items():
        what = (f"batch of {args.route_rows} 500x375" if name == "route" else f"batch {args.batch} of 32x32")
        print(f"{name:15s} CPU {r['cpu_median_us']:6.1f} us/call (min {r['cpu_min_us']:.1f}, max {r['cpu_max_us']:.1f}), "
              f"wall {r['wall_median_us']:6.1f}; {args.repeats} rounds, {what}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
