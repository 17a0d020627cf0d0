"""Loader and decode_batch from two LMDB caches of the same images, interleaved: cache format 1
(the source bytes) against format 2 (restart-indexed records), by wall clock and by CPU time.

Exact commands (2-core box, docs/results.md "Restart-indexed caches"):

    # format 1 cache: fastdata-convert of a checkout before format 2; format 2: this one
    python benchmarks/bench_restart_index.py /tmp/ri/in-v1 /tmp/ri/in-v2 --rounds 7 --batches 10

Method: RandomResizedCrop(224), float32 normalized on the CPU, 2 threads, batch 64; each
round runs, for each cache, the Loader (first batch of the iteration not timed) and then
``decode_batch`` (uint8) over the same records, so drift on a shared machine hits every row
alike. Reported: medians over rounds of images per wall second and per CPU-second of this
process (all its threads: the shared box's other load does not count), and per-round paired
ratios (format 2 / format 1, Loader / decode_batch).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Dict, List, Tuple

import numpy as np

import fastdata


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", help="LMDB cache A (e.g. format 1)")
    p.add_argument("new", help="LMDB cache B (e.g. format 2) of the same images")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=10, help="timed batches per Loader run (batch 64)")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    bs, nb = 64, a.batches
    rrc = fastdata.RandomResizedCrop(224)
    caches = [a.old, a.new]
    srcs = {c: fastdata.LMDBSource(c) for c in caches}
    loaders = {c: fastdata.Loader(srcs[c], bs, rrc, device="cpu", threads=a.threads, seed=0) for c in caches}
    datas = {c: [bytes(b) for b in srcs[c].fetch(range(min(len(srcs[c]), bs * nb)))] for c in caches}
    out = np.empty((bs, 224, 224, 3), np.uint8)

    def loader(c: str, r: int) -> Tuple[float, float]:
        it = iter(loaders[c])
        next(it)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(nb):
            next(it)
        return bs * nb / (time.perf_counter() - t0), bs * nb / (time.process_time() - c0)

    def decode_batch(c: str, r: int) -> Tuple[float, float]:
        d = datas[c]
        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(0, len(d), bs):
            part = d[k:k + bs]
            fastdata.decode_batch(part, rrc, out[:len(part)], seed=0, epoch=r, threads=a.threads)
        return len(d) / (time.perf_counter() - t0), len(d) / (time.process_time() - c0)

    res: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    for r in range(a.rounds):
        for c in caches:
            for kind, fn in (("Loader", loader), ("decode_batch", decode_batch)):
                res.setdefault((kind, c), []).append(fn(c, r))
    med = statistics.median
    for (kind, c), v in res.items():
        print(f"{kind:12s} {os.path.basename(c.rstrip('/')):24s} wall {med([x[0] for x in v]):7.0f} img/s   "
              f"per CPU-s {med([x[1] for x in v]):7.0f}")
    for c in caches:
        pairs = list(zip(res[("Loader", c)], res[("decode_batch", c)]))
        print(f"{os.path.basename(c.rstrip('/'))}: Loader / decode_batch (paired) wall "
              f"{med([x[0] / y[0] for x, y in pairs]):.3f}, per CPU-s {med([x[1] / y[1] for x, y in pairs]):.3f}")
    for kind in ("Loader", "decode_batch"):
        pairs = list(zip(res[(kind, a.old)], res[(kind, a.new)]))
        print(f"{kind}: B / A (paired) wall {med([y[0] / x[0] for x, y in pairs]):.3f}, "
              f"per CPU-s {med([y[1] / x[1] for x, y in pairs]):.3f}")
    for loader_ in loaders.values():
        loader_.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
