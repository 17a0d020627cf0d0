"""``fastdata-doctor [DATA]``: why might image training be slow on this machine?

The checks are in fastdata/diagnostics/doctor_checks.py (each returns ``Finding``s: name,
status, value, advice); this command runs them, prints them (or ``--json``) and exits 1 when
any finding is ``fail`` (a broken setup: torch cannot see an installed GPU, pinned memory
fails, libjpeg-turbo without SIMD, unreadable DATA), else 0. ``warn`` marks something slow but
working. Four checks stay here because they need layers above diagnostics: the decode rate
(the demo set's JPEG generator in cli.demo, and the public ``fastdata.decode``), DATA's mix of
JPEG kinds (``fastdata.probe`` over up to 200 files' headers), storage
(it opens an LMDB cache with sources.lmdb.LMDBSource) and the GPU's hardware JPEG engines
(the gpu decoder's nvImageCodec setup, decoders.nvimgcodec).

Measurements are short (the whole run takes a few seconds on small data): a 0.5 s decode
loop on one core, ~1 s of reads per storage check, 64 MiB host-to-device copies.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..diagnostics.doctor_checks import (STATUSES, Finding, _check_fits_ram, _drop_cache, _fs_info, _mb, _read_file,
                                         _jpeg_paths, _sample_jpegs, _Scan, _scan, check_cpu, check_cuda, check_libjpeg, check_load,
                                         check_packages, check_pinned_and_h2d, check_shm, check_torch)
from ..io.host import usable_cores

__all__ = ["main", "run_checks"]

_READ_BUDGET_S = 0.8  # per read-throughput measurement
_DECODE_BUDGET_S = 0.5



def _rate(fn: Callable[[bytes], Any], datas: Sequence[bytes]) -> float:
    """Images/s of ``fn`` over ``datas`` on this thread, looping for ~_DECODE_BUDGET_S."""
    fn(datas[0])  # warm-up: first call loads codecs / allocates
    n, t0 = 0, time.perf_counter()
    while True:
        for d in datas:
            fn(d)
        n += len(datas)
        dt = time.perf_counter() - t0
        if dt > _DECODE_BUDGET_S:
            return n / dt


def check_gpu_jpeg_engines() -> List[Finding]:
    """Whether backend="gpu"/"hybrid" would decode on the GPU's hardware JPEG engines: the gpu
    extra installed, a CUDA device, and a batch of 32 baseline JPEGs decoded there."""
    from ..decoders.nvimgcodec import ENGINE_KINDS, gpu_extra_installed, nvimgcodec_module
    from .demo import photo_like_jpeg

    if not gpu_extra_installed():
        return [Finding("gpu_jpeg_engines", "info", "gpu extra not installed",
                        "the default backend decodes on the CPU; the CPU+GPU split (backend='hybrid') and "
                        "backend='gpu' need it: pip install fastdata[gpu]")]
    import torch

    if not torch.cuda.is_available():
        return [Finding("gpu_jpeg_engines", "info", "no CUDA device", "the hardware JPEG engines need a GPU")]
    nvimgcodec = nvimgcodec_module()
    name = torch.cuda.get_device_name()
    try:
        decoder = nvimgcodec.Decoder(max_num_cpu_threads=2,
                                     backends=[nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, k))
                                               for k in ENGINE_KINDS])
    except Exception as e:  # nvImageCodec raises its own types
        return [Finding("gpu_jpeg_engines", "warn", {"gpu": name, "hardware_engines": False},
                        f"nvImageCodec has no hardware JPEG decoder here ({e}): backend='gpu' and 'hybrid' fail "
                        "to start (the default decodes on the CPU); A100, H100 and H200 have the engines")]
    jpeg = np.frombuffer(photo_like_jpeg(0, 0, 500, 375), np.uint8)
    t0 = time.perf_counter()
    images = decoder.decode([nvimgcodec.CodeStream(jpeg) for _ in range(32)])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    done = sum(img is not None for img in images)
    value = {"gpu": name, "hardware_engines": done == 32, "decoded": f"{done}/32",
             "img_per_s_first_batch": round(32 / seconds)}
    if done < 32:
        return [Finding("gpu_jpeg_engines", "warn", value,
                        "the hardware JPEG engines refused baseline 4:2:0 JPEGs: backend='gpu' would hand them "
                        "to the native threads")]
    return [Finding("gpu_jpeg_engines", "ok", value, "backend='hybrid' can split batches between the native "
                                                      "threads and these engines; the default decodes on the CPU, "
                                                      "which beside a training step that keeps the GPU busy was faster")]


def check_decode_rate(samples: Optional[Sequence[bytes]], origin: str) -> List[Finding]:
    from PIL import Image

    from ..io.pillow_fallback import FALLBACK_FORMATS

    if samples:
        datas = list(samples)
    else:  # the demo set's generator: ImageNet-like photos of the size bench_decode.py uses
        from .demo import photo_like_jpeg

        datas = [photo_like_jpeg(0, i, 500, 375) for i in range(20)]
    origin = origin if samples else "20 generated photo-like 500x375 JPEGs"

    def pil(d: bytes) -> Any:
        with Image.open(io.BytesIO(d), formats=("JPEG",) + FALLBACK_FORMATS) as im:  # never EPS & co.
            return im.convert("RGB").load()

    value: Dict[str, Any] = {"images": origin, "pillow_img_per_s": round(_rate(pil, datas))}
    try:
        import fastdata

        decode = fastdata.decode
    except (ImportError, AttributeError) as e:
        return [Finding("decode_rate", "warn", value,
                        f"fastdata.decode unavailable ({e}); only Pillow measured - build the native extension")]
    try:
        value["fastdata_img_per_s"] = round(_rate(decode, datas))
    except ValueError as e:  # DecodeError is a ValueError: a sample image is bad, say which
        return [Finding("decode_rate", "warn", value, f"fastdata.decode failed on a sample image: {e}")]
    cores = usable_cores()
    ratio = value["fastdata_img_per_s"] / max(value["pillow_img_per_s"], 1)
    value["per_core_vs_pillow"] = round(ratio, 2)
    if ratio < 0.6:
        # Both run libjpeg-turbo full decodes; a SIMD-less build is 2-2.6x slower.
        return [Finding("decode_rate", "warn", value,
                        "fastdata decodes much slower than Pillow on one core: its libjpeg-turbo likely runs without "
                        "SIMD (built without nasm) - link a SIMD-enabled libjpeg-turbo")]
    return [Finding("decode_rate", "ok", value,
                    f"single core, full decode; with {cores} cores expect roughly "
                    f"{value['fastdata_img_per_s'] * cores:,.0f} img/s before crop savings")]


# What DATA's JPEGs are, from their headers: the kinds that cost the CPU more than a baseline
# JPEG, or that the GPU's hardware JPEG engines refuse (backend='hybrid' and 'gpu' hand those
# to the native threads). One fused RandomResizedCrop(224) on one core, the demo set (Intel
# Xeon 2-core box, 2026-12-05): baseline 4:2:0 0.71 ms, progressive 2.05 ms, CMYK 1.17 ms.
MIX_SAMPLE = 200
MIX_PREFIX = 256 << 10  # headers end before this in most files; else the whole file is read
MIX_BUDGET_S = 3.0  # slow storage: the files sampled until then
MIX_PROGRESSIVE_PCT = 5.0
MIX_CMYK_PCT = 1.0
MIX_MEGAPIXELS = 1.0  # a median above this decodes far more than a 224-pixel crop needs


def check_data_mix(scan: _Scan) -> List[Finding]:
    import fastdata

    jpegs = _jpeg_paths(scan)
    if not jpegs:
        return [Finding("data_mix", "info", "no JPEG files", "DATA holds no .jpg/.jpeg files (non-empty, under 32 MB) to sample "
                                                             "(an LMDB cache's records are not sampled)")]
    counts = dict(progressive=0, cmyk=0, gray=0, exif_rotated=0, bad_header=0)
    megapixels: List[float] = []
    bad: List[str] = []
    n = 0
    deadline = time.perf_counter() + MIX_BUDGET_S
    for path in jpegs[:MIX_SAMPLE]:
        if n and time.perf_counter() > deadline:
            break
        n += 1
        try:
            with open(path, "rb") as f:
                head = f.read(MIX_PREFIX)
                try:
                    info = fastdata.probe(head)
                except ValueError:  # DecodeError: maybe only cut short (a big ICC profile or XMP before the frame)
                    if len(head) < MIX_PREFIX:
                        raise
                    info = fastdata.probe(head + f.read())  # _jpeg_paths: under 32 MB
        except (OSError, ValueError):  # unreadable, or no JPEG header
            counts["bad_header"] += 1
            bad.append(path)
            continue
        counts["progressive"] += bool(info.progressive)
        counts["cmyk"] += info.color_space in ("cmyk", "ycck")
        counts["gray"] += info.color_space == "gray"
        counts["exif_rotated"] += info.orientation != 1
        megapixels.append(info.width * info.height / 1e6)
    pct = {k: round(100.0 * v / n, 1) for k, v in counts.items()}
    value: Dict[str, Any] = {"sampled": n, **{f"{k}_pct": v for k, v in pct.items()},
                             "median_megapixels": round(float(np.median(megapixels)), 2) if megapixels else None}
    advice = []
    if pct["progressive"] >= MIX_PROGRESSIVE_PCT:
        advice.append(f"{pct['progressive']:g}% progressive: each is entropy-decoded whole before a row comes out "
                      "(about 3x the CPU time of a baseline crop) and the GPU's JPEG engines refuse them; "
                      "`fastdata-convert DATA OUT.lmdb` rewrites them as baseline JPEGs, losslessly")
    if pct["cmyk"] >= MIX_CMYK_PCT:
        advice.append(f"{pct['cmyk']:g}% CMYK/YCCK: decoded on the CPU only (the GPU's JPEG engines refuse them), "
                      "at about 1.6x a baseline crop's time")
    if value["median_megapixels"] is not None and value["median_megapixels"] > MIX_MEGAPIXELS:
        advice.append(f"median {value['median_megapixels']:g} megapixels: decode work grows with the file, not the "
                      "crop; for training at 224 px `fastdata-convert DATA OUT.lmdb --max-side 512` shrinks it once")
    if counts["bad_header"]:
        advice.append(f"{counts['bad_header']} sampled file(s) have no readable JPEG header (first: {bad[0]}): "
                      "Loader(on_error='skip') counts them, 'raise' names them")
    return [Finding("data_mix", "info" if advice else "ok", value, "; ".join(advice))]


# ---------------------------------------------------------------------------------------
# storage for DATA
# ---------------------------------------------------------------------------------------


_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "fuse", "fuse.s3fs", "fuse.gcsfuse", "lustre", "gpfs", "beegfs", "9p", "ceph")


def check_storage(data: str, scan: _Scan, decode_rate: Optional[float]) -> List[Finding]:
    out: List[Finding] = []
    fs = _fs_info(data)
    count = f"{len(scan.files):,}" + ("" if scan.complete else "+ (scan stopped after 2 s)")
    out.append(Finding("data_size", "ok" if scan.files else "fail",
                       {"files": len(scan.files), "bytes": scan.total_bytes, "human": f"{count} files, {_mb(scan.total_bytes)}",
                        "complete": scan.complete, **fs},
                       "" if scan.files else f"no files under {data}"))
    if not scan.files:
        return out
    # Sequential: the largest files in 1 MiB chunks.
    big = sorted(scan.files, key=lambda f: -f[1])
    n, t0, used = 0, time.perf_counter(), 0
    for path, _ in big:
        with contextlib.suppress(OSError):
            n += _read_file(path, 2**20)
        used += 1
        if time.perf_counter() - t0 > _READ_BUDGET_S or n > 512 * 2**20:
            break
    seq = n / max(time.perf_counter() - t0, 1e-9)
    # Random: whole small files in random order (the ImageFolder access pattern), or random
    # 64 KiB preads inside an LMDB data.mdb.
    rng = random.Random(0)
    n_files, n_bytes, t0 = 0, 0, time.perf_counter()
    if scan.lmdb and len(scan.files) < 8:
        mdb = os.path.join(scan.lmdb, "data.mdb")
        size = os.path.getsize(mdb)
        fd = os.open(mdb, os.O_RDONLY)
        try:
            _drop_cache(fd)
            while time.perf_counter() - t0 < _READ_BUDGET_S:
                n_bytes += len(os.pread(fd, 65536, rng.randrange(0, max(1, size - 65536))))
                n_files += 1
        finally:
            os.close(fd)
    else:
        order = list(scan.files)
        rng.shuffle(order)
        for path, _ in order[:5000]:
            with contextlib.suppress(OSError):
                n_bytes += _read_file(path, 1 << 22)
                n_files += 1
            if time.perf_counter() - t0 > _READ_BUDGET_S:
                break
    dt = max(time.perf_counter() - t0, 1e-9)
    value = {"sequential_MBps": round(seq / 1e6, 1), "random_MBps": round(n_bytes / dt / 1e6, 1),
             "random_reads_per_s": round(n_files / dt)}
    # Page cache: DONTNEED cannot drop pages that are mapped or dirty, and tmpfs is RAM.
    warm = fs.get("fstype") in ("tmpfs", "ramfs") or seq > 8e9
    value["page_cache_maybe_warm"] = warm
    demand = (decode_rate or 1000.0) * usable_cores()
    status, advice = "ok", ""
    network = fs.get("fstype") in _NETWORK_FS or str(fs.get("fstype", "")).startswith("fuse")
    if value["random_reads_per_s"] < demand and not warm:
        status = "warn"
        advice = (f"random reads ({value['random_reads_per_s']:,}/s) are below what decoding can consume "
                  f"(~{demand:,.0f} img/s): cache the data (fastdata.RAMCache if it fits, or an LMDB on local SSD "
                  "via fastdata-convert)")
    elif network:
        status, advice = "warn", f"{fs['fstype']} is a network filesystem: copy or convert the dataset to local disk"
    if warm:
        advice = (advice + "; " if advice else "") + ("the page cache was probably warm (or the data lives in RAM): "
                                                       "cold-read speed is unknown")
    out.append(Finding("read_throughput", status, value, advice))
    out.append(_check_fits_ram(scan))
    out.append(_check_lmdb(data, scan))
    return out


def _check_lmdb(data: str, scan: _Scan) -> Finding:
    candidates = [scan.lmdb] if scan.lmdb else []
    for sibling in (data.rstrip("/") + ".lmdb", os.path.join(data, "lmdb")):
        if os.path.isfile(os.path.join(sibling, "data.mdb")):
            candidates.append(sibling)
    if candidates:
        from ..cache.format import CacheFormatError
        from ..sources.lmdb import LMDBSource

        try:  # open it as a reader would: a cache that is there but broken is a failure
            LMDBSource(candidates[0], verify=False).close()
        except (CacheFormatError, OSError) as exc:
            return Finding("lmdb_cache", "fail", candidates[0], f"not a readable fastdata cache: {exc}")
        return Finding("lmdb_cache", "ok", candidates[0], "use it with fastdata.LMDBSource(path)")
    small = scan.files and scan.total_bytes / len(scan.files) < 1 << 20
    advice = []
    if _jpeg_paths(scan):
        # Per core on 500x375 photo-like JPEGs, benchmarks/bench_decode.py's restart-indexed row
        # against the fused crop's: 1,906 / 1,347 img/s (2-core box, 2026-12-06, docs/results.md).
        advice.append("stores the JPEGs rewritten losslessly with a restart index, so that a crop decodes only "
                      "the parts it needs (1.4x the decode rate per core on 500x375 photos)")
    if small:
        advice.append("packs many small files into one (faster cold reads; --max-side also shrinks decode work)")
    if not advice:
        return Finding("lmdb_cache", "info", None, "no LMDB cache found")
    return Finding("lmdb_cache", "info", None,
                   "no LMDB cache: `fastdata-convert DATA OUT.lmdb` (an ImageFolder or a 'path,label' list) "
                   + "; it also ".join(advice))


# ---------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------


def _guard(name: str, fn: Callable[[], List[Finding]]) -> List[Finding]:
    """Run one check; a crash in a check is a doctor bug, reported as a warning, not a crash."""
    try:
        return fn()
    except Exception as e:  # deliberately broad: one broken check must not hide the others
        return [Finding(name, "warn", f"check crashed: {type(e).__name__}: {e}", "please report this as a fastdata bug")]


def run_checks(data: Optional[str] = None, *, gpu: bool = True) -> List[Finding]:
    """Every check, in display order. ``data`` is a dataset directory (ImageFolder or LMDB)."""
    findings: List[Finding] = []
    findings += _guard("torch", check_torch)
    if gpu:
        findings += _guard("cuda", check_cuda)
        findings += _guard("h2d_bandwidth", check_pinned_and_h2d)
        findings += _guard("gpu_jpeg_engines", check_gpu_jpeg_engines)
    findings += _guard("cpu_cores", check_cpu)
    findings += _guard("cpu_load", check_load)
    findings += _guard("libjpeg_turbo", check_libjpeg)
    scan = None
    if data is not None:
        if not os.path.isdir(data):
            findings.append(Finding("data", "fail", data, "DATA is not a readable directory"))
            data = None
        else:
            scan = _scan(data)
    samples = _sample_jpegs(scan) if scan is not None else []
    decode = _guard("decode_rate", lambda: check_decode_rate(samples, f"{len(samples)} JPEGs from DATA"))
    findings += decode
    rate = None
    if decode and isinstance(decode[0].value, dict):
        rate = decode[0].value.get("fastdata_img_per_s") or decode[0].value.get("pillow_img_per_s")
    if data is not None and scan is not None:
        findings += _guard("data_mix", lambda: check_data_mix(scan))
        findings += _guard("storage", lambda: check_storage(data, scan, rate))
    else:
        findings.append(Finding("storage", "info", "skipped", "pass DATA (a dataset directory) to measure its storage"))
    findings += _guard("dev_shm", check_shm)
    findings += _guard("packages", check_packages)
    return findings


_MARK = {"ok": "  ok ", "warn": " WARN", "fail": " FAIL", "info": " info"}


def _fmt_value(v: Any) -> str:
    if isinstance(v, dict):
        if "human" in v:
            return str(v["human"])
        return ", ".join(f"{k}={x}" for k, x in v.items() if x is not None)
    return "-" if v is None else str(v)


def format_findings(findings: Sequence[Finding]) -> str:
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{_MARK[f.status]}  {f.name:<{width}}  {_fmt_value(f.value)}")
        if f.advice:
            lines.append(f"       {'':<{width}}  -> {f.advice}")
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    lines.append("")
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def exit_status(findings: Sequence[Finding]) -> int:
    """1 when any finding is ``fail``, else 0."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fastdata-doctor",
        description="Check this machine and a dataset for what limits image-training input speed.",
    )
    parser.add_argument("data", nargs="?", help="dataset directory (ImageFolder tree or LMDB directory)")
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    parser.add_argument("--no-gpu", action="store_true", help="skip CUDA checks (do not initialize CUDA)")
    args = parser.parse_args(argv)
    findings = run_checks(args.data, gpu=not args.no_gpu)
    status = exit_status(findings)
    if args.json:
        print(json.dumps({"findings": [dataclasses.asdict(f) for f in findings],
                          "counts": {s: sum(f.status == s for f in findings) for s in STATUSES},
                          "exit_status": status}, indent=2, default=str))
    else:
        print(format_findings(findings))
    return status


if __name__ == "__main__":
    sys.exit(main())
