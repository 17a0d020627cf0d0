"""`fastdata-bench`: how much faster is training input with fastdata, and which change buys what.

    fastdata-bench [DATA] [--batch-size B] [--seconds 20] [--threads N] [--rounds 1] [--step-ms 0] [--settle-max 20]
                   [--compare dataloader,simd,fastdata,lmdb,ram,ffcv,fastdata-dali,fastdata-nvjpeg,dali,nvjpeg]
                   [--ablation] [--device cpu|cuda] [--dtype float32|float16|bfloat16|uint8]
                   [--json out.json] [--plot out.png]

DATA is an ImageFolder tree, a ``path,label`` list file, a fastdata LMDB cache, or tar
shards (an ``index.json`` or a shard pattern, local or any fsspec URL such as
``http://host/train-{000000..000099}.tar``); without it a deterministic photo-like demo
set is generated once into the user's cache dir. ``--shards URL`` names the same images as
tar shards beside a folder, so the ``shards`` (fastdata.TarShards) and ``webdataset``
(DataLoader + WebDataset) rows run side by side with the folder and LMDB rows.

Every contender runs the same job (RandomResizedCrop(224) + flip, ImageNet normalization,
same batch size, output dtype and device; ``--dtype uint8`` asks for raw uint8 NHWC images
instead). Per contender: start-up and warm-up batches are excluded; reported are images/s =
timed images / timed seconds (pooled over ``--rounds``; fastdata.cli.bench_runner says why this
statistic), the spread of up to 5 consecutive windows per round (min/max and quartiles), CPU
use (this process plus its children, e.g. DataLoader workers, in cores busy), peak RSS
(summed over the same processes, so shared pages of forked workers count more than once)
and, in the JSON, the time the consumer waited per batch (``--step-ms`` simulates a training
step between batches, so the wait of a compute-bound loop can be read).

Time: ``--seconds`` (default 20) is the budget of the measurement phase, split evenly over
the contenders (or ablation steps) that can run and the rounds; start-up and warm-up count
against each share, but every run is timed for at least 40% of its share (a start-up slower
than the share lengthens that run instead of leaving it a sliver to time); a contender timed
for under 2 s is marked * and named below the table (its rate means little); a share can
overrun by at most the batch in flight. With ``--rounds``
> 1 the contenders run interleaved (each once per round, the rounds' orders a balanced Latin
square: each contender first, and right after each other one, equally often), so drift on a
shared machine and what one contender leaves behind hit all alike. Before each run the machine settles from the one before (no child process using a
CPU, busy cores back within half a core, or 5% of the cores, of what they were before the
first run; at most ``--settle-max`` seconds, default 20, not counted in the share; the JSON
keeps each wait): a DataLoader's
workers handing back gigabytes of memory slowed the next contender by a third on the H200
box. One-time setup (demo set generation, ~10 s on 2 cores; LMDB conversion; FFCV's
packed file) is cached and comes on top, so a first no-argument run on a 2-core machine
takes well under a minute.

``--ablation`` replaces the side-by-side comparison by the one-change-at-a-time study:
DataLoader baseline (no pinning) -> pinned memory (CUDA only) -> tuned worker count ->
native full decode (fastdata engine, roi=False) -> ROI/DCT-scaled decode -> LMDB -> RAM ->
CUDA-stream prefetch (CUDA only). With ``--device cuda`` the fastdata steps before the last
copy uint8 batches to the GPU synchronously and normalize there, so the last step isolates
the side-stream prefetch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from fastdata.cli import bench_contenders as bc
from fastdata.cli import bench_report, demo
from fastdata.cli.bench_runner import MAX_WINDOWS, windows  # noqa: F401 (the module's API)
from fastdata.cli.bench_runner import SETTLE_MAX_S, busy_cores, measure, pool, settle
from fastdata.io.host import usable_cores
from fastdata.sources.folder import read_file_list, scan_image_folder

DEFAULT_SECONDS = 20.0


class Progress:
    """One-line progress on stderr (rewritten in place on a terminal, plain lines otherwise)."""

    def __init__(self, stream: Any = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0

    def line(self, msg: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(msg + "\n")
        self.stream.flush()

    def status(self, msg: str) -> None:
        """A transient status; on a non-terminal only every 2 s, to keep logs short."""
        if self.quiet:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\033[K" + msg)
            self.stream.flush()
        elif now - self._last >= 2.0:
            self.stream.write(msg + "\n")
            self.stream.flush()
            self._last = now

    def done(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\r\033[K")
            self.stream.flush()


# ---------------------------------------------------------------------------------------
# Data


def scan_folder(root: Path) -> Tuple[List[str], List[int], List[str]]:
    """torchvision ImageFolder semantics (fastdata.sources.folder): paths, labels, classes."""
    classes, samples = scan_image_folder(str(root))
    return [p for p, _ in samples], [lab for _, lab in samples], classes


def read_list_file(path: Path) -> Tuple[List[str], List[int], List[str]]:
    """``path,label`` lines (fastdata.sources.folder.read_file_list): paths, labels, classes."""
    items = read_file_list(str(path))
    labels = [lab for _, lab in items]
    return [p for p, _ in items], labels, [str(k) for k in range(max(labels) + 1)]


def is_shard_spec(data: str) -> bool:
    """A URL, a shard index (``*.json``), a ``.tar`` or a WebDataset brace pattern."""
    return "://" in data or data.endswith((".json", ".tar")) or "{" in data


def make_job(data: Union[None, str, Path], args: argparse.Namespace,
             progress: Progress) -> Tuple[bc.Job, Dict[str, Any]]:
    """The job for DATA (building the demo set when DATA is None) and a dataset summary."""
    cache = demo.cache_root()
    info: Dict[str, Any] = {}
    kw: Dict[str, Any] = {}
    if data is None:
        t0 = time.perf_counter()
        path = demo.demo_dir(args.demo_images)
        if not demo.is_complete(path):
            progress.line(f"building the demo set ({args.demo_images} photo-like JPEGs) in {path} (once)")
        folder = demo.ensure_demo(args.demo_images, progress=lambda d, t: progress.status(
            f"  demo images {d}/{t}"))
        progress.done()
        info.update(kind="demo ImageFolder", path=str(folder), setup_seconds=round(time.perf_counter() - t0, 2))
        paths, labels, classes = scan_folder(folder)
        kw.update(folder=folder)
    elif is_shard_spec(str(data)):
        src = bc.open_shards(str(data))
        paths, labels, classes = [], [int(x) for x in src.labels], list(src.classes)
        info.update(kind="tar shards", path=str(data), images=len(src), shards=len(src.urls))
        kw.update(shards=str(data))
    elif data.is_dir() and (data / "data.mdb").exists():
        import fastdata

        src = fastdata.LMDBSource(str(data))
        paths, labels, classes = [], [int(x) for x in src.labels], list(src.classes)
        info.update(kind="fastdata LMDB", path=str(data), images=len(src))
        kw.update(lmdb=data)
    elif data.is_dir():
        paths, labels, classes = scan_folder(data)
        info.update(kind="ImageFolder", path=str(data))
        kw.update(folder=data)
    elif data.is_file():
        paths, labels, classes = read_list_file(data)
        info.update(kind="list file", path=str(data))
        kw.update(list_file=data)
    else:
        raise SystemExit(f"fastdata-bench: {data}: no such file or directory")
    if getattr(args, "shards", None):
        kw["shards"] = args.shards
        info["shards"] = args.shards
    if paths:
        sizes = [os.path.getsize(p) for p in paths]
        info.update(images=len(paths), mean_kb=round(sum(sizes) / len(sizes) / 1024, 1))
    info["classes"] = len(classes)
    job = bc.Job(paths=paths, labels=labels, classes=classes, batch_size=args.batch_size,
                 device=args.device, dtype=args.dtype, workers=args.threads, cache_dir=cache,
                 log=progress.line, **kw)
    n = len(labels)
    if n < job.batch_size:
        raise SystemExit(f"fastdata-bench: {n} images is fewer than one batch of {job.batch_size}")
    return job, info


# ---------------------------------------------------------------------------------------
# What to run


@dataclass
class Plan:
    """What to run: (key, contender) pairs in order, with skip reasons found up front."""

    entries: List[Tuple[str, Any]] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)

    def runnable(self) -> List[Tuple[str, Any]]:
        return [(k, c) for k, c in self.entries if k not in self.skipped]


def _check(plan: Plan, key: str, contender: Any, job: bc.Job) -> None:
    plan.entries.append((key, contender))
    try:
        reason = contender.unavailable(job)
    except Exception as e:  # a broken optional install is a skip with its error
        reason = f"{type(e).__name__}: {e}"
    if reason:
        plan.skipped[key] = reason


def ablation_plan(job: bc.Job) -> Plan:
    cuda = job.device.startswith("cuda")
    w = job.workers
    steps: List[Tuple[str, Any, Optional[str]]] = [
        ("baseline", bc.DataLoaderContender(pin_memory=False, label=f"DataLoader, {w} workers, no pinning"), None),
        ("pin_memory", bc.DataLoaderContender(pin_memory=True, label="+ pinned memory"),
         None if cuda else "pinned memory only matters for host-to-device copies (--device cuda)"),
        ("workers", bc.DataLoaderContender(workers=2 * w, pin_memory=cuda, label=f"+ tuned workers (try {2 * w})"),
         None),
        ("native_decode", bc.FastdataContender("files", roi=False, host_normalize=cuda,
                                               label="+ native decode (fastdata engine, full decode)"), None),
        ("roi_decode", bc.FastdataContender("files", host_normalize=cuda, label="+ ROI/DCT-scaled decode"), None),
        ("lmdb", bc.FastdataContender("lmdb", host_normalize=cuda, label="+ LMDB cache"), None),
        ("ram", bc.FastdataContender("ram", host_normalize=cuda, label="+ RAM cache"), None),
        ("cuda_prefetch", bc.FastdataContender("ram", label="+ CUDA-stream prefetch"),
         None if cuda else "needs --device cuda"),
    ]
    plan = Plan()
    for key, contender, reason in steps:
        contender.name = key
        if reason:
            plan.entries.append((key, contender))
            plan.skipped[key] = reason
        else:
            _check(plan, key, contender, job)
    return plan


def compare_plan(job: bc.Job, names: Sequence[str]) -> Plan:
    plan = Plan()
    for name in names:
        _check(plan, name, bc.make_contender(name), job)
    return plan


def round_orders(n: int, rounds: int) -> List[List[int]]:
    """The order of ``n`` contenders in each of ``rounds`` rounds: rows of a Williams design
    (a balanced Latin square: 0, 1, n-1, 2, n-2, ... shifted by the round), mirrored in every
    other block of n rounds for an odd n. Over n rounds (2n for an odd n) each contender runs
    first once (twice) and right after each other contender once (twice), so what the one
    before leaves behind falls on all alike."""
    if n == 0:  # every contender skipped
        return [[] for _ in range(rounds)]
    base = [0]
    lo, hi = 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    orders = []
    for r in range(rounds):
        row = [(b + r) % n for b in base]
        orders.append(row[::-1] if n % 2 == 1 and (r // n) % 2 == 1 else row)
    return orders


def run_plan(plan: Plan, job: bc.Job, seconds: float, progress: Progress, ablation: bool, rounds: int = 1,
             step_seconds: float = 0.0, settle_max: float = SETTLE_MAX_S) -> List[Dict[str, Any]]:
    """Every runnable contender, ``rounds`` times interleaved (round 1 of each, then round 2
    of each, ...), each run an equal share of ``seconds``; rounds pooled per contender. The
    rounds take their orders from a balanced Latin square (:func:`round_orders`), and each run
    starts once the machine has settled from the one before (``bench_runner.settle``, at most
    ``settle_max`` seconds, 0: not at all; the wait is not part of the share)."""
    baseline = busy_cores(0.5) if settle_max > 0 else 0.0  # before anything of ours runs
    _prepare_lmdb(plan, job, progress)  # for the contenders that read it (lmdb, ram), if any
    todo = plan.runnable()
    share = seconds / max(1, len(todo) * rounds)
    runs: Dict[str, List[Dict[str, Any]]] = {key: [] for key, _ in todo}
    for rnd, order in enumerate(round_orders(len(todo), rounds)):
        for done, (key, contender) in enumerate((todo[i] for i in order), 1):
            if runs[key] and runs[key][-1]["status"] != "ok":
                continue  # failed in an earlier round: reported once, not retried
            tag = f"[{done}/{len(todo)}]" + (f" round {rnd + 1}/{rounds}" if rounds > 1 else "") + \
                f" {contender.label}:"
            calm = settle(baseline, max_seconds=settle_max) if settle_max > 0 else None
            if calm is not None and not calm["settled"]:
                kids = calm.get("busy_children", 0)
                progress.line(f"{tag} the machine stayed busy ({calm['busy_cores']:.1f} cores, "
                              f"{baseline:.1f} before the first contender"
                              + (f"; {kids} child process(es) of this one still using a CPU" if kids else "")
                              + f") for {calm['seconds']:.0f} s: this run shares it")
            progress.line(f"{tag} running ({share:.1f} s)")
            r = measure(contender, job, share, status=lambda msg, tag=tag: progress.status(f"{tag} {msg}"),
                        step_seconds=step_seconds)
            r["settle"] = calm
            progress.done()
            if r["status"] == "ok":
                progress.line(f"{tag} {r['images_per_s']:,.0f} img/s "
                              f"({r['timed_images']} images in {r['timed_seconds']:.1f} s)")
            else:
                progress.line(f"{tag} {r['status']}: {r['reason']}")
            runs[key].append(r)
    results: List[Dict[str, Any]] = []
    for key, contender in plan.entries:
        if key in plan.skipped:
            results.append({"name": key, "label": contender.label, "status": "skipped",
                            "reason": plan.skipped[key]})
        else:
            results.append(pool(runs[key]))
    if ablation:
        _ablation_speedups(results)
    else:
        base = next((r for r in results if r["name"] in ("dataloader", "simd") and r.get("status") == "ok"), None)
        for r in results:
            if base is not None and r.get("status") == "ok":
                r["speedup_vs_baseline"] = r["images_per_s"] / base["images_per_s"]
    return results


def _prepare_lmdb(plan: Plan, job: bc.Job, progress: Progress) -> None:
    """Build the LMDB cache before timing, so conversion never eats a contender's share."""
    if job.lmdb is not None:
        return
    keys = [k for k, c in plan.runnable() if isinstance(c, bc.FastdataContender) and c.reads_lmdb(job)]
    if not keys:
        return
    try:
        t0 = time.perf_counter()
        path = bc.ensure_lmdb(job)
        progress.line(f"LMDB cache ready: {path} ({time.perf_counter() - t0:.1f} s)")
    except Exception as e:  # convert not available or failing: those rows are skipped with why
        for k in keys:
            plan.skipped[k] = f"could not build the LMDB cache: {type(e).__name__}: {e}"


