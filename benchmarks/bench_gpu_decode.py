"""GPU decoding side by side on ImageNet-like photos: fastdata's GPU backends (gpu, hybrid,
nvjpeg, dali), the native engine, DALI's own pipeline and the DataLoader baseline, all in one
``fastdata-bench`` run (with the gpu contender next to the native one it prints the ceiling:
their sum).

Exact command (16-core H200 box, from the repository root):

    python benchmarks/bench_gpu_decode.py --count 8192 --seconds 150 --json bench_gpu_decode.json

Builds (once) an ImageFolder of ``--count`` photo-like JPEGs (~500x375, baseline 4:2:0, q90,
``fastdata.cli.demo.photo_like_jpeg``: ImageNet-like size and bytes per pixel), then runs
``fastdata-bench ROOT --device cuda --dtype float16 --batch-size 256 --threads 16 --compare
dataloader,fastdata,fastdata-gpu,fastdata-hybrid,fastdata-nvjpeg,fastdata-dali,dali``: RandomResizedCrop(224) + flip,
fp16 normalized CUDA tensors, batch 256, every contender through its real user path
(``fastdata.Loader(backend=...)``, DALI's file reader + ``decoders.image_random_crop`` mixed
pipeline, ``DataLoader(ImageFolder, num_workers=16, pin_memory=True)``), timed windows and
ratios as ``fastdata-bench`` reports them. Extra arguments go to ``fastdata-bench``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdata.cli import bench  # noqa: E402
from fastdata.cli.demo import photo_like_jpeg  # noqa: E402
from fastdata.io.host import usable_cores  # noqa: E402

CLASSES = 10
CONTENDERS = "dataloader,fastdata,fastdata-gpu,fastdata-hybrid,fastdata-nvjpeg,fastdata-dali,dali"


def _write_one(args) -> None:
    path, seed, index, width, height = args
    if not os.path.exists(path):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(photo_like_jpeg(seed, index, width, height))
        os.replace(tmp, path)  # a complete file or none


def build_set(root: Path, count: int, width: int, height: int, workers: int) -> List[str]:
    """An ImageFolder tree of ``count`` photo-like JPEGs (class = index % 10); reused if present."""
    jobs = []
    for i in range(count):
        d = root / f"class_{i % CLASSES:02d}"
        d.mkdir(parents=True, exist_ok=True)
        jobs.append((str(d / f"{i:06d}.jpg"), 0, i, width, height))
    todo = [j for j in jobs if not os.path.exists(j[0])]
    if todo:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_write_one, todo, chunksize=16))
    return [j[0] for j in jobs]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=8192, help="images in the set (default 8192)")
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--threads", type=int, default=16, help="native threads / DALI threads / DataLoader workers")
    p.add_argument("--device", default="cuda", help="cuda (cpu only checks the script: GPU rows are skipped)")
    p.add_argument("--seconds", type=float, default=150, help="fastdata-bench's measurement budget")
    p.add_argument("--compare", default=CONTENDERS)
    p.add_argument("--root", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "fastdata-bench-gpu")
    args, rest = p.parse_known_args(argv)
    root = args.root / f"n{args.count}-{args.width}x{args.height}"
    t0 = time.perf_counter()
    paths = build_set(root, args.count, args.width, args.height, workers=usable_cores())
    print(f"set: {len(paths)} JPEGs {args.width}x{args.height} in {root} ({time.perf_counter() - t0:.1f}s)", flush=True)
    dtype = ["--dtype", "float16"] if args.device == "cuda" else []
    return bench.main([str(root), "--device", args.device, *dtype, "--batch-size", "256",
                       "--threads", str(args.threads), "--compare", args.compare, "--seconds", str(args.seconds),
                       *rest])


if __name__ == "__main__":
    raise SystemExit(main())
