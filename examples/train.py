"""Train a ResNet on an image folder or a fastdata LMDB, with fastdata or torch's DataLoader.

    python examples/train.py DATA --arch resnet50 --loader fastdata          # one GPU
    torchrun --nproc-per-node 8 examples/train.py DATA --loader fastdata      # DDP
    python examples/train.py --synthetic --arch resnet50                      # in-GPU random data
    python examples/train.py --table results.jsonl                            # print runs side by side

``--loader`` switches the input pipeline and nothing else: same source, same train/held-out
split, same model, optimizer, AMP and logging. The DataLoader pipeline is torchvision's
reference recipe (Pillow decode, RandomResizedCrop + flip, ToTensor + Normalize in worker
processes, pinned memory); the fastdata pipeline decodes and crops on native threads into
pinned uint8 slots and normalizes on the GPU.

DATA is an ImageFolder tree (``DATA/train`` + ``DATA/val`` when both exist, else one tree
from which ``--val-fraction`` is held out), or an LMDB directory made by fastdata-convert.

Every ``--log-every`` steps rank 0 prints images/s and the stall meter's window report; the
loss is accumulated on the device and read only then, so logging adds no per-step sync.
At the end it prints (and with ``--results FILE`` appends as a JSON line) the throughput
and data-wait fraction after ``--warmup-steps``, plus top-1 accuracy on the held-out split.
"""
from __future__ import annotations

import argparse
import warnings
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # small_resnet beside this file

import fastdata  # noqa: E402
from fastdata.diagnostics.stall import StallMeter, StallReport  # noqa: E402
from fastdata.io.host import cores_per_local_rank  # noqa: E402

IMAGENET_MEAN, IMAGENET_STD = fastdata.IMAGENET_MEAN, fastdata.IMAGENET_STD


# ---------------------------------------------------------------------------------------
# data: sources, the held-out split, and the two input pipelines
# ---------------------------------------------------------------------------------------


class SubsetSource:
    """The rows ``indices`` of a fastdata source, as a source (train/held-out splits, DDP shards)."""

    def __init__(self, source: Any, indices: Sequence[int]):
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)
        self.classes = list(source.classes)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def labels(self) -> np.ndarray:
        return np.asarray(self.source.labels)[self.indices]

    def name(self, index: int) -> str:
        return self.source.name(int(self.indices[index]))

    def fetch(self, indices: Sequence[int]) -> Sequence[Any]:
        return self.source.fetch([int(self.indices[i]) for i in indices])


def open_source(path: str) -> Any:
    """fastdata.LMDBSource for an LMDB directory, else fastdata.ImageFolder."""
    if os.path.isfile(os.path.join(path, "data.mdb")):
        return fastdata.LMDBSource(path)
    return fastdata.ImageFolder(path)


def split_sources(data: str, val_fraction: float, seed: int) -> Tuple[Any, Any]:
    """(train, held-out) sources: DATA/train + DATA/val, or a seeded random hold-out of one tree."""
    train_dir, val_dir = os.path.join(data, "train"), os.path.join(data, "val")
    if os.path.isdir(train_dir) and os.path.isdir(val_dir):
        return open_source(train_dir), open_source(val_dir)
    src = open_source(data)
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(len(src))
    n_val = max(1, int(round(val_fraction * len(src))))
    return SubsetSource(src, np.sort(order[n_val:])), SubsetSource(src, np.sort(order[:n_val]))