def _ablation_speedups(results: List[Dict[str, Any]]) -> None:
    """Speedup vs the previous measured step and vs the baseline, per measured step.

    "Tuned workers" is a choice, not a forced change: when the larger worker count it tries
    is slower, the step keeps the previous count (and its numbers) and records the try.
    """
    measured = [r for r in results if r.get("status") == "ok"]
    for i, r in enumerate(measured):
        if r["name"] == "workers" and i > 0 and r["images_per_s"] < measured[i - 1]["images_per_s"]:
            prev = measured[i - 1]
            tried = {k: r[k] for k in ("images_per_s", "spread", "detail") if k in r}
            keep = {k: v for k, v in prev.items() if k not in ("name", "label", "speedup_vs_previous",
                                                                "speedup_vs_baseline")}
            r.clear()
            r.update(name="workers", label=f"+ tuned workers (kept {prev.get('detail', {}).get('workers')})",
                     tried=tried, **keep)
    base = prev_rate = None
    for r in measured:
        rate = r["images_per_s"]
        if base is None:
            base = rate
        r["speedup_vs_previous"] = rate / prev_rate if prev_rate else 1.0
        r["speedup_vs_baseline"] = rate / base
        prev_rate = rate


# ---------------------------------------------------------------------------------------
# CLI


