"""fastdata.Loader vs torch DataLoader(torchvision ImageFolder) and FFCV, side by side in one run.

Exact commands (the README's loader table comes from them):

    # 2-core CPU box
    /work/venv/bin/python benchmarks/bench_loader.py --json bench_loader_cpu.json
    # GPU machine (16 cores, H200), outputs as CUDA tensors
    python benchmarks/bench_loader.py --device cuda --dtype uint8 float16 --json bench_loader_cuda.json

Job (identical for both): the same ImageFolder (default: fastdata's cached photo-like demo
set, ``fastdata.cli.demo.ensure_demo``: ImageNet-like sizes around 500x375, a few gray, CMYK,
progressive and EXIF-rotated files; or ``--data DIR``), RandomResizedCrop(``--size``) +
horizontal flip, shuffled, ``--batch-size``, the same output dtype and device:
- ``uint8``: NHWC uint8 images (DataLoader: PILToTensor, then a free NHWC view);
- a float dtype: normalized NCHW (DataLoader: ToTensor + Normalize, cast after the copy).
DataLoader runs ``--workers`` processes (default: usable cores) with pin_memory=True where
CUDA exists (pinning needs an accelerator) and persistent workers; fastdata runs
``--workers`` native threads. Both read one long shuffled epoch (the demo set repeated) so
that the timed part is steady state, not epoch-boundary drain. FFCV (when installed; skipped
with the reason otherwise) reads its own packed ``.beton`` of the same folder (written once,
JPEG q90, not timed) with ``--workers`` threads, random order, epochs chained.

Method: ``--rounds`` rounds; in each, every (dtype, loader) pair runs once, interleaved,
so load from other processes on a shared machine hits both alike. Each run: start-up and
``--warmup`` batches untimed, then batches for ``--seconds``, cut into windows of
``--window`` batches; the reported rate is all timed images over all timed seconds of all
rounds, with the windows' min..max as the spread. On CUDA every batch is synchronized before the clock reads it (the
batch really is on the GPU). CPU utilization = CPU time of this process and its children
(DataLoader workers) over the timed wall time, as a share of the usable cores. Consumer
wait = time blocked in ``next()`` (plus the CUDA sync), per batch; ``--step-ms`` adds a
simulated training step (host sleep) so the wait of a compute-bound loop can be read.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import psutil
import torch

import fastdata
from fastdata.cli import demo
from fastdata.cli.bench_contenders import RepeatedSource
from fastdata.cli.bench_report import machine_info

DTYPES = {"uint8": torch.uint8, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
Batches = Iterator[Tuple[torch.Tensor, torch.Tensor]]


# ---------------------------------------------------------------------------------------
# The two loaders, each a generator of (images, labels) on the requested device/dtype


def dataloader_batches(root: Path, args: argparse.Namespace, dtype: torch.dtype) -> Batches:
    """torch DataLoader over torchvision's ImageFolder with torchvision's transforms."""
    from torch.utils.data import DataLoader, RandomSampler
    from torchvision import datasets, transforms as T

    steps: List[Any] = [T.RandomResizedCrop(args.size), T.RandomHorizontalFlip()]
    if dtype == torch.uint8:
        steps.append(T.PILToTensor())
    else:
        steps += [T.ToTensor(), T.Normalize(fastdata.IMAGENET_MEAN, fastdata.IMAGENET_STD)]
    ds = datasets.ImageFolder(str(root), transform=T.Compose(steps))
    # One long shuffled epoch: permutations chained, like the repeated source of fastdata.
    sampler = RandomSampler(ds, num_samples=len(ds) * 1000)
    pin = torch.cuda.is_available()
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        pin_memory=pin, drop_last=True, persistent_workers=args.workers > 0,
                        prefetch_factor=2 if args.workers > 0 else None)
    device = torch.device(args.device)
    it = iter(loader)
    try:
        for images, labels in it:
            if dtype == torch.uint8:
                images = images.permute(0, 2, 3, 1)  # NHWC like fastdata's uint8 output (a view)
            images = images.to(device, non_blocking=pin)
            labels = labels.to(device, non_blocking=pin)
            if images.dtype != dtype:
                images = images.to(dtype)
            yield images, labels
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)  # stop the worker processes now
        if shutdown is not None:
            shutdown()


def fastdata_batches(root: Path, args: argparse.Namespace, dtype: torch.dtype) -> Batches:
    """fastdata.Loader over fastdata.ImageFolder (files read by the native threads)."""
    src = fastdata.ImageFolder(root)
    src = RepeatedSource(src, max(1, -(-1000 * args.batch_size // len(src))))
    loader = fastdata.Loader(src, batch_size=args.batch_size, transform=fastdata.RandomResizedCrop(args.size),
                             shuffle=True, seed=0, drop_last=True, threads=args.workers, prefetch=3,
                             device=args.device, dtype=dtype)
    try:
        while True:
            yield from loader
    finally:
        loader.close()


def ffcv_missing() -> Optional[str]:
    """None when FFCV imports, else why not (FFCV builds from source against OpenCV and
    libturbojpeg: apt install libopencv-dev libturbojpeg0-dev pkg-config; pip install ffcv numba)."""
    try:
        import ffcv.loader  # noqa: F401
    except Exception as e:
        return f"ffcv not importable ({type(e).__name__}: {e})"
    return None


def ensure_beton(root: Path, workers: int) -> Path:
    """FFCV's own packed file of ``root`` (written once, cached beside fastdata's caches).

    Images are stored as JPEG (``write_mode="jpg"``, quality 90, no resizing: FFCV decodes
    them with libjpeg-turbo, as fastdata decodes the original files); labels as ints.
    """
    import hashlib

    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision import datasets

    # Keyed by the folder's path and every file's name, size and mtime: a changed folder
    # gets a new packed file instead of a stale one.
    key = hashlib.sha256(str(root.resolve()).encode())
    for path_str, _ in datasets.ImageFolder(str(root)).samples:
        st = os.stat(path_str)
        key.update(f"{os.path.relpath(path_str, root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    digest = key.hexdigest()[:12]
    path = Path.home() / ".cache" / "fastdata" / "ffcv" / f"{root.name}-{digest}.beton"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    writer = DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                           num_workers=workers)
    writer.from_indexed_dataset(datasets.ImageFolder(str(root)))
    os.replace(tmp, path)
    return path


def ffcv_batches(root: Path, args: argparse.Namespace, dtype: torch.dtype) -> Batches:
    """FFCV's Loader over its .beton: RandomResizedCrop decode + flip (+ normalize), its
    ``--workers`` threads, random order; uint8 NHWC or normalized NCHW (channels_last view)."""
    import numpy as np
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToDevice, ToTensor, ToTorchImage

    # FFCV's documented pipelines: on CUDA, uint8 goes to the GPU (ToDevice) and is
    # normalized there; on the CPU, NormalizeImage runs on the host.
    cuda = args.device == "cuda"
    device = torch.device(args.device)
    image: List[Any] = [RandomResizedCropRGBImageDecoder((args.size, args.size)), RandomHorizontalFlip()]
    label: List[Any] = [IntDecoder(), ToTensor(), Squeeze()]
    normalize = None
    if dtype != torch.uint8:
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16}[dtype]  # see UNSUPPORTED
        normalize = NormalizeImage(255 * np.array(fastdata.IMAGENET_MEAN), 255 * np.array(fastdata.IMAGENET_STD),
                                   np_dtype)
    if cuda:
        image += [ToTensor(), ToDevice(device, non_blocking=True)]
        label.append(ToDevice(device, non_blocking=True))
        if normalize is not None:
            image += [ToTorchImage(channels_last=True), normalize]
    else:
        if normalize is not None:
            image.append(normalize)
        image.append(ToTensor())
        if normalize is not None:
            image.append(ToTorchImage(channels_last=True))
    n = len(fastdata.ImageFolder(root))
    # One long epoch, as for the other loaders: the set's indices repeated, then shuffled.
    indices = np.tile(np.arange(n, dtype=np.uint64), max(1, -(-1000 * args.batch_size // n)))
    loader = Loader(str(ensure_beton(root, args.workers)), batch_size=args.batch_size, num_workers=args.workers,
                    order=OrderOption.RANDOM, drop_last=True, os_cache=True, seed=0, indices=indices,
                    pipelines={"image": image, "label": label})
    it = None
    try:
        while True:
            it = iter(loader)
            for images, labels in it:
                yield images, labels
    finally:
        if it is not None:
            it.close()  # stop FFCV's batch thread now


LOADERS: Dict[str, Callable[[Path, argparse.Namespace, torch.dtype], Batches]] = {
    "DataLoader": dataloader_batches,
    "fastdata": fastdata_batches,
    "FFCV": ffcv_batches,
}
OPTIONAL = {"FFCV": ffcv_missing}  # loaders skipped, with the reason, when not installed
UNSUPPORTED = {("FFCV", "bfloat16"): "FFCV's NormalizeImage makes float16 or float32 only"}


# ---------------------------------------------------------------------------------------
# Measurement


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU time of ``proc`` and its live children (DataLoader workers)."""
    total = 0.0
    try:
        family = [proc] + proc.children(recursive=True)
    except psutil.Error:
        family = [proc]
    for p in family:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a worker exiting between listing and reading
            pass
    return total


