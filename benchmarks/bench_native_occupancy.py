"""Where a Loader's native threads idle: no run queued, or inside a run while its last rows finish.

For each run (its own Loader, after ``--warmup`` batches, timed for ``--seconds``), from the
Loader's own counters (``LoaderStats.native_run_seconds`` and ``native_busy_seconds``):

* occupancy: share of the window the native threads had a queued batch (run) to decode; the
  rest they waited for the producer to queue one;
* busy in runs: share of the threads' time inside those runs spent reading and decoding; the
  rest they waited with no row left to claim (with ``_C._set_overlap_runs(False)``: for a
  run's last rows, each run ending at a barrier before the next starts; without it, only when
  the rows of every run queued are claimed);
* native cores: busy seconds over the window.

``--switch claim`` alternates the engine's claim order (rows largest encoded size first, or the
batch's order: ``_C._set_claim_largest_first``) across the runs, in one process; ``--switch
overlap`` whether a queued run's rows may start before the run ahead of it has ended
(``_C._set_overlap_runs``); ``--switch progressive`` whether progressive JPEGs take fastdata's
Huffman decoder or libjpeg-turbo's (``_C._set_fast_progressive``). The other switches stay at
their defaults.

    python benchmarks/bench_native_occupancy.py /tmp/mixed --device cuda --backend hybrid --runs 4 --switch overlap
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loader_window import add_loader_args, make_loader, timed_window  # noqa: E402

import fastdata  # noqa: E402
from fastdata import _C  # noqa: E402


SWITCHES = {"claim": "_set_claim_largest_first", "overlap": "_set_overlap_runs",
            "progressive": "_set_fast_progressive"}


def one_run(args: argparse.Namespace, on: bool) -> dict:
    getattr(_C, SWITCHES[args.switch])(on)
    loader = make_loader(args)
    try:
        s0, s1, _, _ = timed_window(loader, args.warmup, args.seconds)
    finally:
        loader.close()
    return _deltas(s0, s1, f"{args.switch} {'on' if on else 'off'}")


def _deltas(s0: "fastdata.LoaderStats", s1: "fastdata.LoaderStats", setting: str) -> dict:
    wall = s1.wall_seconds - s0.wall_seconds
    run = s1.native_run_seconds - s0.native_run_seconds
    busy = s1.native_busy_seconds - s0.native_busy_seconds
    rows = (s1.gpu_rows - s0.gpu_rows) + (s1.native_rows - s0.native_rows)
    return {"setting": setting, "img_s": (s1.images - s0.images) / wall,
            "gpu_share": (s1.gpu_rows - s0.gpu_rows) / rows if rows else 0.0, "occupancy": run / wall,
            "busy_in_runs": busy / (s1.threads * run) if run > 0 else 0.0, "native_cores": busy / wall,
            "threads": s1.threads, "cpu_cores": (s1.cpu_seconds - s0.cpu_seconds) / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_loader_args(p, device="cpu", backend="native", seconds=15.0, warmup=20)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--switch", choices=sorted(SWITCHES), default="claim", help="the A/B switch to alternate")
    p.add_argument("--order", default="off,on", help="the switch's settings in turn")
    args = p.parse_args()
    settings = [c.strip() == "on" for c in args.order.split(",")]
    try:
        rows = [one_run(args, settings[i % len(settings)]) for i in range(args.runs)]
    finally:
        getattr(_C, SWITCHES[args.switch])(True)
    print(f"{args.root}, backend={args.backend}, {args.device}, batch {args.batch_size}, {args.seconds:g} s per run")
    print("| setting | img/s | GPU share | native threads | occupancy | busy in runs | native cores | process cores |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setting']} | {r['img_s']:,.0f} | {r['gpu_share']:.2f} | {r['threads']} | {r['occupancy']:.0%} | "
              f"{r['busy_in_runs']:.0%} | {r['native_cores']:.1f} | {r['cpu_cores']:.1f} |")


if __name__ == "__main__":
    main()
