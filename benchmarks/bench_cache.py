"""Caches side by side: loader throughput from a folder, LMDB and RAM; convert throughput.

Exact command (docs/results.md's cache table comes from it; 2-core CPU box):

    /work/venv/bin/python benchmarks/bench_cache.py --json bench_cache.json

Data (generated into ``--workdir``, default a temp dir): ``--images`` ImageNet-like
photo-like JPEGs (``--size``, default 500x375, from ``fastdata.cli.demo.photo_like_jpeg``) in
4 class folders, and ``--big-images`` full-size "camera" photos (``--big``, default
2048x1536) for the ``--max-side`` comparison.

Rows:
* convert: ``fastdata.cli.convert.convert`` folder -> LMDB with ``--workers`` (default all
  cores), without and with ``--max-side`` (img/s, img/s per worker, MB/s read).
* fetch: Python cost per sample of ``source.fetch`` (folder = open+read, LMDB, RAM; LMDB
  as it reads by default (``verify="once"``: records hashed at their first fetch, so the
  repeated passes are the steady state), with ``verify="always"`` (every fetch hashes every
  record) and ``verify=False``: the difference is the per-record SHA-256 check).
* load: one epoch of RandomResizedCrop(224) batches of 64 in shuffled order, decoded by
  ``fastdata.Loader`` (folder items are paths read by the native threads). Warm = page cache warm (one
  untimed pass first); cold = after ``echo 3 > /proc/sys/vm/drop_caches`` (root only; the
  table says when it could not drop). RAM is warm by definition.
* load big: the same loader over the full-size photos (folder) against their
  ``--max-side`` LMDB. Target: >= 2x.

Method: ``--repeats`` rounds, rows interleaved within a round; median with min..max.
The load rows time whole epochs (start-up included) with their own clock rather than
fastdata-bench's runner (fastdata.cli.bench_runner), on purpose: a cold row must time the
first read of every file after the page cache was dropped, and the runner's warm-up would
read them first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import fastdata
from fastdata.cache.build.writer import convert
from fastdata.cli.demo import photo_like_jpeg
from fastdata.io.host import usable_cores
from fastdata.sources.lmdb import LMDBSource
from fastdata.sources.ram import RAMCache

BATCH = 64


def folder_source(root: Path) -> Any:
    return fastdata.ImageFolder(str(root))


def make_data(root: Path, n: int, size: Tuple[int, int], classes: int = 4) -> int:
    total = 0
    for i in range(n):
        d = root / f"c{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        data = photo_like_jpeg(7, i, *size)
        (d / f"{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return total


def drop_caches() -> bool:
    """Drop the page cache (root only); True when the kernel accepted the request.

    Not judged by /proc/meminfo's Cached: on a shared machine others refill it at once."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def loader_epoch(source: Any, threads: int, seed: int) -> float:
    """Seconds for one shuffled epoch of RandomResizedCrop(224) uint8 batches."""
    rrc = fastdata.RandomResizedCrop(224)
    t0 = time.perf_counter()
    loader = fastdata.Loader(source, BATCH, transform=rrc, shuffle=True, seed=seed, drop_last=False, threads=threads,
                             backend="native")  # caches against each other: the native engine on any box
    for _ in loader:
        pass
    return time.perf_counter() - t0


def fetch_cost(source: Any, reps: int = 5) -> float:
    """Median µs per sample of source.fetch over shuffled batches of 256 (bytes realised)."""
    order = np.random.default_rng(0).permutation(len(source))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for lo in range(0, len(order), 256):
            items = source.fetch(order[lo:lo + 256])
            if items and isinstance(items[0], str):  # a folder's cost is opening and reading
                for p in items:
                    with open(p, "rb") as f:
                        f.read()
        times.append((time.perf_counter() - t0) / len(order) * 1e6)
    return statistics.median(times)


