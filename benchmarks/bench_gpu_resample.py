"""The GPU resampler alone: ``resample_batch`` (Triton kernels) on a batch of decoded photos,
side by side with the torch-ops implementation it replaced, in one run.

Exact command (H200 box, from the repository root):

    python benchmarks/bench_gpu_resample.py --images 256 --repeats 50 --sweep --json bench_gpu_resample.json

Input: ``--images`` photo-like 500x375 JPEGs (``fastdata.cli.demo.photo_like_jpeg``, 16 distinct
ones repeated), decoded once and stored in one flat uint8 CUDA buffer as the GPU decoders hand
them over (``--layouts``: HWC as nvImageCodec, CHW as nvJPEG; each timed); crop boxes and flips from the native engine's plan for
RandomResizedCrop(224) (the production boxes, a different one per row). Timed per batch:
GPU time between CUDA events around one call (host planning and the table upload included,
as the decoder pays them), over ``--repeats`` calls after warm-up (Triton compiles in the
first); median and spread are printed, and the host time per call (without waiting for the GPU).

Baseline: the previous torch-ops resampler, loaded from git (``--baseline-rev``, default the
commit before the Triton kernels) or from a file (``--baseline-file``, for a box without the
repository's history); skipped with a note if neither is there. Both outputs are compared
(the old one rounds in float: expect a max difference of 1). ``--sweep`` also times a few other
block sizes of the kernels (asserting the same output), to choose the defaults in gpu_resize._tiles.

``--assembly`` also times the two ways a Loader builds its output batch from the GPU decoder's
rows and the host's (uint8 rows already on the device, so the copy is left out of both): the
old one as it was before 2026-12-05 (float32 rows from the resampler, placed beside the host's
in a float32 batch, then normalized in three passes: float copy, addcmul, cast) against the rows written normalized into the output by the
resampler and one kernel placing the host's (pipeline.FUSED_OUTPUT), float16 channels_last,
for GPU shares 1.0 (gpu-only) and ``--gpu-share`` (hybrid), with the largest difference; and at
share 0 (the native backend on CUDA) GpuNormalizer's one pass against its three before
(float32 copy, addcmul, cast).

``--kernel-times`` adds each kernel's and copy's GPU busy time per call (torch's profiler), for
the resampler and the fused assembly: what the input takes from a training step's GPU, which
the events above overstate by the time the GPU idles while the host plans.

Without CUDA it runs under Triton's interpreter on CPU tensors (set TRITON_INTERPRET=1 and use
a tiny batch): a smoke test only, the times mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastdata  # noqa: E402
from fastdata.cli.demo import photo_like_jpeg  # noqa: E402
from fastdata.decoders import gpu_resize, resample_kernels  # noqa: E402
from fastdata.decoders.base import BatchOutput, to_device  # noqa: E402
from fastdata.decoders.gpu_resize import ImageLayout, place_rows, resample_batch  # noqa: E402
from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD, scale_bias_for  # noqa: E402
from fastdata.loader.cuda import GpuNormalizer  # noqa: E402

BASELINE_REV = "d0faad0"  # main just before the Triton kernels
MODULE_PATH = "fastdata/decoders/gpu_resize.py"
SWEEP = [gpu_resize.Tiles(r, w, h, v) for r, w, h, v in
         [(8, 128, 4, 256), (4, 128, 2, 256), (16, 128, 8, 256), (4, 256, 1, 1024), (16, 64, 16, 64),
          (32, 32, 8, 128), (2, 256, 4, 512)]]


def load_baseline(rev: str, path: Optional[str]) -> Optional[ModuleType]:
    """The old gpu_resize as a stand-alone module (its relative import made absolute), or None."""
    try:
        if path:
            source = Path(path).read_text()
        else:
            source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{MODULE_PATH}"], check=True,
                                    capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"baseline skipped: {e}")
        return None
    source = source.replace("from .base import", "from fastdata.decoders.base import")
    tmp = Path(tempfile.mkdtemp()) / "old_gpu_resize.py"
    tmp.write_text(source)
    spec = importlib.util.spec_from_file_location("old_gpu_resize", tmp)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_batch(images: int, size: int):
    """Decoded HWC photos (16 distinct, repeated) and the native engine's RandomResizedCrop plan."""
    datas = [photo_like_jpeg(0, i, 500, 375) for i in range(16)]
    rows = [datas[i % 16] for i in range(images)]
    with fastdata.Engine(2) as engine:
        plan = engine.plan(rows, fastdata.RandomResizedCrop(size), seed=1, epoch=0, indices=np.arange(images))
    if plan.failures:
        raise RuntimeError(f"plan failed: {plan.failures}")
    decoded = [fastdata.decode(d) for d in datas]
    return [decoded[i % 16] for i in range(images)], plan


def flat_buffer(images: List[np.ndarray], chw: bool, device: torch.device):
    """The decoders' hand-over: one flat uint8 buffer (nvImageCodec: HWC, nvJPEG: CHW)."""
    parts = [torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1) if chw else a)).reshape(-1) for a in images]
    return torch.cat(parts).to(device), ImageLayout.packed([a.shape[:2] for a in images], chw=chw)