def run_once(name: str, root: Path, args: argparse.Namespace, dtype: torch.dtype) -> Dict[str, Any]:
    """One run: start-up + warm-up untimed, then ``args.seconds`` of timed batches."""
    sync: Callable[[], None] = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    step_s = args.step_ms / 1000.0
    proc = psutil.Process()
    t_start = time.perf_counter()
    gen = LOADERS[name](root, args, dtype)
    try:
        images, _ = next(gen)
        sync()
        first_batch_s = time.perf_counter() - t_start
        output = f"{str(images.dtype).replace('torch.', '')}{list(images.shape)} {images.device}"
        if images.dtype != dtype:
            raise RuntimeError(f"{name} produced {images.dtype}, expected {dtype}")
        for _ in range(args.warmup):
            next(gen)
            sync()
        # CPU time of children is only counted while they are alive, and DataLoader's
        # persistent workers live through the whole timed window: read both ends there.
        cpu0, t0 = cpu_seconds(proc), time.perf_counter()
        arrivals: List[float] = []
        counts: List[int] = []
        waits: List[float] = []
        while time.perf_counter() - t0 < args.seconds or len(arrivals) < 2 * args.window:
            t_req = time.perf_counter()
            images, labels = next(gen)
            sync()
            now = time.perf_counter()
            waits.append(now - t_req)
            arrivals.append(now)
            counts.append(int(images.shape[0]))
            if step_s:
                time.sleep(step_s)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(proc) - cpu0
    finally:
        gen.close()
    rates, prev, start = [], t0, 0
    for end in range(args.window, len(arrivals) + 1, args.window):
        rates.append(sum(counts[start:end]) / (arrivals[end - 1] - prev))
        prev, start = arrivals[end - 1], end
    return {"name": name, "dtype": str(dtype).replace("torch.", ""), "output": output,
            "first_batch_s": first_batch_s, "timed_batches": len(arrivals), "timed_images": sum(counts),
            "wall_s": wall, "window_rates": rates, "mean_images_per_s": sum(counts) / wall,
            "cpu_cores_busy": cpu / wall, "wait_s": sum(waits), "wait_ms_p50": 1e3 * statistics.median(waits),
            "wait_ms_p95": 1e3 * sorted(waits)[int(0.95 * (len(waits) - 1))]}


