"""Lossless progressive -> baseline transcoding (fastdata-convert's default) on the demo set.

Exact command (2-core CPU box; run on an otherwise idle machine):

    /work/venv/bin/python benchmarks/bench_transcode.py --json bench_transcode.json

Data: ``fastdata.cli.demo.ensure_demo()`` (500 photo-like JPEGs, 10% progressive).

Rows:
* decode: ms per image of ``fastdata.decode_batch`` with RandomResizedCrop(224), one
  thread, over the demo set's progressive files as they are and after
  ``_C.transcode_to_baseline`` (the same pixels), plus its baseline 4:2:0 files for
  reference. Every round decodes each set ``--epochs`` times (new crops per epoch).
* load: ``fastdata.Loader`` img/s (``--threads`` threads, batch 64, RandomResizedCrop(224),
  uint8, CPU) over two LMDBs converted from the demo set, with and without
  ``--keep-progressive``: fastdata-bench's LMDB contender timed by its runner
  (fastdata.cli.bench_runner: warm-up excluded, timed images / timed seconds), ``--seconds``
  per measurement, start-up and warm-up included.
* bytes: the progressive files' size before and after transcoding (convert's summary).

Method: ``--repeats`` rounds, the variants interleaved within a round (order reversed
every other round) after one untimed warm-up round; median with min..max. The machine
is shared, so the load rows also report the per-round ratio transcoded / kept, which
cancels most of the drift that other processes cause.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import fastdata
from fastdata import _C
from fastdata.cli import bench_contenders, bench_runner, demo
from fastdata.cache.build.writer import convert
from fastdata.io.host import usable_cores
from fastdata.sources.lmdb import LMDBSource


def summarize(xs: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def decode_ms(datas: List[bytes], epochs: int, seed: int) -> float:
    """ms per image: RandomResizedCrop(224) decode on one native thread."""
    rrc = fastdata.RandomResizedCrop(224)
    t0 = time.perf_counter()
    for e in range(epochs):
        fastdata.decode_batch(datas, rrc, threads=1, seed=seed, epoch=e)
    return (time.perf_counter() - t0) * 1e3 / (epochs * len(datas))


def load_rate(path: str, threads: int, seconds: float) -> float:
    """img/s of fastdata-bench's LMDB contender over ``path`` (uint8 out, CPU)."""
    job = bench_contenders.Job(paths=[], labels=[], classes=[], lmdb=Path(path), batch_size=64, device="cpu",
                               dtype="uint8", workers=threads)
    r = bench_runner.measure(bench_contenders.FastdataContender("lmdb"), job, seconds)
    if r["status"] != "ok":
        raise RuntimeError(f"loading {path} failed: {r['reason']}")
    return r["images_per_s"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--epochs", type=int, default=4, help="decode rows: passes over each set per round")
    p.add_argument("--seconds", type=float, default=4.0, help="load rows: seconds per measurement")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None, help="where the two LMDBs go (default: a temp dir)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    root = demo.ensure_demo()
    images = demo.read_manifest(root)["images"]
    read = lambda kind: [(root / e["path"]).read_bytes() for e in images if e["kind"] == kind]  # noqa: E731
    progressive = read("progressive")
    baseline = read("baseline")
    transcoded = [_C.transcode_to_baseline(d, 0) for d in progressive]
    decode_sets = {"progressive (as stored)": progressive, "progressive -> baseline": transcoded,
                   "baseline 4:2:0 (reference)": baseline}

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_transcode_"))
    dbs = {"--keep-progressive": str(work / "keep"), "transcoded (default)": str(work / "transcoded")}
    summaries = {}
    for label, path in dbs.items():
        if not os.path.exists(os.path.join(path, "data.mdb")):
            s = convert(str(root), path, keep_progressive=label == "--keep-progressive", workers=args.threads)
            summaries[label] = s.text()

    dec: Dict[str, List[float]] = {k: [] for k in decode_sets}
    load: Dict[str, List[float]] = {k: [] for k in dbs}
    for r in range(args.repeats + 1):  # round 0 warms caches and allocators, untimed
        for k, datas in decode_sets.items():
            ms = decode_ms(datas, args.epochs, seed=r)
            if r:
                dec[k].append(ms)
        for k, path in (list(dbs.items()) if r % 2 else list(dbs.items())[::-1]):
            rate = load_rate(path, args.threads, args.seconds if r else 1.0)
            if r:
                load[k].append(rate)

    meta = LMDBSource(dbs["transcoded (default)"]).meta
    res = {
        "command": "benchmarks/bench_transcode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cores": usable_cores(), "threads": args.threads, "repeats": args.repeats,
        "files": {k: len(v) for k, v in decode_sets.items()},
        "decode_ms_per_image_1_thread": {k: summarize(v) for k, v in dec.items()},
        "loader_img_per_s": {k: summarize(v) for k, v in load.items()},
        "loader_ratio_transcoded_over_kept": summarize(
            [a / b for a, b in zip(load["transcoded (default)"], load["--keep-progressive"])]),
        "transcoded": meta["transcoded"],
        "transcoded_bytes_in": meta["transcoded_bytes_in"], "transcoded_bytes_out": meta["transcoded_bytes_out"],
        "convert_summaries": summaries,
    }
    print(f"# demo set {root}: {len(images)} images; {res['cores']} cores; {args.repeats} rounds, median (min..max)")
    print(f"{'decode RRC224, 1 thread (ms/img)':<40}{'median':>9}{'min':>9}{'max':>9}")
    for k, v in res["decode_ms_per_image_1_thread"].items():
        print(f"{k + f' [{len(decode_sets[k])}]':<40}{v['median']:>9.2f}{v['min']:>9.2f}{v['max']:>9.2f}")
    print(f"{f'Loader, {args.threads} threads, batch 64 (img/s)':<40}{'median':>9}{'min':>9}{'max':>9}")
    for k, v in res["loader_img_per_s"].items():
        print(f"{k:<40}{v['median']:>9.0f}{v['min']:>9.0f}{v['max']:>9.0f}")
    ratio = res["loader_ratio_transcoded_over_kept"]
    print(f"{'ratio transcoded / kept, per round':<40}{ratio['median']:>9.2f}{ratio['min']:>9.2f}{ratio['max']:>9.2f}")
    print(f"transcoded {meta['transcoded']} files: {meta['transcoded_bytes_in'] / 1e6:.2f} MB -> "
          f"{meta['transcoded_bytes_out'] / 1e6:.2f} MB "
          f"({100 * (meta['transcoded_bytes_out'] / meta['transcoded_bytes_in'] - 1):+.1f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
