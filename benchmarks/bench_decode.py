"""Per-core decode throughput of the native engine against the usual Python paths.

Exact commands (docs/results.md's decode table comes from these):

    # 2-core CPU box
    /work/venv/bin/python benchmarks/bench_decode.py --json bench_decode.json
    # 16-core GPU box (thread scaling up to 16)
    python benchmarks/bench_decode.py --images 256 --threads 1,2,4,8,16 --json bench_decode_16c.json

Data: ``--images`` photo-like JPEGs of ``--size`` (default 500x375, baseline 4:2:0, quality 90,
~0.5-1 byte/pixel) from ``fastdata.cli.demo.photo_like_jpeg``, held in memory (no file IO);
with ``--progressive`` the same pictures written as progressive JPEGs by Pillow.

Rows, one thread each (per-core numbers): fastdata.probe; the entropy floor (Huffman decoding
of only the rows each RandomResizedCrop needs, ``fastdata._C.entropy_floor``); libjpeg-turbo's
plain full decode (``fastdata._C.plain_decode``, one reused buffer); ``fastdata.decode`` (full,
to a new numpy array); the fused RandomResizedCrop(224)+flip (``Engine(1).run``) with and
without ROI/DCT-scaled decoding; the fused RandomResizedCrop over the same images as
fastdata-convert stores them (lossless restart-indexed rewrites: only the restart intervals a
crop touches are entropy-decoded, so it can beat the entropy floor of the plain files); the fused RandomResizedCrop with libjpeg-turbo's own Huffman decoder instead of fastdata's
(``_C._set_fast_huffman(False)``: the A/B of csrc/core/huffman.cpp); the fused CenterCrop(224, resize=256); Pillow's
torchvision-style path (open, convert RGB, RandomResizedCrop, flip, ToTensor, Normalize);
Pillow, OpenCV (``cv2.imdecode``, 1 thread) and simplejpeg full decodes where installed.
Then thread scaling of the fused RandomResizedCrop, with the engine's busy share and decode
time per image (where a shortfall comes from), beside the machine's own ceiling: the same
number of independent single-thread processes running at once (``--process-seconds``).

Method: every row does one warm-up pass, then ``--repeats`` rounds; within a round the rows
run one after another (interleaved, so drift on a shared machine hits every row alike). A
timed pass covers all images, repeated until it lasts ``--min-time`` s. Reported: median
img/s over rounds with min and max; per-core ratios use medians; thread speedup and
efficiency are medians over rounds of each round's rate against the same round's 1-thread rate.
Targets: fused RRC >= 1.2x plain full decode and >= 3x the Pillow path per core; >= 90%
linear thread scaling.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import fastdata
from fastdata.cli import demo
from fastdata.io.host import usable_cores
from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD

Row = Tuple[str, str, Callable[[int], None]]  # key, label, fn(round) doing one pass over all images


def make_images(n: int, width: int, height: int, seed: int = 0, progressive: bool = False) -> List[bytes]:
    datas = [demo.photo_like_jpeg(seed, i, width, height) for i in range(n)]
    if progressive:  # the same pictures as Pillow writes progressive files (libjpeg's default script)
        from PIL import Image

        def again(data: bytes) -> bytes:
            buf = io.BytesIO()
            Image.open(io.BytesIO(data)).save(buf, "JPEG", quality=demo.QUALITY, subsampling=2, progressive=True)
            return buf.getvalue()
        datas = [again(d) for d in datas]
    return datas


def _skip(reason: str) -> Callable[[int], None]:
    def fn(_: int) -> None:
        raise RuntimeError(reason)
    fn.skip_reason = reason  # type: ignore[attr-defined]
    return fn


def build_rows(datas: List[bytes]) -> List[Row]:
    """The per-core rows; an unavailable one carries its skip reason."""
    from fastdata.io import engine as fe

    rrc = fastdata.RandomResizedCrop(224)
    cc = fastdata.CenterCrop(224, resize=256)
    n = len(datas)
    out = np.empty((n, 224, 224, 3), np.uint8)
    eng1 = fastdata.Engine(threads=1)
    rows: List[Row] = []

    rows.append(("probe", "fastdata.probe (header)", lambda r: [fastdata.probe(d) for d in datas] and None))
    try:
        from fastdata import _C

        spec = fe.native_spec(rrc)
        rows.append(("entropy_floor", "entropy floor (Huffman, RRC rows)",
                     lambda r: _C.entropy_floor(datas, spec, 0, r)))
        rows.append(("plain_decode", "libjpeg-turbo full decode (plain)", lambda r: _C.plain_decode(datas)))
    except (ImportError, AttributeError) as e:
        rows.append(("entropy_floor", "entropy floor (Huffman, RRC rows)", _skip(f"not exposed: {e}")))
        rows.append(("plain_decode", "libjpeg-turbo full decode (plain)", _skip(f"not exposed: {e}")))
    rows.append(("decode", "fastdata.decode (full, new array)", lambda r: [fastdata.decode(d) for d in datas] and None))
    rows.append(("decode_libjpeg_huffman", "fastdata.decode, libjpeg-turbo's own Huffman decoder",
                 lambda r: _with_libjpeg_huffman(lambda: [fastdata.decode(d) for d in datas])))
    rows.append(("rrc", "fused RandomResizedCrop(224)+flip",
                 lambda r: _check(eng1.run(datas, rrc, out, seed=0, epoch=r))))
    indexed = _restart_indexed(datas)
    if indexed is None:
        rows.append(("rrc_indexed", "fused RRC, restart-indexed cache records", _skip("no transcode_restart_indexed")))
    else:
        rows.append(("rrc_indexed", "fused RRC, restart-indexed cache records",
                     lambda r: _check(eng1.run(indexed, rrc, out, seed=0, epoch=r))))
    from fastdata import _C

    if hasattr(_C, "_set_fast_huffman"):
        rows.append(("rrc_libjpeg_huffman", "fused RRC, libjpeg-turbo's own Huffman decoder",
                     lambda r: _with_libjpeg_huffman(lambda: _check(eng1.run(datas, rrc, out, seed=0, epoch=r)))))
    if "roi" in _params(eng1.run):
        rows.append(("rrc_full", "fused RRC, roi=False (full decode+resize)",
                     lambda r: _check(eng1.run(datas, rrc, out, seed=0, epoch=r, roi=False))))
    else:
        rows.append(("rrc_full", "fused RRC, roi=False (full decode+resize)", _skip("Engine.run has no roi switch")))
    rows.append(("center", "fused CenterCrop(224, resize=256)", lambda r: _check(eng1.run(datas, cc, out, epoch=r))))
    rows.append(("pillow_tv", "Pillow + torchvision RRC/flip/ToTensor/Normalize", _pillow_tv(datas)))
    rows.append(("pillow", "Pillow full decode", _pillow_full(datas)))
    rows.append(("opencv", "OpenCV cv2.imdecode (full)", _opencv(datas)))
    rows.append(("simplejpeg", "simplejpeg decode_jpeg (full)", _simplejpeg(datas)))
    return rows


def _restart_indexed(datas: List[bytes]) -> Optional[List[bytes]]:
    """The same images as fastdata-convert stores them (format 2): lossless rewrites with
    restart markers every RESTART_INTERVAL_MCUS MCUs and the restart index."""
    from fastdata import _C
    from fastdata.cache import format as cf

    if not hasattr(_C, "transcode_restart_indexed"):
        return None
    return [_C.transcode_restart_indexed(d, 0, cf.RESTART_INTERVAL_MCUS) for d in datas]


def _with_libjpeg_huffman(fn: Callable[[], None]) -> None:
    """Runs fn with fastdata's Huffman decoder switched off (the A/B of csrc/core/huffman.cpp)."""
    from fastdata import _C

    was = _C._set_fast_huffman(False)
    try:
        fn()
    finally:
        _C._set_fast_huffman(was)


