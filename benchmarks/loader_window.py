"""What the Loader benchmarks that time one window share (bench_producer_timeline.py,
bench_native_occupancy.py): their Loader options, the Loader over an ImageFolder, and the timed
window after a warm-up, across epochs."""
from __future__ import annotations

import argparse
import time
from typing import Callable, Optional, Tuple

import torch

import fastdata


def add_loader_args(p: argparse.ArgumentParser, *, device: str, backend: str, seconds: float, warmup: int) -> None:
    """The ImageFolder root and the Loader's options, with these defaults."""
    p.add_argument("root", help="an ImageFolder tree")
    p.add_argument("--device", default=device)
    p.add_argument("--backend", default=backend)
    p.add_argument("--dtype", default="float16", help="float16, bfloat16, float32 or uint8")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=None, help="native threads (default: the Loader's own choice)")
    p.add_argument("--seconds", type=float, default=seconds, help="timed seconds")
    p.add_argument("--warmup", type=int, default=warmup, help="batches before the timed window")


def make_loader(args: argparse.Namespace) -> fastdata.Loader:
    """RandomResizedCrop(224), shuffled, full batches, 3 batches ahead."""
    return fastdata.Loader(fastdata.ImageFolder(args.root), batch_size=args.batch_size,
                           transform=fastdata.RandomResizedCrop(224), shuffle=True, seed=0, drop_last=True,
                           threads=args.threads, backend=args.backend, device=args.device,
                           dtype=getattr(torch, args.dtype), prefetch=3)


def timed_window(loader: fastdata.Loader, warmup: int, seconds: float,
                 on_start: Optional[Callable[[], None]] = None,
                 on_end: Optional[Callable[[], None]] = None) -> Tuple["fastdata.LoaderStats", "fastdata.LoaderStats", int, float]:
    """Iterate epochs until ``seconds`` have passed after the first ``warmup`` batches (the GPU's
    work synchronized at both ends). Returns the Loader's stats at the window's start and end,
    the batches inside it and its wall seconds. ``on_start``/``on_end`` run at its two ends."""
    cuda = loader.device.type == "cuda"
    seen, epoch, s0, t0, t_end = 0, 0, None, 0.0, 0.0
    while True:
        loader.set_epoch(epoch)
        before = seen
        for _ in loader:
            seen += 1
            if seen == warmup:
                if cuda:
                    torch.cuda.synchronize()
                if on_start is not None:
                    on_start()
                s0, t0 = loader.stats(), time.perf_counter()
                t_end = t0 + seconds
            elif s0 is not None and time.perf_counter() >= t_end:
                if cuda:
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t0
                if on_end is not None:
                    on_end()
                return s0, loader.stats(), seen - warmup, wall
        if seen == before:
            raise SystemExit("an epoch gave no batch: use a larger set or a smaller --batch-size")
        epoch += 1