def summarize(xs: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--size", default="500x375")
    p.add_argument("--big-images", type=int, default=48)
    p.add_argument("--big", default="2048x1536")
    p.add_argument("--max-side", type=int, default=320)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="loader threads (default: usable cores)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-cold", action="store_true", help="skip the cold-cache rows (they drop the global page cache)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    cores = usable_cores()
    workers = args.workers or cores
    threads = args.threads or cores
    size = tuple(int(v) for v in args.size.split("x"))
    big = tuple(int(v) for v in args.big.split("x"))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_cache_"))
    for sub in ("folder", "big", "db", "db_small", "big_db", "big_small"):
        shutil.rmtree(work / sub, ignore_errors=True)
    res: Dict[str, Any] = {"command": " ".join([sys.executable] + sys.argv), "machine": platform.node(),
                           "cores": cores, "workers": workers, "threads": threads, "images": args.images,
                           "size": args.size, "big_images": args.big_images, "big": args.big,
                           "max_side": args.max_side, "via": "Loader"}
    try:
        bytes_small = make_data(work / "folder", args.images, size)
        bytes_big = make_data(work / "big", args.big_images, big)
        res["bytes"] = {"folder": bytes_small, "big": bytes_big}

        # ---- convert
        conv: Dict[str, Any] = {}
        for name, src, dst, ms, n, nbytes in [
            ("folder", "folder", "db", None, args.images, bytes_small),
            (f"folder --max-side {args.max_side}", "folder", "db_small", args.max_side, args.images, bytes_small),
            ("big", "big", "big_db", None, args.big_images, bytes_big),
            (f"big --max-side {args.max_side}", "big", "big_small", args.max_side, args.big_images, bytes_big),
        ]:
            t0 = time.perf_counter()
            s = convert(str(work / src), str(work / dst), max_side=ms, workers=workers)
            dt = time.perf_counter() - t0
            conv[name] = {"img_s": n / dt, "img_s_per_worker": n / dt / workers, "mb_s": nbytes / dt / 1e6,
                          "bytes_out": s.bytes_out, "seconds": dt}
        res["convert"] = conv

        sources = {
            "folder": folder_source(work / "folder"),
            "lmdb": LMDBSource(str(work / "db")),
        }
        sources["ram"] = RAMCache(sources["lmdb"], key=f"bench-{os.getpid()}")
        big_sources = {"big folder": folder_source(work / "big"),
                       f"big lmdb --max-side {args.max_side}": LMDBSource(str(work / "big_small"))}
        res["fetch_us_per_sample"] = {k: fetch_cost(v) for k, v in sources.items()}
        # LMDBSource's default (verify="once") hashes a record at its first fetch only: its row above
        # is the steady state; the SHA-256 check of every record on every read, side by side
        res["fetch_us_per_sample"]["lmdb verify=always"] = fetch_cost(LMDBSource(str(work / "db"), verify="always"))
        res["fetch_us_per_sample"]["lmdb verify=False"] = fetch_cost(LMDBSource(str(work / "db"), verify=False))

        # ---- load, warm (interleaved rounds after one untimed pass each)
        warm: Dict[str, List[float]] = {k: [] for k in list(sources) + list(big_sources)}
        for k, v in {**sources, **big_sources}.items():
            loader_epoch(v, threads, 0)
        for r in range(args.repeats):
            for k, v in {**sources, **big_sources}.items():
                warm[k].append(len(v) / loader_epoch(v, threads, r + 1))
        res["load_warm_img_s"] = {k: summarize(v) for k, v in warm.items()}

        # ---- load, cold
        cold: Dict[str, Any] = {}
        if args.no_cold:
            res["cold"] = "skipped (--no-cold)"
        else:
            ok = True
            for k in ("folder", "lmdb"):
                xs = []
                for r in range(args.repeats):
                    if not drop_caches():
                        ok = False
                        break
                    xs.append(len(sources[k]) / loader_epoch(sources[k], threads, r + 1))
                if not ok:
                    break
                cold[k] = summarize(xs)
            res["cold"] = "dropped with /proc/sys/vm/drop_caches" if ok else "could not drop the page cache (not root?)"
        res["load_cold_img_s"] = cold
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    # ---- table
    print(f"# {res['command']}")
    print(f"# {cores} cores, convert workers={workers}, loader threads={threads} via {res['via']}; "
          f"{args.images} x {args.size} + {args.big_images} x {args.big} photo-like JPEGs")
    print(f"{'convert':<34}{'img/s':>9}{'/worker':>9}{'MB/s in':>9}{'MB out':>9}")
    for k, v in res["convert"].items():
        print(f"{k:<34}{v['img_s']:>9.0f}{v['img_s_per_worker']:>9.0f}{v['mb_s']:>9.1f}{v['bytes_out'] / 1e6:>9.1f}")
    print(f"{'fetch (Python, per sample)':<34}" + "  ".join(f"{k} {v:.1f} µs" for k, v in res["fetch_us_per_sample"].items()))
    print(f"{'load RRC224 (img/s)':<34}{'median':>9}{'min':>9}{'max':>9}")
    for label, table in (("warm", res["load_warm_img_s"]), ("cold", res["load_cold_img_s"])):
        for k, v in table.items():
            print(f"{label + ' ' + k:<34}{v['median']:>9.0f}{v['min']:>9.0f}{v['max']:>9.0f}")
    print(f"cold: {res['cold']}")
    lw = res["load_warm_img_s"]
    ratio_lmdb = lw["lmdb"]["median"] / lw["folder"]["median"]
    ratio_big = lw[f"big lmdb --max-side {args.max_side}"]["median"] / lw["big folder"]["median"]
    res["ratios"] = {"lmdb_vs_warm_folder": ratio_lmdb, "max_side_vs_full_size": ratio_big}
    print(f"LMDB / warm folder: {ratio_lmdb:.2f}x (target >= 1.0); "
          f"--max-side {args.max_side} LMDB / full-size folder: {ratio_big:.2f}x (target >= 2)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