def summarize(runs: List[Dict[str, Any]], cores: int) -> Dict[str, Any]:
    rates = [r for run in runs for r in run["window_rates"]]
    wall = sum(run["wall_s"] for run in runs)
    busy = sum(run["cpu_cores_busy"] * run["wall_s"] for run in runs) / wall
    waits = [run["wait_ms_p50"] for run in runs]
    # Throughput is images over the whole timed span: a median of short windows can time bursts
    # out of a DataLoader's prefetch queue (num_workers x prefetch_factor batches deep).
    images = sum(run["timed_images"] for run in runs)
    return {"images_per_s": images / wall, "min": min(rates), "max": max(rates),
            "round_medians": [statistics.median(run["window_rates"]) for run in runs],
            "cpu_cores_busy": busy, "cpu_percent": 100.0 * busy / cores,
            "wait_ms_p50": statistics.median(waits),
            "wait_fraction": sum(run["wait_s"] for run in runs) / wall,
            "first_batch_s": statistics.median(run["first_batch_s"] for run in runs),
            "output": runs[0]["output"]}


# ---------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None, help="an ImageFolder (default: the cached demo set)")
    p.add_argument("--count", type=int, default=demo.DEFAULT_COUNT, help="demo images when --data is not given")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["uint8", "float32"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", type=int, default=demo.usable_cores(),
                   help="DataLoader worker processes = fastdata native threads (default: usable cores)")
    p.add_argument("--seconds", type=float, default=6.0, help="timed seconds per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches after the first one")
    p.add_argument("--window", type=int, default=4, help="batches per timed window")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch (host sleep)")
    p.add_argument("--loaders", nargs="+", choices=sorted(LOADERS), default=list(LOADERS))
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    for key in ("batch_size", "size", "window", "rounds"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.workers < 1 or args.seconds <= 0 or args.warmup < 0 or args.step_ms < 0:
        p.error("--workers >= 1, --seconds > 0, --warmup >= 0 and --step-ms >= 0 are required")
    return args


def format_table(rows: List[List[str]]) -> str:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv) if argv is None else \
        " ".join(shlex.quote(a) for a in [sys.executable, __file__, *argv])
    print(f"command: {command}", flush=True)
    root = args.data if args.data is not None else demo.ensure_demo(count=args.count)
    n_images = len(fastdata.ImageFolder(root))
    cores = demo.usable_cores()
    load = os.getloadavg()
    print(f"data: {root} ({n_images} images)  device: {args.device}  cores: {cores}  "
          f"load average before: {load[0]:.2f}", flush=True)

    skipped = {name: why for name in args.loaders if name in OPTIONAL for why in [OPTIONAL[name]()] if why}
    for name, why in skipped.items():
        print(f"  {name}: skipped: {why}", flush=True)
    args.loaders = [n for n in args.loaders if n not in skipped]
    if "FFCV" in args.loaders:
        t0 = time.perf_counter()
        print(f"  FFCV: packed file {ensure_beton(root, args.workers)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    for (name, dtype_name), why in UNSUPPORTED.items():
        if name in args.loaders and dtype_name in args.dtype:
            skipped[f"{name}/{dtype_name}"] = why
            print(f"  {name} {dtype_name}: skipped: {why}", flush=True)
    runs: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for rnd in range(args.rounds):
        for dtype_name in args.dtype:
            for name in args.loaders:
                if (name, dtype_name) in UNSUPPORTED:
                    continue
                run = run_once(name, root, args, DTYPES[dtype_name])
                runs.setdefault((dtype_name, name), []).append(run)
                print(f"  round {rnd + 1}/{args.rounds} {dtype_name:8s} {name:10s} "
                      f"{statistics.median(run['window_rates']):8.0f} img/s  cpu {run['cpu_cores_busy']:.2f} cores",
                      flush=True)

    results = {f"{d}/{n}": summarize(r, cores) for (d, n), r in runs.items()}
    rows = [["dtype", "loader", "img/s", "window min..max", "vs DataLoader", "CPU % of cores", "wait ms/batch",
             "wait %", "first batch s", "output"]]
    for dtype_name in args.dtype:
        base = results.get(f"{dtype_name}/DataLoader")
        for name in args.loaders:
            if (name, dtype_name) in UNSUPPORTED:
                continue
            s = results[f"{dtype_name}/{name}"]
            ratio = s["images_per_s"] / base["images_per_s"] if base else None
            s["ratio_vs_dataloader"] = ratio
            rows.append([dtype_name, name, f"{s['images_per_s']:,.0f}", f"{s['min']:,.0f}..{s['max']:,.0f}",
                         f"{ratio:.2f}x" if ratio else "-", f"{s['cpu_percent']:.0f}%", f"{s['wait_ms_p50']:.1f}",
                         f"{100 * s['wait_fraction']:.0f}%", f"{s['first_batch_s']:.2f}", s["output"]])
    print()
    print(format_table(rows))
    print(f"\nbatch {args.batch_size}, RandomResizedCrop({args.size}) + flip, {args.workers} workers/threads, "
          f"{args.rounds} rounds x {args.seconds:.0f} s per loader, windows of {args.window} batches; "
          f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        report = {"command": command, "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "data": {"root": str(root), "images": n_images}, "machine": machine_info(),
                  "load_average_before": load, "results": results, "skipped": skipped,
                  "runs": {f"{d}/{n}": r for (d, n), r in runs.items()}}
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