def _params(fn: Any) -> Sequence[str]:
    import inspect

    return list(inspect.signature(fn).parameters)


def _check(report: Any) -> None:
    if report.failures:
        raise RuntimeError(f"decode failures: {report.failures[:3]}")


def _pillow_tv(datas: List[bytes]) -> Callable[[int], None]:
    try:
        import torch
        from PIL import Image
        from torchvision import transforms
    except ImportError as e:
        return _skip(str(e))
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    torch.set_num_threads(1)  # per-core number: torch's ops must not fan out

    def fn(r: int) -> None:
        torch.manual_seed(r)
        for d in datas:
            with Image.open(io.BytesIO(d)) as im:
                tf(im.convert("RGB"))
    return fn


def _pillow_full(datas: List[bytes]) -> Callable[[int], None]:
    from PIL import Image

    def fn(r: int) -> None:
        for d in datas:
            with Image.open(io.BytesIO(d)) as im:
                im.convert("RGB")
    return fn


def _opencv(datas: List[bytes]) -> Callable[[int], None]:
    try:
        import cv2
    except ImportError as e:
        return _skip(f"OpenCV not installed: {e}")
    cv2.setNumThreads(1)
    arrs = [np.frombuffer(d, np.uint8) for d in datas]

    def fn(r: int) -> None:
        for a in arrs:
            if cv2.imdecode(a, cv2.IMREAD_COLOR) is None:
                raise RuntimeError("cv2.imdecode failed")
    return fn