def time_calls(call: Callable[[], torch.Tensor], repeats: int, warmup: int, cuda: bool) -> Dict[str, float]:
    for _ in range(warmup):
        call()
    if cuda:
        torch.cuda.synchronize()
    gpu_ms, host_ms = [], []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        call()
        host_ms.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            end.record()
            end.synchronize()
            gpu_ms.append(start.elapsed_time(end))
        else:
            gpu_ms.append(host_ms[-1])
    return {"ms_median": statistics.median(gpu_ms), "ms_min": min(gpu_ms), "ms_max": max(gpu_ms),
            "host_ms_median": statistics.median(host_ms)}


def kernel_times(call: Callable[[], torch.Tensor], repeats: int) -> Dict[str, float]:
    """GPU time per call of each kernel and copy ``call`` queues, from torch's profiler (CUPTI):
    the GPU busy time alone, where the events of ``time_calls`` also count the GPU idling
    while the host plans the batch. Name -> ms per call, largest first."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    call()  # compiled and warm before the profiled calls
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    times: Dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == DeviceType.CUDA and event.self_device_time_total > 0:  # us
            times[event.key] = times.get(event.key, 0.0) + event.self_device_time_total / 1e3 / repeats
    if not times:
        raise RuntimeError("the profiler recorded no GPU kernels or copies (CUPTI unavailable?)")
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def print_kernel_times(times: Dict[str, float], indent: str) -> None:
    print(f"{indent}GPU busy {sum(times.values()):.3f} ms/call: "
          + ", ".join(f"{name[:60]} {ms:.3f}" for name, ms in times.items()))


def assembly(images: List[np.ndarray], plan, out_hw, share: float, device: torch.device, repeats: int,
             warmup: int, cuda: bool, kernels: bool = False) -> Dict[str, object]:
    """Old against fused assembly of one batch: the first ``share`` of the rows from the
    resampler, the rest uint8 rows already on the device (the host's, uploaded)."""
    n = len(images)
    g = max(0, min(n, int(round(n * share))))
    gpu_rows, host_rows = list(range(g)), list(range(g, n))
    sel = np.asarray(gpu_rows, np.int64)
    if gpu_rows:
        flat, layout = flat_buffer(images[:g], False, device)
        args = (flat, layout, plan.boxes[sel], plan.flips[sel], plan.orientations[sel], out_hw, True)
    h, w = out_hw
    host = torch.from_numpy(np.stack([np.asarray(fastdata.decode(
        photo_like_jpeg(0, i % 16, 500, 375)))[:h, :w] for i in host_rows]) if host_rows else
        np.zeros((0, h, w, 3), np.uint8)).to(device)
    normalizer = GpuNormalizer(IMAGENET_MEAN, IMAGENET_STD, torch.float16, True, device)
    scale_bias = scale_bias_for(IMAGENET_MEAN, IMAGENET_STD)

    def normalize_before(nhwc: torch.Tensor) -> torch.Tensor:  # GpuNormalizer before 2026-12-05: three passes
        x = torch.addcmul(normalizer.bias, nhwc.permute(0, 3, 1, 2).float(), normalizer.scale)
        return x.to(dtype=torch.float16, memory_format=torch.channels_last)

    def old() -> torch.Tensor:  # BatchPipeline._place, then _finish, as before FUSED_OUTPUT
        pixels = resample_batch(*args)
        if not host_rows:
            return normalize_before(pixels)
        out = torch.zeros((n, h, w, 3), dtype=torch.float32, device=device)
        for rows, part in ((gpu_rows, pixels), (host_rows, host)):
            out[to_device(torch.tensor(rows), device)] = part.to(device=device, dtype=torch.float32)
        return normalize_before(out)

    def fused() -> torch.Tensor:
        output = BatchOutput.allocate(n, out_hw, torch.float16, True, scale_bias, device)
        resample_batch(*args, into=output, rows=sel)
        if host_rows:
            place_rows(host, output, host_rows)
        return output.tensor

    if not gpu_rows:  # the native backend's path: every row from the host, normalized (GpuNormalizer)
        def old() -> torch.Tensor:
            return normalize_before(host)

        def fused() -> torch.Tensor:
            return normalizer(host)

    diff = (old().float() - fused().float()).abs()
    row: Dict[str, object] = {"gpu_rows": g, "host_rows": n - g, "max_abs_diff": float(diff.max()),
                              "values_differing": float((diff > 0).float().mean())}
    for label, call in (("old", old), ("fused", fused)):
        row[label] = time_calls(call, repeats, warmup, cuda)
    row["speedup"] = row["old"]["ms_median"] / row["fused"]["ms_median"]  # type: ignore[index]
    if kernels and cuda:
        row["fused_kernel_ms"] = kernel_times(fused, repeats)
    return row


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--baseline-file", default=None, help="the old gpu_resize.py, where git is not available")
    ap.add_argument("--tiles", default=None, help="rows,width,out_rows,values: override the kernels' block sizes")
    ap.add_argument("--sweep", action="store_true", help="also time a few other block sizes (same output asserted)")
    ap.add_argument("--layouts", default="hwc,chw", help="decoded layouts to time: hwc (nvImageCodec), chw (nvJPEG)")
    ap.add_argument("--assembly", action="store_true", help="also time the output assembly, old against fused")
    ap.add_argument("--gpu-share", type=float, default=0.6, help="the GPU's share of the rows in --assembly's hybrid row")
    ap.add_argument("--kernel-times", action="store_true",
                    help="also the GPU busy time per call of each kernel and copy (torch's profiler; CUDA only)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if args.kernel_times and not cuda:
        print("--kernel-times needs CUDA (torch's profiler of GPU kernels): not measured")
    if args.tiles:
        fixed = gpu_resize.Tiles(*(int(x) for x in args.tiles.split(",")))
        gpu_resize._tiles = lambda out_h, out_w, interpreted: fixed
    default_tiles = gpu_resize._tiles
    images, plan = make_batch(args.images, args.size)
    out_hw = (args.size, args.size)
    name = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
    print(f"{args.images} images 500x375 -> {args.size}x{args.size}, RandomResizedCrop boxes; device: {name}; "
          f"torch {torch.__version__}")
    results = {"images": args.images, "size": args.size, "device": name, "torch": torch.__version__}
    contenders = {"triton": gpu_resize}
    baseline = load_baseline(args.baseline_rev, args.baseline_file)
    if baseline is not None:
        contenders["torch_ops"] = baseline

    for layout_name in args.layouts.split(","):
        flat, layout = flat_buffer(images, layout_name == "chw", device)

        def call(module: ModuleType) -> Callable[[], torch.Tensor]:
            return lambda: module.resample_batch(flat, layout, plan.boxes, plan.flips, plan.orientations, out_hw, True)

        outputs, row = {}, {}
        print(f"{layout_name.upper()} input:")
        for label, module in contenders.items():
            outputs[label] = call(module)().float().cpu()
            stats = time_calls(call(module), args.repeats, args.warmup, cuda)
            stats["images_per_s"] = args.images / stats["ms_median"] * 1e3
            row[label] = stats
            print(f"  {label:10s} {stats['ms_median']:8.3f} ms/batch (min {stats['ms_min']:.3f}, max "
                  f"{stats['ms_max']:.3f}) {stats['images_per_s']:12,.0f} images/s; host {stats['host_ms_median']:.3f} ms/call")
            if args.kernel_times and cuda:
                stats["kernel_ms"] = kernel_times(call(module), args.repeats)
                print_kernel_times(stats["kernel_ms"], "    ")
        if "torch_ops" in row:
            diff = (outputs["triton"] - outputs["torch_ops"]).abs()
            row["speedup"] = row["torch_ops"]["ms_median"] / row["triton"]["ms_median"]
            row["max_abs_diff_vs_torch_ops"] = float(diff.max())
            print(f"  triton is {row['speedup']:.1f}x faster; outputs differ by at most {float(diff.max()):.0f} "
                  f"({float((diff > 0).float().mean()) * 100:.2f}% of values)")
        if args.sweep:
            row["sweep"] = []
            print("  block sizes (rows,width | out_rows,values); default:",
                  default_tiles(args.size, args.size, resample_kernels.INTERPRETED))
            for tiles in SWEEP:
                gpu_resize._tiles = lambda out_h, out_w, interpreted, tiles=tiles: tiles
                if not torch.equal(call(gpu_resize)().cpu(), outputs["triton"]):
                    raise RuntimeError(f"{tiles} changed the output")
                stats = time_calls(call(gpu_resize), args.repeats, args.warmup, cuda)
                row["sweep"].append({"tiles": list(dataclasses.astuple(tiles)), **stats})
                print(f"    {tiles.rows:3d},{tiles.width:4d} | {tiles.out_rows:3d},{tiles.values:5d}  "
                      f"{stats['ms_median']:8.3f} ms/batch (min {stats['ms_min']:.3f})")
            gpu_resize._tiles = default_tiles
        results[layout_name] = row
    if args.assembly:
        print("output assembly, float16 channels_last (GPU time per batch; the host rows' copy left out):")
        results["assembly"] = {}
        for share in sorted({1.0, args.gpu_share, 0.0}, reverse=True):
            row = assembly(images, plan, out_hw, share, device, args.repeats, args.warmup, cuda, args.kernel_times)
            results["assembly"][f"share_{share:g}"] = row
            print(f"  GPU share {share:4.2f} ({row['gpu_rows']} + {row['host_rows']} host rows): old "
                  f"{row['old']['ms_median']:.3f} ms, fused {row['fused']['ms_median']:.3f} ms: "
                  f"{row['speedup']:.2f}x; host {row['old']['host_ms_median']:.3f} / "
                  f"{row['fused']['host_ms_median']:.3f} ms/call; outputs differ by at most {row['max_abs_diff']:g} "
                  f"({row['values_differing'] * 100:.3f}% of values)")
            if "fused_kernel_ms" in row:
                print_kernel_times(row["fused_kernel_ms"], "    fused: ")  # type: ignore[arg-type]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