def _data_arg(text: str) -> Any:
    return text if is_shard_spec(text) else Path(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastdata-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", type=_data_arg, default=None,
                   help="ImageFolder, 'path,label' list file, fastdata LMDB, or tar shards (an index.json or a "
                        "shard pattern, local or any fsspec URL) (default: the demo set)")
    p.add_argument("--shards", default=None, metavar="URL",
                   help="the same images as tar shards (index.json or pattern), for the shards and webdataset rows")
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per batch (default: 256 with --device cuda, 64 on CPU so short runs see many batches)")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                   help=f"budget of the whole measurement, split over the contenders (default {DEFAULT_SECONDS:g})")
    p.add_argument("--threads", type=int, default=None,
                   help="DataLoader workers / native threads (default: usable cores)")
    p.add_argument("--compare", default=",".join(bc.CONTENDERS),
                   help=f"comma-separated contenders (default: all of {','.join(bc.CONTENDERS)})")
    p.add_argument("--ablation", action="store_true", help="the one-optimization-at-a-time study instead")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where batches must end up (default: cuda when available)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "uint8"), default="float32",
                   help="normalized float output, or uint8 for raw NHWC images (default float32)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every contender this many times, interleaved, and pool the rounds (default 1)")
    p.add_argument("--settle-max", type=float, default=SETTLE_MAX_S, metavar="S",
                   help="before each contender, wait until the machine is back to its load before the first one "
                        "(no child process using a CPU, busy cores within half a core or 5%% of the cores), for at "
                        f"most S seconds (default {SETTLE_MAX_S:g}; 0: do not wait)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step after each batch, in ms (default 0: batches back to back)")
    p.add_argument("--json", type=Path, default=None, help="write every number here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here (matplotlib)")
    p.add_argument("--demo-images", type=int, default=demo.DEFAULT_COUNT, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.batch_size is None:
        args.batch_size = 256 if args.device == "cuda" else 64
    if args.batch_size < 1 or args.seconds <= 0 or args.rounds < 1 or args.step_ms < 0 or args.settle_max < 0:
        raise SystemExit("fastdata-bench: --batch-size, --seconds and --rounds must be positive, "
                         "--step-ms and --settle-max >= 0")
    if args.ablation and args.dtype == "uint8":
        raise SystemExit("fastdata-bench: the ablation measures normalized output; use a float --dtype")
    args.threads = args.threads or usable_cores()
    names = [n.strip() for n in args.compare.split(",") if n.strip()]
    unknown = [n for n in names if n not in bc.CONTENDERS]
    if unknown:
        raise SystemExit(f"fastdata-bench: unknown contender(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(bc.CONTENDERS)}")
    if args.plot is not None:
        reason = bench_report.plot_unavailable()
        if reason:
            raise SystemExit(f"fastdata-bench: --plot needs matplotlib ({reason})")
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        if out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
            # checked before the run, so minutes of measuring are not lost to a typo
            raise SystemExit(f"fastdata-bench: error: {flag} {out}: folder {os.path.dirname(os.path.abspath(out))} "
                             f"does not exist")
    progress = Progress(quiet=args.quiet)
    t_start = time.perf_counter()
    try:
        job, dataset = make_job(args.data, args, progress)
    except (OSError, ValueError) as exc:  # CacheFormatError is a ValueError; both name the path
        raise SystemExit(f"fastdata-bench: error: {exc}") from None
    plan = ablation_plan(job) if args.ablation else compare_plan(job, names)
    results = run_plan(plan, job, args.seconds, progress, args.ablation, rounds=args.rounds,
                       step_seconds=args.step_ms / 1000.0, settle_max=args.settle_max)
    report = bench_report.build_report(
        results, dataset=dataset, ablation=args.ablation,
        config={"batch_size": job.batch_size, "seconds": args.seconds, "threads": job.workers,
                "device": job.device, "dtype": job.dtype, "size": job.size, "rounds": args.rounds,
                "step_ms": args.step_ms, "settle_max": args.settle_max,
                "transform": "RandomResizedCrop(224) + hflip" + ("" if job.dtype == "uint8" else " + normalize"),
                "compare": None if args.ablation else names},
        wall_seconds=time.perf_counter() - t_start)
    bench_report.print_report(report)
    for out, write in ((args.json, bench_report.write_json), (args.plot, bench_report.plot)):
        if out is None:
            continue
        try:
            write(report, out)
        except OSError as exc:
            raise SystemExit(f"fastdata-bench: error: cannot write {out}: {exc.strerror or exc}") from None
        progress.line(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
