"""The GPU's hardware JPEG engines by kind of file: decode-only rate and host CPU per image.

Exact command (the H200 table "The engines per subsampling", docs/results.md, ninth session):

    python benchmarks/bench_engines.py FOLDER --seconds 6

FOLDER: any folder of JPEGs (the demo mix: ``python -m fastdata.cli.demo --count 4096
--classes 16 --out FOLDER``). Its files are read once and sorted by kind with
``fastdata.probe``. What the gpu decoder can hand the engines is baseline colour JPEGs
(progressive, CMYK and gray ones go native); of those, each chroma subsampling present is
a subset of its own, and "mixed" is all of them together.

Method: two ``_C.NvImageCodecBatch`` instances (the gpu decoder's call, ``--instances``; per
subsampling in the ``own instances`` variant) on
nvImageCodec's ``HW_GPU_ONLY`` backend, each on its own thread and CUDA stream; batches of
``--batch`` files drawn at random from the subset (with replacement when it has fewer), the
batch shared by the instances as the gpu decoder shares it, each batch waited for; two
warm-up batches, then ``--seconds`` timed. Per row: images decoded per second, rows refused,
CPU cores of the whole process and CPU microseconds per image. The variants:

* ``one call``: each instance decodes its contiguous slice of the batch in one call (the gpu
  decoder before 2026-12-03);
* ``per subsampling``: each instance makes one call per chroma subsampling
  (``fastdata.decoders.nvimgcodec.engine_calls`` on instances shared by every subsampling, the
  gpu decoder's layout on 2026-12-03 before ``own instances``); on a subset of
  one subsampling it is the same as ``one call``, so it runs on "mixed" only;
* ``own instances``: each subsampling has ``--instances`` instances of its own, so an
  instance's calls always hold the same subsampling (``instances_by_code``, what the gpu
  decoder does); "mixed" only;
* ``native N``: the native engine decoding the same subset with RandomResizedCrop(224) on
  ``--native-threads`` threads, for the CPU cost of the same files without the engines.

``--cpu`` runs nvImageCodec's CPU backend instead of the engines, into host memory: a check
of this script on a machine without a GPU, its numbers say nothing about the engines.
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

import fastdata
from fastdata import _C
from fastdata.decoders.gpu_resize import ImageLayout
from fastdata.decoders.nvimgcodec import (BACKEND_KINDS, IMAGE_ALIGN, decode_slices, engine_calls,
                                          instances_by_code, nvimgcodec_instances, nvimgcodec_library)


def catalog(folder: Path) -> List[Dict[str, Any]]:
    """Every JPEG under ``folder`` with the header facts the subsets are made of."""
    rows = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg")):
        data = path.read_bytes()
        try:
            info = fastdata.probe(data)
        except fastdata.DecodeError:
            continue
        rows.append(dict(data=data, height=info.height, width=info.width, progressive=info.progressive,
                         color_space=info.color_space, subsampling=info.subsampling,
                         code=_C.SUBSAMPLING_NAMES.index(info.subsampling)))
    return rows


def subsets(rows: Sequence[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Baseline colour files by chroma subsampling, and all of them as "mixed"."""
    colour = [r for r in rows if not r["progressive"] and r["color_space"] in ("ycbcr", "rgb")]
    out = {name: [r for r in colour if r["subsampling"] == name]
           for name in sorted({r["subsampling"] for r in colour})}
    if len(out) > 1:
        out["mixed"] = colour
    return {name: rs for name, rs in out.items() if rs}


