"""What the engine's float32 output costs over its uint8 output, per image, by CPU time.

Exact command (2-core box, docs/results.md "The float32 output against the uint8 one"):

    python benchmarks/bench_float_output.py DATA --rounds 3

DATA is a fastdata LMDB cache. Method: RandomResizedCrop(224), one native thread (so the
process's CPU time is the engine's), the first ``--images`` records copied to the heap before
timing. Each batch of 64 runs twice in a row, uint8 then float32 normalized (``Engine.run(...,
normalize=...)``, what the Loader's native threads do on the CPU), same crops; outputs rotate
over 5 slots (the Loader's ring on the CPU: prefetch 3 + 2) of 64-byte aligned memory (torch's
allocator; numpy's large buffers are only 16-byte aligned). Pairing each batch with its twin
keeps a shared box's drift out of the difference. Reported: CPU microseconds per image for each
output, the float32 extra as the mean and the median over batches, and uint8 / float32.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import fastdata
from fastdata.io.engine import Engine
from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD

BATCH, SLOTS = 64, 5


def aligned(shape: tuple, dtype: type) -> np.ndarray:
    """An uninitialized array whose data starts on a 64-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(n + 64, np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off:off + n].view(dtype).reshape(shape)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="fastdata LMDB cache")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=1024)
    a = p.parse_args()
    src = fastdata.LMDBSource(a.data, verify=False)
    n = min(a.images, len(src)) // BATCH * BATCH
    if n == 0:
        raise SystemExit(f"{a.data} holds {len(src)} records: need at least {BATCH}")
    items = [bytes(v) for v in src.fetch(np.arange(n))]
    rrc = fastdata.RandomResizedCrop(224)
    engine = Engine(1)
    u8 = aligned((SLOTS, BATCH, 224, 224, 3), np.uint8)
    f32 = aligned((SLOTS, BATCH, 224, 224, 3), np.float32)
    norm = (IMAGENET_MEAN, IMAGENET_STD)
    t_u8 = t_f32 = 0.0
    extra: list = []  # float32 minus uint8 CPU seconds, per batch
    for r in range(a.rounds):
        for j, b in enumerate(range(0, n, BATCH)):
            idx = np.arange(b, b + BATCH)
            c0 = time.process_time()
            engine.run(items[b:b + BATCH], rrc, u8[j % SLOTS], seed=0, epoch=r, indices=idx)
            c1 = time.process_time()
            engine.run(items[b:b + BATCH], rrc, f32[j % SLOTS], seed=0, epoch=r, indices=idx, normalize=norm)
            c2 = time.process_time()
            t_u8 += c1 - c0
            t_f32 += c2 - c1
            extra.append((c2 - c1) - (c1 - c0))
    engine.close()
    images = len(extra) * BATCH
    print(f"{a.data}: {images} images ({a.rounds} rounds), 1 thread, CPU us per image: uint8 {t_u8 / images * 1e6:.0f}, "
          f"float32 {t_f32 / images * 1e6:.0f}, float32 extra mean {(t_f32 - t_u8) / images * 1e6:.1f} / median of "
          f"batches {statistics.median(extra) / BATCH * 1e6:.1f}, uint8/float32 {t_u8 / t_f32:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