def _simplejpeg(datas: List[bytes]) -> Callable[[int], None]:
    try:
        import simplejpeg
    except ImportError as e:
        return _skip(f"simplejpeg not installed: {e}")

    def fn(r: int) -> None:
        for d in datas:
            simplejpeg.decode_jpeg(d, colorspace="RGB")
    return fn


def time_rows(rows: Sequence[Row], n: int, repeats: int, min_time: float,
              log: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
    """Warm-up, then interleaved rounds; per row: median/min/max img/s or a skip reason."""
    results: Dict[str, Dict[str, Any]] = {}
    inner: Dict[str, int] = {}
    live = []
    for key, label, fn in rows:
        reason = getattr(fn, "skip_reason", None)
        if reason:
            results[key] = {"label": label, "status": "skipped", "reason": reason}
            continue
        t = time.perf_counter()
        fn(0)
        dt = time.perf_counter() - t
        inner[key] = max(1, math.ceil(min_time / max(dt, 1e-6)))
        results[key] = {"label": label, "status": "ok", "rates": []}
        live.append((key, fn))
    for r in range(1, repeats + 1):
        log(f"round {r}/{repeats}")
        for key, fn in live:
            k = inner[key]
            t = time.perf_counter()
            for j in range(k):
                fn(r * 1000 + j)
            dt = time.perf_counter() - t
            results[key]["rates"].append(n * k / dt)
    for key, _ in live:
        rates = results[key]["rates"]
        results[key].update(images_per_s=statistics.median(rates), min=min(rates), max=max(rates))
    return results


def thread_scaling(datas: List[bytes], threads: Sequence[int], repeats: int, min_time: float,
                   log: Callable[[str], None]) -> List[Dict[str, Any]]:
    """Fused RandomResizedCrop(224) img/s per thread count (one Engine per count)."""
    rrc = fastdata.RandomResizedCrop(224)
    engines = {t: fastdata.Engine(threads=t) for t in threads}
    # An output array per engine, as each independent process has its own, so that no row
    # starts by taking over cache lines that the previous row's cores left modified.
    outs = {t: np.empty((len(datas), 224, 224, 3), np.uint8) for t in threads}
    # Where an N-thread row loses against N x the 1-thread row, split in two: "busy" is the
    # share of the threads' wall time spent decoding (the rest is fastdata's: the batch
    # barrier, dispatch); "ms/img" is the decode time per image, which grows when the
    # machine slows each core down as more of them work. Both count every pass, warm-up too.
    spent = {t: {"decode_s": 0.0, "wall_s": 0.0, "images": 0} for t in threads}

    def row(t: int) -> Callable[[int], None]:
        def fn(r: int) -> None:
            t0 = time.perf_counter()
            report = engines[t].run(datas, rrc, outs[t], epoch=r)
            spent[t]["wall_s"] += time.perf_counter() - t0
            _check(report)
            spent[t]["decode_s"] += report.decode_seconds
            spent[t]["images"] += len(datas)
        return fn

    rows: List[Row] = [(str(t), f"{t} threads", row(t)) for t in threads]
    timed = time_rows(rows, len(datas), repeats, min_time, log)
    for e in engines.values():
        e.close()
    # Speedup and efficiency pair each round's rates with the same round's base rate (the
    # rows of a round run seconds apart): a shared machine's speed drifts by more than 10%
    # over the minutes a run takes, which a ratio of medians would mistake for scaling.
    base_rates = timed[str(threads[0])]["rates"]
    table = []
    for t in threads:
        rate = timed[str(t)]["images_per_s"]
        speedups = [x * threads[0] / b for x, b in zip(timed[str(t)]["rates"], base_rates)]
        table.append({"threads": t, "images_per_s": rate, "min": timed[str(t)]["min"], "max": timed[str(t)]["max"],
                      "rates": timed[str(t)]["rates"], "speedup": statistics.median(speedups),
                      "efficiency": statistics.median(s / t for s in speedups),
                      "busy": spent[t]["decode_s"] / (t * spent[t]["wall_s"]),
                      "ms_per_image": 1000 * spent[t]["decode_s"] / spent[t]["images"]})
    return table


def _process_worker(args: Tuple[int, float, Any]) -> float:
    """One process, one engine thread: fused RRC img/s over `seconds`, started at the barrier."""
    seed, seconds, barrier = args
    datas = _FORK_DATAS
    rrc = fastdata.RandomResizedCrop(224)
    out = np.empty((len(datas), 224, 224, 3), np.uint8)
    eng = fastdata.Engine(threads=1)
    _check(eng.run(datas, rrc, out, epoch=0))  # warm-up
    barrier.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _check(eng.run(datas, rrc, out, seed=seed, epoch=n))
        n += 1
    return len(datas) * n / (time.perf_counter() - t0)


_FORK_DATAS: List[bytes] = []


def process_ceiling(datas: List[bytes], counts: Sequence[int], seconds: float,
                    log: Callable[[str], None]) -> Dict[int, float]:
    """The machine's own scaling: t independent single-thread processes running at once
    (no shared engine, no batch barrier), summed img/s per t. Whatever caps this (shared
    caches, memory bandwidth, neighbours on a shared host, clocks) caps threads too;
    benchmarks/core_contention.c tells those apart."""
    import multiprocessing as mp

    global _FORK_DATAS
    _FORK_DATAS = datas
    ctx = mp.get_context("fork")
    rates: Dict[int, float] = {}
    with ctx.Manager() as manager:
        for t in counts:
            log(f"process ceiling: {t} processes")
            barrier = manager.Barrier(t)
            with ctx.Pool(t) as pool:
                rates[t] = sum(pool.map(_process_worker, [(i, seconds, barrier) for i in range(t)]))
    return rates


def print_tables(res: Dict[str, Dict[str, Any]], scaling: List[Dict[str, Any]], targets: List[Dict[str, Any]],
                 header: str) -> None:
    plain = res.get("plain_decode", {}).get("images_per_s")
    pil = res.get("pillow_tv", {}).get("images_per_s")
    print(header)
    print(f"{'per core (1 thread)':<50} {'img/s':>9} {'min-max':>15} {'vs plain':>9} {'vs Pillow':>10}")
    print("-" * 97)
    for key, r in res.items():
        if r["status"] != "ok":
            print(f"{r['label']:<50} skipped: {r['reason']}")
            continue
        rate = r["images_per_s"]
        vs_plain = f"{rate / plain:.2f}x" if plain else ""
        vs_pil = f"{rate / pil:.2f}x" if pil else ""
        print(f"{r['label']:<50} {rate:>9,.0f} {r['min']:>7,.0f}-{r['max']:<7,.0f} {vs_plain:>9} {vs_pil:>10}")
    print()
    print(f"{'fused RRC(224), threads':<24} {'img/s':>9} {'min-max':>15} {'speedup':>8} {'efficiency':>11}"
          f" {'busy':>5} {'ms/img':>7} {'processes':>10} {'proc. eff.':>11} {'threads/proc.':>14}")
    print("-" * 122)
    for s in scaling:
        line = (f"{s['threads']:<24} {s['images_per_s']:>9,.0f} {s['min']:>7,.0f}-{s['max']:<7,.0f} "
                f"{s['speedup']:>7.2f}x {100 * s['efficiency']:>10.0f}% {100 * s['busy']:>4.0f}% "
                f"{s['ms_per_image']:>7.3f}")
        if s.get("processes_images_per_s"):
            line += (f" {s['processes_images_per_s']:>10,.0f} {100 * s['processes_efficiency']:>10.0f}%"
                     f" {100 * s['threads_vs_processes']:>13.0f}%")
        print(line)
    print()
    for t in targets:
        got = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        verdict = "n/a" if t["met"] is None else ("MET" if t["met"] else "MISSED")
        print(f"target: {t['name']:<52} {got:>6} (need {t['need']})  {verdict}")


def evaluate_targets(res: Dict[str, Dict[str, Any]], scaling: List[Dict[str, Any]], cores: int) -> List[Dict[str, Any]]:
    def rate(k: str) -> Optional[float]:
        return res.get(k, {}).get("images_per_s")

    def ratio(a: str, b: str) -> Optional[float]:
        x, y = rate(a), rate(b)
        return x / y if x and y else None

    targets = []
    for name, value, need, op in (
            ("fused RRC / plain full decode (per core)", ratio("rrc", "plain_decode"), ">= 1.2", 1.2),
            ("fused RRC / Pillow torchvision path (per core)", ratio("rrc", "pillow_tv"), ">= 3.0", 3.0),
            ("fused RRC / entropy floor (how close to the floor)", ratio("rrc", "entropy_floor"), "report", None),
            ("fused RRC restart-indexed / fused RRC (per core)", ratio("rrc_indexed", "rrc"), "report", None),
            ("fused RRC restart-indexed / entropy floor", ratio("rrc_indexed", "entropy_floor"), "report", None)):
        targets.append({"name": name, "value": value, "need": need,
                        "met": None if value is None or op is None else value >= op})
    # Scaling counts only where there is a core per thread; beyond that it cannot be linear.
    usable = [s for s in scaling if s["threads"] <= cores]
    worst = min((s["efficiency"] for s in usable), default=None)
    targets.append({"name": f"thread scaling efficiency (worst, <= {cores} threads)", "value": worst,
                    "need": ">= 0.90", "met": None if worst is None else worst >= 0.9})
    return targets


def main(argv: Optional[Sequence[str]] = None) -> int:
    cores = usable_cores()
    default_threads = ",".join(str(t) for t in [1, 2, 4, 8, 16] if t <= max(cores, 1)) or "1"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--size", default="500x375", help="WIDTHxHEIGHT of the generated JPEGs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.1, help="seconds per timed pass (repeat the pass to reach it)")
    p.add_argument("--threads", default=default_threads, help=f"thread counts for scaling (default {default_threads})")
    p.add_argument("--process-seconds", type=float, default=3.0,
                   help="seconds per run of the independent-process ceiling (0: skip it)")
    p.add_argument("--progressive", action="store_true",
                   help="the same images written as progressive JPEGs (every scan through fastdata's "
                        "progressive Huffman decoder; the libjpeg rows are the A/B)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    width, height = (int(x) for x in args.size.lower().split("x"))
    threads = [int(t) for t in args.threads.split(",")]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    datas = make_images(args.images, width, height, progressive=args.progressive)
    bpp = sum(len(d) for d in datas) / (len(datas) * width * height)
    log(f"generated {len(datas)} photo-like {width}x{height} {'progressive' if args.progressive else 'baseline'} "
        f"JPEGs, {bpp:.2f} bytes/px "
        f"({time.perf_counter() - t0:.1f} s)")
    log("per-core rows")
    res = time_rows(build_rows(datas), len(datas), args.repeats, args.min_time, log)
    log("thread scaling")
    scaling = thread_scaling(datas, threads, args.repeats, args.min_time, log)
    if args.process_seconds > 0:
        ceiling = process_ceiling(datas, threads, args.process_seconds, log)
        base = ceiling[threads[0]] / threads[0]
        for s in scaling:
            rate = ceiling[s["threads"]]
            s.update(processes_images_per_s=rate, processes_efficiency=rate / (base * s["threads"]),
                     threads_vs_processes=s["images_per_s"] / rate)
    targets = evaluate_targets(res, scaling, cores)
    from fastdata.cli.bench_report import machine_info

    machine = machine_info()
    kind = "progressive" if args.progressive else "baseline"
    header = (f"bench_decode: {len(datas)} photo-like {width}x{height} {kind} JPEGs ({bpp:.2f} B/px, q90 4:2:0), "
              f"{args.repeats} rounds, median [min-max]\n{machine['cpu']}, {cores} usable cores, "
              f"Python {platform.python_version()}")
    print_tables(res, scaling, targets, header)
    if args.json is not None:
        doc = {"benchmark": "bench_decode", "command": " ".join(["benchmarks/bench_decode.py"] + list(argv or sys.argv[1:])),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine,
               "images": {"count": len(datas), "width": width, "height": height, "bytes_per_pixel": bpp,
                          "progressive": args.progressive},
               "per_core": res, "thread_scaling": scaling, "targets": targets}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