def shard(source: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s static 1/world of a source (disjoint; each rank shuffles its own shard)."""
    return source if world == 1 else SubsetSource(source, np.arange(rank, len(source), world))


class SourceDataset(torch.utils.data.Dataset):
    """A map-style torch Dataset over a fastdata source, decoding with Pillow (the DataLoader baseline)."""

    def __init__(self, source: Any, transform: Any):
        self.source = source
        self.transform = transform
        self.labels = np.asarray(source.labels)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        import io

        from PIL import Image

        (item,) = self.source.fetch([i])
        f = item if isinstance(item, str) else io.BytesIO(memoryview(item))
        with Image.open(f) as im:
            img = im.convert("RGB")
        return self.transform(img), int(self.labels[i])


class DataLoaderPipeline:
    """torchvision reference input: Pillow + transforms in worker processes, pinned, async copy."""

    def __init__(self, source: Any, args: argparse.Namespace, train: bool, device: torch.device):
        try:
            from torchvision import transforms as T
        except ImportError as e:
            raise SystemExit("--loader dataloader needs torchvision (pip install torchvision)") from e
        size = args.image_size
        tf = (T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip()]) if train
              else T.Compose([T.Resize(round(size / 0.875)), T.CenterCrop(size)]))
        tf = T.Compose([tf, T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        self.generator = torch.Generator().manual_seed(args.seed)
        self.seed = args.seed
        workers = args.workers
        self.loader = torch.utils.data.DataLoader(
            SourceDataset(source, tf), batch_size=args.batch_size, shuffle=train, drop_last=train,
            num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0,
            prefetch_factor=args.prefetch if workers > 0 else None, generator=self.generator,
        )
        self.device = device
        self.memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            yield (images.to(self.device, non_blocking=True, memory_format=self.memory_format),
                   labels.to(self.device, non_blocking=True))


class FastdataPipeline:
    """fastdata.Loader with ``--backend`` (default "auto": native decode + crop into pinned uint8;
    "hybrid" adds the GPU's JPEG engines), H2D on a side stream, GPU normalize."""

    def __init__(self, source: Any, args: argparse.Namespace, train: bool, device: torch.device, dtype: torch.dtype):
        transform = fastdata.RandomResizedCrop(args.image_size) if train else fastdata.CenterCrop(args.image_size)
        self.loader = fastdata.Loader(
            source, batch_size=args.batch_size, transform=transform, shuffle=train, seed=args.seed,
            drop_last=train, threads=args.loader_threads, prefetch=args.prefetch, device=device.type,
            dtype=dtype, channels_last=args.channels_last, backend=args.backend,
        )
        self.device = device
        self.dtype = dtype
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        self._mark: Optional[Tuple[Any, Dict[str, float]]] = None  # (stats, stage seconds) at the warm-up's end

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def stats(self) -> Any:
        return self.loader.stats()

    def mark(self) -> None:
        """The end of the warm-up: ``detail`` covers the batches after it."""
        self._mark = (self.loader.stats(), self.loader.gpu_stage_seconds())

    def detail(self) -> Dict[str, Any]:
        """The loader's side of the measured steps (since ``mark``; without it, since the loader
        was made): the hybrid split, the rows the GPU decoder handed back (``gpu_rejected``), how
        much of the time the native threads had rows and used them, and the GPU decoder's stage
        times per batch in ms (``gpu_wait``: its kernels queued on a busy GPU)."""
        st, stages = self.loader.stats(), self.loader.gpu_stage_seconds()
        if self._mark is not None:
            before, stages_before = self._mark
            st = st.since(before)
            stages = {k: v - stages_before.get(k, 0.0) for k, v in stages.items()}
        out: Dict[str, Any] = {"batches": st.batches, "gpu_share": round(st.gpu_share, 3),
                               "native_occupancy": round(st.native_occupancy, 3),
                               "native_busy_in_runs": round(st.native_busy_in_runs, 3), "failures": st.failures,
                               "gpu_rejected": st.gpu_rejected}
        if stages and st.batches:
            out["gpu_stage_ms_per_batch"] = {k: round(1000 * v / st.batches, 2) for k, v in stages.items()}
        return out

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            if images.dtype == torch.uint8:  # a Loader configured for raw output: normalize here
                images = ((images.float() - self.mean) / self.std).to(self.dtype)
            yield images, labels.to(self.device, non_blocking=True)


class SyntheticPipeline:
    """One random batch made on the device, served ``steps_per_epoch`` times: the compute ceiling."""

    def __init__(self, args: argparse.Namespace, device: torch.device, steps_per_epoch: int):
        g = torch.Generator(device=device).manual_seed(args.seed)
        s = args.image_size
        self.images = torch.randn(args.batch_size, 3, s, s, device=device, generator=g)
        if args.channels_last:
            self.images = self.images.contiguous(memory_format=torch.channels_last)
        self.labels = torch.randint(0, args.num_classes, (args.batch_size,), device=device, generator=g)
        self.steps = steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            yield self.images, self.labels


# ---------------------------------------------------------------------------------------
# model, step, eval
# ---------------------------------------------------------------------------------------


def build_model(arch: str, num_classes: int) -> nn.Module:
    if arch != "small_resnet":
        try:
            import torchvision
        except ImportError:
            print(f"torchvision is absent: using the in-repo small_resnet instead of {arch}", file=sys.stderr)
            arch = "small_resnet"
        else:
            return getattr(torchvision.models, arch)(num_classes=num_classes)
    from small_resnet import small_resnet

    return small_resnet(num_classes)


def evaluate(model: nn.Module, pipe: Any, device: torch.device, amp: Optional[torch.dtype], max_batches: int) -> Tuple[int, int]:
    """(correct, total) top-1 on this rank's part of the held-out split."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    with torch.no_grad(), _autocast(device, amp):
        for i, (images, labels) in enumerate(pipe):
            if max_batches and i >= max_batches:
                break
            correct += (model(images).argmax(1) == labels).sum()
            total += labels.numel()
    model.train()
    return int(correct.item()), total


def _autocast(device: torch.device, amp: Optional[torch.dtype]) -> Any:
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp)


def _combine(windows: List[StallReport], world: int) -> Dict[str, Any]:
    """Run totals from the logged windows (the meter reports and resets every log step)."""
    wall = sum(w.wall_seconds for w in windows)
    samples = sum(w.samples for w in windows)
    steps = sum(w.steps for w in windows)
    frac = sum(w.data_wait_fraction * w.wall_seconds for w in windows) / wall if wall > 0 else float("nan")
    gpu = [w.gpu_util_percent for w in windows if w.gpu_util_percent is not None]
    cpu = [w.cpu_cores_used for w in windows if w.cpu_cores_used is not None]
    gil_p50 = [w.gil_wait_ms_p50 for w in windows if w.gil_wait_ms_p50 is not None]
    gil_late = [w.gil_late_fraction for w in windows if w.gil_late_fraction is not None]
    return {
        "steps_measured": steps,
        "images_per_s": world * samples / wall if wall > 0 else float("nan"),
        "data_wait_fraction": frac,
        "verdict": windows[-1].verdict if windows else "no data",
        "next_action": windows[-1].next_action if windows else "",
        "timing": windows[-1].timing if windows else "",
        "gpu_util_percent": float(np.mean(gpu)) if gpu else None,
        "cpu_cores_used": float(np.mean(cpu)) if cpu else None,
        "gil_wait_ms_p50": float(np.mean(gil_p50)) if gil_p50 else None,
        "gil_late_fraction": float(np.mean(gil_late)) if gil_late else None,
    }


class StepProfiler:
    """Records ``steps`` training steps after the first ``start`` with torch's profiler (CUDA
    activity only: CUPTI sees every thread's kernels, the loader's and nvImageCodec's too), then
    logs each stream's GPU time per step and how much of the window the GPU ran anything."""

    def __init__(self, start: int, steps: int, log: Any):
        self.start, self.steps, self.log = start, steps, log
        self._prof: Any = None

    def after_step(self, step: int) -> None:
        if step == self.start:
            torch.cuda.synchronize()
            # acc_events: one recording, kept whole (torch warns about clearing per cycle without it)
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True)
            self._prof.__enter__()
        elif step == self.start + self.steps and self._prof is not None:
            torch.cuda.synchronize()
            self._prof.__exit__(None, None, None)
            self._report()

    def _report(self) -> None:
        from fastdata.diagnostics.gpu_streams import busy_union_us, format_stream_busy, load_trace, stream_busy

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            self._prof.export_chrome_trace(path)
            trace = load_trace(path)
        streams = stream_busy(trace)
        busy, span = busy_union_us(trace)
        self.log(f"profile of {self.steps} steps: the GPU ran something {busy / self.steps / 1e3:.2f} ms/step of "
                 f"{span / self.steps / 1e3:.2f} ms/step ({100 * busy / span:.0f}%)")
        for line in format_stream_busy(streams, self.steps):
            self.log("  " + line)


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", help="ImageFolder tree or LMDB directory (not needed with --synthetic)")
    p.add_argument("--arch", default="resnet50", help="torchvision model name (resnet18, resnet50, ...) or small_resnet")
    p.add_argument("--loader", choices=("fastdata", "dataloader"), default="fastdata")
    p.add_argument("--backend", default="auto", choices=("auto", "native", "hybrid", "gpu", "dali", "nvjpeg"),
                   help="fastdata.Loader's decoder (default auto: native)")
    p.add_argument("--synthetic", action="store_true", help="random batch made on the device: no input pipeline")
    p.add_argument("--num-classes", type=int, default=1000, help="classes for --synthetic")
    p.add_argument("--batch-size", type=int, default=256, help="per GPU/process")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="train exactly this many steps, across epochs (0: --epochs)")
    p.add_argument("--warmup-steps", type=int, default=10, help="steps excluded from the measured throughput")
    p.add_argument("--workers", type=int, default=None,
                   help="CPU workers of either pipeline: fastdata threads or DataLoader processes (default: cores per process)")
    p.add_argument("--prefetch", type=int, default=3, help="batches in flight (fastdata prefetch / DataLoader prefetch_factor)")
    p.add_argument("--lr", type=float, default=0.1, help="for a global batch of 256 (scaled linearly)")
    p.add_argument("--amp", choices=("bf16", "fp16", "none"), default=None, help="default bf16 on CUDA, none on CPU")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-mode", default=None, choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                   help="torch.compile's mode (implies --compile); reduce-overhead replays the model's forward and backward as CUDA graphs")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--eval-batches", type=int, default=0, help="cap held-out batches (0: all)")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the warm-up, record this many steps with torch's profiler and print each CUDA "
                        "stream's GPU time per step (the model's, the loader's, nvJPEG's own) and how "
                        "long its work waited to start; the measured steps start after them")
    p.add_argument("--gil-probe", action=argparse.BooleanOptionalAction, default=True,
                   help="measure how late the GIL comes (a thread waking every 1 ms; the summary's gil_* fields)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", help="append the run's summary to this JSONL file")
    p.add_argument("--table", help="print the runs in this JSONL file as a table and exit")
    args = p.parse_args(argv)
    if args.table is None and args.data is None and not args.synthetic:
        p.error("DATA is required unless --synthetic (or --table)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Train; return the run summary (also printed). Under torchrun every rank calls this."""
    args = parse_args(argv)
    if args.table:
        print(format_table(args.table))
        return {}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    # fastdata picks its own thread count (its share of the node's cores); the DataLoader gets the
    # same share of worker processes.
    args.loader_threads = args.workers
    args.compile = args.compile or args.compile_mode is not None
    if args.workers is None:
        args.workers = cores_per_local_rank()
    amp_name = args.amp or ("bf16" if device.type == "cuda" else "none")
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[amp_name]
    in_dtype = amp if (amp is not None and device.type == "cuda") else torch.float32
    torch.manual_seed(args.seed + rank)
    log = print if rank == 0 else (lambda *a, **k: None)

    # ---- input ----
    if args.synthetic:
        steps_per_epoch = args.steps or 100
        train_pipe: Any = SyntheticPipeline(args, device, steps_per_epoch)
        val_pipe = None
        num_classes = args.num_classes
    else:
        train_src, val_src = split_sources(args.data, args.val_fraction, args.seed)
        num_classes = len(train_src.classes)
        if args.loader == "fastdata":
            # fastdata.Loader shards by itself (rank and world size from torch.distributed).
            # No validation loader under --no-eval: nothing would read it, and a GPU Loader makes
            # its decoder (and, with its native engine, its threads) up front.
            train_pipe = FastdataPipeline(train_src, args, True, device, in_dtype)
            val_pipe = None if args.no_eval else FastdataPipeline(val_src, args, False, device, in_dtype)
        else:
            train_src, val_src = shard(train_src, rank, world), shard(val_src, rank, world)
            train_pipe = DataLoaderPipeline(train_src, args, True, device)
            val_pipe = None if args.no_eval else DataLoaderPipeline(val_src, args, False, device)
        steps_per_epoch = len(train_pipe)
        if steps_per_epoch == 0:
            raise SystemExit(f"{len(train_src)} training images over {world} rank(s) make no batch of {args.batch_size}")
    # --steps wins over --epochs (benchmarks run a fixed number of steps across epoch boundaries).
    total_steps = args.steps or args.epochs * steps_per_epoch
    epochs = math.ceil(total_steps / steps_per_epoch)

    # ---- model ----
    model = build_model(args.arch, num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    train_model: nn.Module = model
    if world > 1:
        train_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        train_model = torch.compile(train_model, mode=args.compile_mode)
    lr = args.lr * args.batch_size * world / 256
    decay, no_decay = [], []
    for n_, p_ in model.named_parameters():
        (no_decay if p_.ndim <= 1 else decay).append(p_)
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-5}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=lr, momentum=0.9, nesterov=True)
    warm = max(1, min(total_steps // 10, 500))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total_steps - warm))))
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    if scaler is not None:
        # GradScaler skips the optimizer step while it calibrates its scale; the scheduler
        # then warns about the order, which is expected here (checking would sync every step).
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    log(f"{args.arch} | input {'synthetic' if args.synthetic else args.loader} | batch {args.batch_size} x {world} | "
        f"amp {amp_name} | channels_last {args.channels_last} | compile {args.compile} | workers {args.workers} | "
        f"{total_steps} steps | device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")

    # ---- train ----
    # The GIL probe (the summary's gil_* fields): how busy the GIL is, by any thread. Against the
    # same run with --synthetic, the difference is the input pipeline's Python threads, which
    # can slow a step while the data wait stays zero.
    profiler = None
    if args.profile_steps > 0:
        if device.type != "cuda":
            log("--profile-steps: no CUDA device, nothing to profile")
        elif args.warmup_steps < 1 or args.warmup_steps + args.profile_steps + 1 >= total_steps:
            raise SystemExit(f"--profile-steps {args.profile_steps} needs --warmup-steps >= 1 and steps left to measure "
                             f"after the warm-up and the profiled steps ({total_steps} steps in all)")
        else:
            profiler = StepProfiler(args.warmup_steps, args.profile_steps, log)
    # The measured steps start after the warm-up, and after the profiled steps and the step in
    # whose wake the profile is written out (the meter's window starts when its last warm-up
    # batch arrives, before that step runs).
    warmup = args.warmup_steps + (args.profile_steps + 1 if profiler is not None else 0)
    warmup = min(warmup, max(0, total_steps - 1))
    meter = StallMeter(batch_size=args.batch_size, warmup=warmup, gil_probe=args.gil_probe)
    windows: List[StallReport] = []
    loss_sum = torch.zeros((), device=device)
    loss_n = 0
    step = 0
    mean_loss = float("nan")  # until the first log interval
    t_start = time.perf_counter()
    for epoch in range(epochs):
        train_pipe.set_epoch(epoch)
        for images, labels in meter.wrap(train_pipe):
            with _autocast(device, amp):
                loss = criterion(train_model(images), labels)
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            sched.step()
            loss_sum += loss.detach()
            loss_n += 1
            step += 1
            if profiler is not None:
                profiler.after_step(step)
            if step == warmup and isinstance(train_pipe, FastdataPipeline):
                train_pipe.mark()  # the loader's figures in the summary cover the measured steps' batches
            if step % args.log_every == 0 or step == total_steps:
                rep = meter.report(reset=True)
                if rep.steps > 0:
                    windows.append(rep)
                mean_loss = (loss_sum / max(loss_n, 1)).item()  # the one sync per log interval
                loss_sum.zero_()
                loss_n = 0
                log(f"epoch {epoch} step {step}/{total_steps} loss {mean_loss:.4f} lr {sched.get_last_lr()[0]:.4f} | "
                    + (rep.summary() if rep.steps else "warming up"))
            if step >= total_steps:
                break
        if step >= total_steps:
            break
    train_seconds = time.perf_counter() - t_start
    if windows:
        log(str(windows[-1]))
    summary: Dict[str, Any] = {
        "arch": args.arch, "input": "synthetic" if args.synthetic else args.loader,
        "backend": args.backend if not args.synthetic and args.loader == "fastdata" else None, "batch_size": args.batch_size,
        "world_size": world, "amp": amp_name, "channels_last": args.channels_last, "compile": args.compile_mode or args.compile,
        "workers": args.workers, "image_size": args.image_size, "steps": step, "train_seconds": train_seconds,
        "final_loss": mean_loss,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, **_combine(windows, world),
    }
    if isinstance(train_pipe, FastdataPipeline):
        summary["loader"] = train_pipe.detail()

    # ---- held-out top-1 ----
    if val_pipe is not None and not args.no_eval:
        correct, total = evaluate(model, val_pipe, device, amp, args.eval_batches)
        if world > 1:
            t = torch.tensor([correct, total], dtype=torch.int64, device=device)
            dist.all_reduce(t)
            correct, total = int(t[0]), int(t[1])
        summary["val_images"] = total
        summary["top1"] = correct / total if total else float("nan")
        log(f"held-out top-1 {100 * summary['top1']:.2f}% on {total} images")
    log("summary " + json.dumps(summary, default=str))
    if args.results and rank == 0:
        with open(args.results, "a") as f:
            f.write(json.dumps(summary, default=str) + "\n")
    if world > 1:
        dist.destroy_process_group()
    return summary


def format_table(path: str) -> str:
    """A markdown table of the runs in a JSONL file, with each run's share of synthetic throughput."""
    with open(path) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    synth = {r["arch"]: r["images_per_s"] for r in runs if r["input"] == "synthetic"}
    rows = ["| model | input | batch x GPUs | images/s | vs synthetic | data wait | verdict | GPU util | CPU cores | top-1 |",
            "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in runs:
        ref = synth.get(r["arch"])
        vs = f"{100 * r['images_per_s'] / ref:.1f}%" if ref else "-"
        gpu = f"{r['gpu_util_percent']:.0f}%" if r.get("gpu_util_percent") is not None else "-"
        cpu = f"{r['cpu_cores_used']:.1f}" if r.get("cpu_cores_used") is not None else "-"
        top1 = f"{100 * r['top1']:.1f}%" if r.get("top1") is not None else "-"
        rows.append(f"| {r['arch']} | {r['input']} | {r['batch_size']} x {r['world_size']} | {r['images_per_s']:,.0f} | "
                    f"{vs} | {100 * r['data_wait_fraction']:.1f}% | {r['verdict']} | {gpu} | {cpu} | {top1} |")
    # The loader's side of each fastdata run (FastdataPipeline.detail), under the table
    for r in runs:
        d = r.get("loader")
        if d:
            stages = ", ".join(f"{k} {v:.1f}" for k, v in d.get("gpu_stage_ms_per_batch", {}).items())
            rows.append(f"- {r['arch']} {r['input']} {r.get('backend')} ({r['images_per_s']:,.0f} img/s): GPU share "
                        f"{d['gpu_share']:.2f}, native threads had rows {100 * d['native_occupancy']:.0f}% of the time"
                        + (f"; the GPU decoder's stages, ms per batch: {stages}" if stages else ""))
    return "\n".join(rows)


if __name__ == "__main__":
    main()