class Engines:
    """``instances`` nvImageCodec decoder objects, each called from a thread of its own, made on an
    nvImageCodec instance as the gpu decoder makes them (``nvimgcodec_instances``)."""

    def __init__(self, instances: int, cpu: bool) -> None:
        library = nvimgcodec_library()
        kinds = [BACKEND_KINDS["CPU_ONLY" if cpu else "HW_GPU_ONLY"]]
        self.device = "cpu" if cpu else "cuda"
        self.instances, _ = nvimgcodec_instances(library, instances)  # as the gpu decoder gets them
        self.decoders = [_C.NvImageCodecBatch(instance, None if cpu else 0, 4, kinds, "")
                         for instance in self.instances]
        self.streams = [None if cpu else torch.cuda.Stream() for _ in range(instances)]
        self.pool = ThreadPoolExecutor(instances)
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def decode(self, batch: Sequence[Dict[str, Any]], by_code: Optional[Dict[int, List[int]]]) -> np.ndarray:
        """One batch, in one call per instance, or (``by_code``: the instances of each subsampling
        code) in engine_calls' calls; returns the per-row statuses (0: decoded)."""
        # the gpu decoder's layout: HWC, each image at an IMAGE_ALIGN-aligned offset
        layout = ImageLayout.packed([(r["height"], r["width"]) for r in batch], chw=False, align=IMAGE_ALIGN)
        offsets, heights, widths = layout.base, layout.height, layout.width
        if self.buffer.numel() < layout.nbytes():
            self.buffer = torch.empty(int(layout.nbytes() * 1.25), dtype=torch.uint8, device=self.device)
        n = len(self.decoders)
        if by_code is not None:
            shares = engine_calls(np.array([r["code"] for r in batch]), by_code)
        else:
            shares = [[np.arange(lo, hi)] for lo, hi in decode_slices(len(batch), n)]

        def share(k: int, calls: List[np.ndarray]) -> List[np.ndarray]:
            stream = self.streams[k]
            statuses = []
            for positions in calls:
                statuses.append(np.asarray(self.decoders[k].decode(
                    [batch[p]["data"] for p in positions], self.buffer.data_ptr(), self.buffer.numel(),
                    offsets[positions], heights[positions], widths[positions],
                    0 if stream is None else stream.cuda_stream)))
            if stream is not None:
                stream.synchronize()
            return statuses

        futures = [self.pool.submit(share, k, calls) for k, calls in enumerate(shares) if calls]
        status = np.zeros(len(batch), np.uint8)
        for future, calls in zip(futures, [c for c in shares if c]):
            for positions, part in zip(calls, future.result()):
                status[positions] = part
        return status

    def close(self) -> None:
        self.pool.shutdown()
        self.decoders = []


def timed(step, seconds: float) -> Dict[str, float]:
    """Two warm-up calls of ``step`` (returns (decoded, refused)), then ``seconds`` of them."""
    for _ in range(2):
        step()
    decoded = refused = 0
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ok, bad = step()
        decoded += ok
        refused += bad
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(img_s=round(decoded / wall), refused=refused, cores=round(cpu / wall, 2),
                us_cpu_per_img=round(1e6 * cpu / max(decoded, 1)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--seconds", type=float, default=6.0, help="timed seconds per row")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--instances", type=int, default=2, help="nvImageCodec decoder instances (threads)")
    p.add_argument("--native-threads", type=int, default=8, help="0: no native rows")
    p.add_argument("--cpu", action="store_true", help="nvImageCodec's CPU backend: a check without a GPU")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    rows = catalog(args.folder)
    sets = subsets(rows)
    print(f"{args.folder}: {len(rows)} JPEGs; subsets " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()),
          flush=True)
    engines = Engines(args.instances, args.cpu)
    codes = sorted({r["code"] for name, subset in sets.items() if name != "mixed" for r in subset})
    shared = {code: list(range(args.instances)) for code in codes}
    own = instances_by_code(codes, args.instances)
    own_engines = Engines(len(codes) * args.instances, args.cpu) if "mixed" in sets else None
    rng = np.random.default_rng(0)
    results = []
    try:
        for name, subset in sets.items():
            def draw() -> List[Dict[str, Any]]:
                return [subset[i] for i in rng.choice(len(subset), args.batch, replace=len(subset) < args.batch)]

            variants = [("one call", engines, None)]
            if name == "mixed":
                variants += [("per subsampling", engines, shared), ("own instances", own_engines, own)]
            for label, runner, by_code in variants:
                def step(runner: Engines = runner, by_code: Optional[Dict[int, List[int]]] = by_code):
                    status = runner.decode(draw(), by_code)
                    return int((status == 0).sum()), int((status != 0).sum())
                results.append(dict(subset=name, files=len(subset), variant=label, **timed(step, args.seconds)))
                print(json.dumps(results[-1]), flush=True)
            if args.native_threads and name != "mixed":
                with fastdata.Engine(args.native_threads) as engine:
                    out = np.empty((args.batch, 224, 224, 3), np.uint8)
                    transform = fastdata.RandomResizedCrop(224)
                    epoch = iter(range(10**9))

                    def native_step():
                        engine.run([r["data"] for r in draw()], transform, out, seed=0, epoch=next(epoch))
                        return args.batch, 0
                    results.append(dict(subset=name, files=len(subset), variant=f"native {args.native_threads}",
                                        **timed(native_step, args.seconds)))
                print(json.dumps(results[-1]), flush=True)
    finally:
        for runner in (engines, own_engines):
            if runner is not None:
                runner.close()
    print(f"\n{'subset':<8} {'files':>6} {'variant':<16} {'img/s':>8} {'refused':>8} {'cores':>6} {'CPU us/img':>10}")
    for r in results:
        print(f"{r['subset']:<8} {r['files']:>6} {r['variant']:<16} {r['img_s']:>8,} {r['refused']:>8} "
              f"{r['cores']:>6} {r['us_cpu_per_img']:>10}")
    if args.json:
        args.json.write_text(json.dumps(dict(folder=str(args.folder), batch=args.batch, instances=args.instances,
                                             cpu=args.cpu, results=results), indent=1))


if __name__ == "__main__":
    main()
