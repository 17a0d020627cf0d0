"""What the Loader costs on top of its engine: ``fastdata.Loader`` against ``decode_batch`` on
the same samples, interleaved, by wall clock and by CPU time, with the Loader's CPU time split
by thread.

Exact command (2-core box, docs/results.md "The Loader against its engine"):

    python benchmarks/bench_loader_overhead.py DATA --rounds 7 --batches 24

DATA is an ImageFolder or a fastdata LMDB cache. Method: RandomResizedCrop(224), 2 threads,
batch 64. Each round r, in turn (so drift on a shared box hits every row alike):

* ``decode_batch`` (uint8 NHWC): epoch r's batches 1..N as the Loader orders them, the
  items as the source's ``fetch`` returns them (paths: the native threads read the files,
  as in the Loader; LMDB: copies of the records fetched before timing, so no checksum);
* ``engine f32``: the same calls writing float32 normalized rows (``Engine.run(...,
  normalize=...)``, what the Loader's native threads do on the CPU);
* ``Loader`` uint8 and float32: a fresh iteration of epoch r, batch 0 untimed (start-up),
  batches 1..N timed, then the iteration is closed (its thread stops after the batch in
  hand, so nothing runs ahead into the next row's time). From an LMDB cache the rows
  ``loader_u8`` / ``loader_f32`` read it as ``LMDBSource`` does by default (``verify="once"``:
  records checked at their first read; each row has its own source), the rows ``*_always``
  with ``verify="always"`` (every record hashed on every fetch: the Loader before 2026-12-02)
  and ``*_off`` without the check. Round 1 is the first epoch (the "once" rows hash there
  too); ``--skip-first`` leaves it out of the medians.

Every row decodes exactly the same crops ((seed, epoch, index) keys). Reported: medians over
rounds of images per wall second and per CPU-second of the process (all its threads; other
processes on a shared box do not count), per-round paired ratios against ``decode_batch``,
and for the Loader rows the CPU seconds per batch of each thread: the consumer (main), the
producer (Python + the engine's calling thread), the engine's other native threads, and the
LMDB checksum pool. ``--json`` writes every round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import torch

import fastdata
from fastdata.io.engine import Engine
from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD
from fastdata.loader.sampler import ShardedOrder


def thread_cpu() -> Dict[int, float]:
    """CPU seconds (user + system) of every thread of this process, by native thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended between listing and reading
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def open_source(path: str) -> Any:
    if os.path.exists(os.path.join(path, "data.mdb")):
        return fastdata.LMDBSource(path, verify=False)
    return fastdata.ImageFolder(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="ImageFolder or fastdata LMDB cache")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=24, help="timed batches per row and round")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="decode_batch,engine_f32,loader_u8,loader_f32",
                   help="of decode_batch, engine_f32, loader_{u8,f32}[_{once,always,off}] (LMDB)")
    p.add_argument("--skip-first", action="store_true", help="leave round 1 out of the medians")
    p.add_argument("--json", help="write every round here")
    a = p.parse_args()
    bs, nb, threads = a.batch_size, a.batches, a.threads
    rrc = fastdata.RandomResizedCrop(224)
    src = open_source(a.data)
    lmdb = isinstance(src, fastdata.LMDBSource)
    names = a.rows.split(",")
    loaders: Dict[str, Any] = {}
    for n in names:
        if n.startswith("loader_"):
            _, dt, *verify = n.split("_")
            if verify and not lmdb:
                raise SystemExit(f"row {n}: the verify modes are for LMDB caches")
            # Each row its own source: what one row's fetches checked never counts for another.
            s = fastdata.LMDBSource(a.data, verify=verify[0] if verify else "once") if lmdb else src
            loaders[n] = fastdata.Loader(s, bs, rrc, device="cpu", threads=threads, seed=0,
                                         dtype={"u8": torch.uint8, "f32": torch.float32}[dt])
    order = ShardedOrder(len(src), bs, shuffle=True, seed=0, drop_last=True)  # the Loaders' order
    if order.num_batches < nb + 2:
        # An iteration left with its last batch unread is closed, and its thread stops. One read
        # to the end goes on into the next epoch (the Loader's lookahead) during the next rows.
        raise SystemExit(f"{len(src)} samples make {order.num_batches} batches of {bs}: need --batches + 2")
    engine = Engine(threads)
    out_u8 = np.empty((bs, 224, 224, 3), np.uint8)
    out_f32 = np.empty((bs, 224, 224, 3), np.float32)
    norm = (IMAGENET_MEAN, IMAGENET_STD)

    def epoch_items(r: int) -> List[Tuple[np.ndarray, list]]:
        """Epoch r's timed batches (1..nb): indices and the items the engine gets."""
        batches = list(order.batches(r))[1:nb + 1]
        if lmdb:  # unchecked: the Loaders' sources see every record first
            return [(idx, [bytes(v) for v in src.fetch(idx)]) for idx in batches]
        return [(idx, src.fetch(idx)) for idx in batches]

    def engine_row(normalize: bool) -> Callable[[int, Any], Dict[str, float]]:
        def run(r: int, items: Any) -> Dict[str, float]:
            out = out_f32 if normalize else out_u8
            t0, c0 = time.perf_counter(), time.process_time()
            for idx, datas in items:
                if normalize:
                    engine.run(datas, rrc, out, seed=0, epoch=r, indices=idx, normalize=norm)
                else:
                    fastdata.decode_batch(datas, rrc, out, seed=0, epoch=r, indices=idx, threads=threads)
            return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        return run

    def loader_row(name: str) -> Callable[[int, Any], Dict[str, float]]:
        loader = loaders[name]

        def run(r: int, items: Any) -> Dict[str, float]:
            loader.set_epoch(r)
            it = iter(loader)
            next(it)  # start-up: the thread, the first fetch
            producer = loader._thread._thread.native_id
            main_id = threading.main_thread().native_id
            sha = {t.native_id for t in threading.enumerate() if t.name.startswith("fastdata-sha256")}
            allocs = loader._ring.allocations
            th0, t0, c0 = thread_cpu(), time.perf_counter(), time.process_time()
            for _ in range(nb):
                next(it)
            wall, cpu, th1 = time.perf_counter() - t0, time.process_time() - c0, thread_cpu()
            it.close()
            parts = {"main": 0.0, "producer": 0.0, "native": 0.0, "sha256": 0.0}
            for tid, c in th1.items():
                d = c - th0.get(tid, 0.0)
                key = ("main" if tid == main_id else "producer" if tid == producer else
                       "sha256" if tid in sha else "native")
                parts[key] += d
            row = {"wall": wall, "cpu": cpu, "ring_allocations": loader._ring.allocations - allocs}
            row.update({f"cpu_{k}": v for k, v in parts.items()})
            return row
        return run

    rows = {"decode_batch": engine_row(False), "engine_f32": engine_row(True)}
    rows.update({n: loader_row(n) for n in loaders})
    res: Dict[str, List[Dict[str, float]]] = {n: [] for n in names}
    n_img = nb * bs
    for r in range(a.rounds):
        items = epoch_items(r)
        for n in names:
            res[n].append(rows[n](r, items))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {n_img / res[n][-1]['wall']:.0f}" for n in names),
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "batch_size": bs, "threads": threads, "batches": nb, "rounds": res}, f, indent=1)
    if a.skip_first:
        res = {n: v[1:] for n, v in res.items()}
    med = statistics.median
    print(f"\n{a.data}: {len(src)} samples, batch {bs}, {threads} threads, {nb} timed batches x {a.rounds} rounds, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'row':18s} {'img/s':>7s} {'img/CPU-s':>9s} {'wall/dbatch':>11s} {'CPU/dbatch':>10s}   "
          "CPU ms per batch: main producer native sha256 | ring allocations")
    base = res.get("decode_batch")
    for n in names:
        v = res[n]
        line = f"{n:18s} {med(n_img / x['wall'] for x in v):7.0f} {med(n_img / x['cpu'] for x in v):9.0f}"
        if base is not None:
            line += (f" {med(b['wall'] / x['wall'] for x, b in zip(v, base)):11.3f}"
                     f" {med(b['cpu'] / x['cpu'] for x, b in zip(v, base)):10.3f}")
        if "cpu_main" in v[0]:
            line += "   " + " ".join(f"{med(x['cpu_' + k] for x in v) * 1e3 / nb:6.2f}"
                                     for k in ("main", "producer", "native", "sha256"))
            line += f" | {sum(x['ring_allocations'] for x in v)}"
        print(line)
    for loader in loaders.values():
        loader.close()
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
