"""GPU decoding side by side: native engine, nvjpeg, DALI (mixed) and the DataLoader baseline.

Exact command (16-core H200 box, from the repository root):

    python benchmarks/bench_gpu_decode.py --count 4096 --batch 256 --threads 16 --json bench_gpu_decode.json

Same photo-like JPEGs (~500x375, fastdata.demo.photo_like_jpeg, baseline 4:2:0, q90) for all,
RandomResizedCrop(224) + horizontal flip, float16 NCHW (channels_last) normalized CUDA
tensors, batch 256. Each contender warms up for one pass, then runs ``--windows`` windows of
``--window-batches`` batches each (CUDA synchronized at each window's end); img/s is the
median of windows, with min/max as spread. Backends run at the backend level
(``backend.run`` in a loop, one batch at a time on this thread), which is what the Loader's
producer thread does. DALI rows are skipped (with the reason) when nvidia.dali is absent.
On a CPU-only box (``--device cpu``) it runs the native and DALI-CPU backends and the
DataLoader to CPU tensors, for checking the script itself.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastdata  # noqa: E402
from fastdata.backends import make_backend  # noqa: E402
from fastdata.backends.dali import dali_available  # noqa: E402
from fastdata.demo import photo_like_jpeg  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CLASSES = 10


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


def measure(step: Callable[[int], int], batches_per_pass: int, windows: int, window_batches: int,
            sync: Callable[[], None]) -> Dict[str, float]:
    """Warm up for one pass, then time ``windows`` windows; step(k) runs batch k, returns images."""
    for k in range(min(batches_per_pass, max(2, window_batches))):
        step(k)
    sync()
    rates = []
    k = 0
    for _ in range(windows):
        t0 = time.perf_counter()
        images = 0
        for _ in range(window_batches):
            images += step(k)
            k += 1
        sync()
        rates.append(images / (time.perf_counter() - t0))
    return {"img_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "windows": rates}


def bench_backend(name: str, paths: List[str], args, device: str) -> Dict[str, object]:
    transform = fastdata.RandomResizedCrop(args.size)
    backend = make_backend(name, transform, device=device, dtype=torch.float16 if device == "cuda" else torch.float32,
                           mean=MEAN, std=STD, channels_last=True, seed=0, threads=args.threads)
    n_batches = len(paths) // args.batch
    order = np.random.default_rng(0).permutation(len(paths))
    sink = []

    def step(k: int) -> int:
        b = k % n_batches
        idx = order[b * args.batch:(b + 1) * args.batch]
        out, failures, _ = backend.run([paths[i] for i in idx], idx, k // n_batches)
        if failures:
            raise RuntimeError(f"{name}: {failures[0]}")
        if backend.stream is not None:
            torch.cuda.current_stream().wait_stream(backend.stream)
        sink[:] = [out]  # keep one batch alive, like a training step would
        return int(out.shape[0])

    try:
        result = measure(step, n_batches, args.windows, args.window_batches, _sync(device))
        result["stats"] = dict(backend.stats)
        return result
    finally:
        backend.close()


def bench_dataloader(root: Path, args, device: str) -> Dict[str, object]:
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(str(root), transform=tf)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.threads,
                                         pin_memory=device == "cuda", drop_last=True, persistent_workers=True)
    dtype = torch.float16 if device == "cuda" else torch.float32
    state = {"it": iter(loader)}

    def step(k: int) -> int:
        try:
            images, labels = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            images, labels = next(state["it"])
        images = images.to(device, non_blocking=True).to(dtype).contiguous(memory_format=torch.channels_last)
        labels.to(device, non_blocking=True)
        return int(images.shape[0])

    try:
        # Windows of one whole epoch: shorter windows would time bursts out of the workers'
        # prefetch queue (num_workers x prefetch_factor batches deep) rather than throughput.
        return measure(step, len(loader), args.windows, len(loader), _sync(device))
    finally:
        del state["it"], loader


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=4096, help="images in the set (default 4096)")
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--threads", type=int, default=16, help="native threads / DALI threads / DataLoader workers")
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window-batches", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--root", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "fastdata-bench-gpu")
    p.add_argument("--only", default="native,nvjpeg,dali,dataloader", help="comma-separated contenders")
    p.add_argument("--json", type=Path, default=Path("bench_gpu_decode.json"))
    args = p.parse_args(argv)
    if args.count < args.batch:
        raise SystemExit("--count must be at least --batch")

    root = args.root / f"n{args.count}-{args.width}x{args.height}"
    t0 = time.perf_counter()
    paths = build_set(root, args.count, args.width, args.height, workers=max(1, os.cpu_count() or 1))
    print(f"set: {len(paths)} JPEGs {args.width}x{args.height} in {root} ({time.perf_counter() - t0:.1f}s)")
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    results: Dict[str, Dict[str, object]] = {}
    for name in wanted:
        label = {"native": f"native ({args.threads} threads) + H2D + GPU normalize", "nvjpeg": "nvjpeg (torchvision)",
                 "dali": "dali (mixed)" if args.device == "cuda" else "dali (cpu)",
                 "dataloader": f"DataLoader ({args.threads} workers)"}.get(name, name)
        skip = None
        if name == "nvjpeg" and args.device != "cuda":
            skip = "needs CUDA"
        if name == "dali" and not dali_available():
            skip = "nvidia.dali not installed (pip install nvidia-dali-cuda130)"
        if skip:
            results[name] = {"label": label, "skipped": skip}
            print(f"{label:48s} skipped: {skip}")
            continue
        try:
            r = bench_dataloader(root, args, args.device) if name == "dataloader" else \
                bench_backend(name, paths, args, args.device)
        except (RuntimeError, ImportError, ValueError) as e:  # one contender failing must not hide the others
            results[name] = {"label": label, "skipped": f"failed: {e}"}
            print(f"{label:48s} failed: {e}")
            continue
        r["label"] = label
        results[name] = r
        print(f"{label:48s} {r['img_per_s']:10.0f} img/s  (min {r['min']:.0f}, max {r['max']:.0f})", flush=True)

    base = results.get("dataloader", {}).get("img_per_s")
    print()
    print(f"| contender | img/s (median) | spread | vs DataLoader |")
    print(f"|---|---:|---:|---:|")
    for name, r in results.items():
        if "skipped" in r:
            print(f"| {r['label']} | skipped: {r['skipped']} | | |")
            continue
        rel = f"{r['img_per_s'] / base:.2f}x" if base else "-"
        print(f"| {r['label']} | {r['img_per_s']:.0f} | {r['min']:.0f}-{r['max']:.0f} | {rel} |")
    meta = {
        "command": " ".join([sys.executable, *sys.argv]), "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "count": args.count, "image": [args.width, args.height], "batch": args.batch, "size": args.size,
        "threads": args.threads, "windows": args.windows, "window_batches": args.window_batches,
    }
    args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
