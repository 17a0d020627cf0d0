"""What the engine's normalized outputs cost over its uint8 output, per image, by CPU time.

Exact commands (2-core box, docs/results.md "The float32 output against the uint8 one" and
"float16 and bfloat16 written by the native threads"):

    python benchmarks/bench_float_output.py DATA --rounds 3
    python benchmarks/bench_float_output.py /tmp/set8192 --folder --rounds 3
    python benchmarks/bench_float_output.py /tmp/set8192 --folder --rounds 3 --size 299

DATA is a fastdata LMDB cache (``--folder``: an ImageFolder tree, its files read into memory
first). Method: RandomResizedCrop(``--size``, 224 by default; at 299 seven rows in eight are
not 16-byte aligned), one native thread, the first ``--images`` samples on
the heap before timing. Each batch of 64 runs once per output in a row, same crops: uint8;
float32, float16 and bfloat16 normalized by the native threads (``Engine.run(...,
normalize=...)``, what the Loader's native threads do on the CPU); and float32 then cast by
torch to float16 and to bfloat16 (the Loader's CPU path for those dtypes until 2026-12-05).
Outputs rotate over 5 slots (the Loader's ring on the CPU: prefetch 3 + 2) of 64-byte aligned
memory (torch's allocator); the casts allocate their outputs as the Loader did, on one torch
thread (with more, the idle pool threads' spinning after a cast lands in the next output's
CPU time). CPU time is the process's. Pairing each batch with its twins keeps a shared
box's drift out of the differences. Reported per output: CPU microseconds per image, and its
extra over uint8 as the mean and the median over batches.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import torch

import fastdata
from fastdata.io.engine import Engine
from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD
from fastdata.loader.pinned_ring import engine_array

BATCH, SLOTS = 64, 5


def aligned(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A tensor whose data starts on a 64-byte boundary (torch's CPU allocator), its pages
    touched: the ring's slots are reused, so their first-touch page faults are not a batch's cost."""
    t = torch.zeros(shape, dtype=dtype)
    if t.data_ptr() % 64:
        raise SystemExit("torch's allocator returned memory that is not 64-byte aligned")
    return t


def samples(path: str, folder: bool, limit: int) -> List[bytes]:
    if folder:
        src = fastdata.ImageFolder(path)
        return [Path(src.samples[i][0]).read_bytes() for i in range(min(limit, len(src)))]
    src = fastdata.LMDBSource(path, verify=False)
    return [bytes(v) for v in src.fetch(np.arange(min(limit, len(src))))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="fastdata LMDB cache, or an ImageFolder tree with --folder")
    p.add_argument("--folder", action="store_true", help="DATA is an ImageFolder tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output side")
    a = p.parse_args()
    items = samples(a.data, a.folder, a.images)
    n = len(items) // BATCH * BATCH
    if n == 0:
        raise SystemExit(f"{a.data} holds {len(items)} samples: need at least {BATCH}")
    torch.set_num_threads(1)
    rrc = fastdata.RandomResizedCrop(a.size)
    engine = Engine(1)
    norm = (IMAGENET_MEAN, IMAGENET_STD)
    shape = (SLOTS, BATCH, a.size, a.size, 3)
    slots = {dt: aligned(shape, dt) for dt in (torch.uint8, torch.float32, torch.float16, torch.bfloat16)}

    def written(dtype: torch.dtype) -> Callable[[List[bytes], np.ndarray, int, int], None]:
        def run(batch, idx, r, j):
            engine.run(batch, rrc, engine_array(slots[dtype][j % SLOTS]), seed=0, epoch=r, indices=idx,
                       normalize=None if dtype == torch.uint8 else norm)
        return run

    def cast(dtype: torch.dtype) -> Callable[[List[bytes], np.ndarray, int, int], None]:
        def run(batch, idx, r, j):
            written(torch.float32)(batch, idx, r, j)
            slots[torch.float32][j % SLOTS].permute(0, 3, 1, 2).to(dtype=dtype)  # the NCHW channels_last batch
        return run

    outputs: Dict[str, Callable] = {"uint8": written(torch.uint8), "float32": written(torch.float32),
                                    "float16": written(torch.float16), "bfloat16": written(torch.bfloat16),
                                    "float32 + torch cast to float16": cast(torch.float16),
                                    "float32 + torch cast to bfloat16": cast(torch.bfloat16)}
    cpu = {name: [] for name in outputs}  # CPU seconds per batch
    for r in range(a.rounds):
        for j, b in enumerate(range(0, n, BATCH)):
            idx = np.arange(b, b + BATCH)
            for name, run in outputs.items():
                c0 = time.process_time()
                run(items[b:b + BATCH], idx, r, j)
                cpu[name].append(time.process_time() - c0)
    engine.close()
    batches = len(cpu["uint8"])
    print(f"{a.data}: {batches * BATCH} images ({a.rounds} rounds), RandomResizedCrop({a.size}), 1 native thread, "
          f"1 torch thread; CPU us per image")
    print(f"{'output':<34} {'CPU us/img':>10} {'extra mean':>11} {'extra median':>13}")
    base = cpu["uint8"]
    for name, secs in cpu.items():
        extra = [s - u for s, u in zip(secs, base)]
        print(f"{name:<34} {sum(secs) / (batches * BATCH) * 1e6:>10.0f} {sum(extra) / (batches * BATCH) * 1e6:>11.1f} "
              f"{statistics.median(extra) / BATCH * 1e6:>13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
