"""``fastdata-doctor [DATA]``: why might image training be slow on this machine?

Each check is a small function returning ``Finding``s (name, status, value, advice); the
command prints them (or ``--json``) and exits 1 when any finding is ``fail`` (a broken
setup: torch cannot see an installed GPU, pinned memory fails, libjpeg-turbo without
SIMD, unreadable DATA), else 0. ``warn`` marks something slow but working.

Measurements are short (the whole run takes a few seconds on small data): a 0.5 s decode
loop on one core, ~1 s of reads per storage check, 64 MiB host-to-device copies.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import importlib
import importlib.metadata
import io
import json
import os
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..io.host import usable_cores

__all__ = ["Finding", "main", "run_checks", "STATUSES"]

STATUSES = ("ok", "warn", "fail", "info")
_JPEG_EXT = (".jpg", ".jpeg", ".JPG", ".JPEG")
_SCAN_BUDGET_S = 2.0  # stop counting files after this long and say "at least"
_READ_BUDGET_S = 0.8  # per read-throughput measurement
_DECODE_BUDGET_S = 0.5


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check's result. ``value`` is JSON-serializable; ``advice`` says what to do (or why skipped)."""

    name: str
    status: str  # one of STATUSES
    value: Any
    advice: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


# ---------------------------------------------------------------------------------------
# torch and CUDA
# ---------------------------------------------------------------------------------------


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _nvidia_driver_version() -> Optional[str]:
    """The kernel driver's version from /proc (present whenever an NVIDIA driver is loaded)."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
    except OSError:
        return None
    for tok in line.split():
        if tok[:1].isdigit() and "." in tok:
            return tok
    return line.strip() or None


def _driver_cuda_version() -> Optional[Tuple[int, int]]:
    """Highest CUDA version the installed driver supports (cuDriverGetVersion), or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0 or v.value <= 0:
        return None
    return v.value // 1000, (v.value % 1000) // 10


def check_torch() -> List[Finding]:
    torch = _torch()
    if torch is None:
        return [Finding("torch", "fail", None, "torch is not importable: pip install torch (a CUDA build for GPU training)")]
    return [Finding("torch", "ok", torch.__version__, f"built with CUDA {torch.version.cuda or 'none (CPU-only build)'}")]


def check_cuda() -> List[Finding]:
    torch = _torch()
    if torch is None:
        return [Finding("cuda", "info", "skipped", "torch is not importable")]
    driver = _nvidia_driver_version()
    built = torch.version.cuda
    if not torch.cuda.is_available():
        if driver is not None:
            return [Finding(
                "cuda", "fail", {"available": False, "driver": driver, "torch_cuda": built},
                "an NVIDIA driver is loaded but torch sees no GPU: "
                + ("this torch is a CPU-only build - install a CUDA build of torch" if not built else
                   f"torch was built for CUDA {built}; update the driver or install a torch built for an older CUDA, "
                   "and check CUDA_VISIBLE_DEVICES and nvidia-smi"),
            )]
        return [Finding(
            "cuda", "warn", {"available": False, "driver": None, "torch_cuda": built},
            "no CUDA GPU on this machine (no NVIDIA driver): fastdata.Loader still works with device='cpu', "
            "but GPU checks are skipped; on a GPU machine install the NVIDIA driver and a CUDA build of torch",
        )]
    out = []
    drv = _driver_cuda_version()
    value = {"available": True, "driver": driver, "torch_cuda": built,
             "driver_cuda": f"{drv[0]}.{drv[1]}" if drv else None}
    status, advice = "ok", ""
    if drv is not None and built:
        major, minor = (int(x) for x in built.split(".")[:2])
        if drv[0] < major:
            status, advice = "fail", f"driver supports CUDA {drv[0]}.{drv[1]} < torch's {built}: update the NVIDIA driver"
        elif drv[0] == major and drv[1] < minor:
            status, advice = "warn", (f"driver supports CUDA {drv[0]}.{drv[1]} < torch's {built}: works through minor-version "
                                      "compatibility, but kernels needing JIT may fail; update the driver when you can")
    out.append(Finding("cuda", status, value, advice))
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out.append(Finding("cudnn", "ok" if cudnn else "warn", cudnn,
                       "" if cudnn else "cuDNN unavailable: convolutions will be slow; install a torch wheel with cuDNN"))
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(Finding(f"gpu{i}", "info", {"name": p.name, "memory": _mb(p.total_memory),
                                               "capability": f"{p.major}.{p.minor}"}, ""))
    return out


def _copy_gbps(torch: Any, src: Any, dst: Any, reps: int = 5) -> float:
    dst.copy_(src, non_blocking=True)  # warm-up (first-touch, driver mapping)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return src.numel() * src.element_size() / best / 1e9


def check_pinned_and_h2d() -> List[Finding]:
    torch = _torch()
    if torch is None or not torch.cuda.is_available():
        reason = "skipped: no CUDA device (pinned memory and host-to-device copies need one)"
        return [Finding("pinned_memory", "info", "skipped", reason), Finding("h2d_bandwidth", "info", "skipped", reason)]
    nbytes = 64 * 2**20
    try:
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as e:
        return [
            Finding("pinned_memory", "fail", str(e).splitlines()[0],
                    "cannot allocate pinned host memory: raise the locked-memory limit (ulimit -l unlimited; "
                    "docker --ulimit memlock=-1) or free host RAM"),
            Finding("h2d_bandwidth", "info", "skipped", "skipped: pinned memory unavailable"),
        ]
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned.fill_(1)
    pageable.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    gb_pinned = _copy_gbps(torch, pinned, dst)
    gb_pageable = _copy_gbps(torch, pageable, dst)
    value = {"pinned_GBps": round(gb_pinned, 1), "pageable_GBps": round(gb_pageable, 1)}
    # A 256-image 224x224 uint8 batch is 38.5 MB: at 5 GB/s that is ~8 ms per batch, noticeable.
    if gb_pinned < 5:
        status, advice = "warn", ("slow host-to-device link: check the GPU's PCIe width/generation "
                                  "(nvidia-smi -q | grep -A2 'Link Width') and NUMA placement")
    else:
        status, advice = "ok", "fastdata copies uint8 batches from pinned memory on a side stream"
    return [Finding("pinned_memory", "ok", _mb(nbytes) + " allocated", ""), Finding("h2d_bandwidth", status, value, advice)]


# ---------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------


def check_cpu() -> List[Finding]:
    usable = usable_cores()
    physical = None
    with contextlib.suppress(ImportError):
        import psutil

        physical = psutil.cpu_count(logical=False)
    value = {"logical": os.cpu_count(), "usable": usable, "physical": physical}
    torch = _torch()
    gpus = torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0
    advice = f"fastdata.Loader uses threads=None -> {usable} decode threads"
    status = "ok"
    if gpus:
        per_gpu = usable / gpus
        value["per_gpu"] = round(per_gpu, 1)
        if per_gpu < 8:
            status = "warn"
            advice = (f"{per_gpu:.1f} cores per GPU: CPU decoding tops out near (decode rate x cores); for fast models "
                      "consider GPU decoding (DALI/nvJPEG) or pre-shrunk images (fastdata-convert --max-side)")
    return [Finding("cpu_cores", status, value, advice)]


def check_load() -> List[Finding]:
    try:
        load1, load5, _ = os.getloadavg()
    except OSError:
        return [Finding("cpu_load", "info", None, "os.getloadavg unavailable on this system")]
    usable = usable_cores()
    value = {"load1": round(load1, 2), "load5": round(load5, 2), "usable_cores": usable}
    if load1 > usable:
        return [Finding("cpu_load", "warn", value,
                        "the CPU is already oversubscribed by other processes: decode threads will be starved; "
                        "stop other jobs or pin them elsewhere (taskset/numactl)")]
    return [Finding("cpu_load", "ok", value, "")]


def _native() -> Tuple[Optional[Any], str]:
    try:
        return importlib.import_module("fastdata._C"), ""
    except ImportError as e:
        return None, str(e)


def check_libjpeg() -> List[Finding]:
    mod, err = _native()
    if mod is None:
        return [Finding("libjpeg_turbo", "warn", "unknown",
                        f"fastdata's native extension is not built ({err}): build it "
                        "(pip install --no-build-isolation -e .) to get native decoding")]
    info_fn = getattr(mod, "jpeg_info", None)
    if info_fn is None:
        return [Finding("libjpeg_turbo", "info", "unknown", "this build of fastdata._C does not expose jpeg_info()")]
    info = dict(info_fn())
    simd = info.get("simd")
    if simd is None and info.get("simd_disabled_by_env"):
        simd = False
    if simd is False:
        return [Finding("libjpeg_turbo", "fail", info,
                        "libjpeg-turbo runs without SIMD (built without nasm, or disabled by JSIMD_FORCENONE): "
                        "decoding is 2-2.6x slower; rebuild/link a SIMD-enabled libjpeg-turbo")]
    if simd is None:
        return [Finding("libjpeg_turbo", "info", info,
                        "SIMD not disabled by the environment; whether it was compiled in is not reported - "
                        "decode_rate below compares against Pillow's libjpeg-turbo to tell")]
    return [Finding("libjpeg_turbo", "ok", info, "")]


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


# ---------------------------------------------------------------------------------------
# storage for DATA
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Scan:
    files: List[Tuple[str, int]]  # (path, size); all files seen (bounded by time)
    total_bytes: int
    complete: bool
    lmdb: Optional[str]  # path of a directory holding data.mdb, if found


def _scan(root: str) -> _Scan:
    files: List[Tuple[str, int]] = []
    total = 0
    lmdb_dir = None
    deadline = time.perf_counter() + _SCAN_BUDGET_S
    stack = [root]
    complete = True
    while stack:
        if time.perf_counter() > deadline:
            complete = False
            break
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=True):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=True):
                    size = e.stat().st_size
                    files.append((e.path, size))
                    total += size
                    if e.name == "data.mdb" and lmdb_dir is None:
                        lmdb_dir = d
            except OSError:
                continue
    return _Scan(files, total, complete, lmdb_dir)


def _drop_cache(fd: int) -> None:
    # Ask the kernel to forget this file's clean pages so the read approximates a cold read.
    with contextlib.suppress(AttributeError, OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _read_file(path: str, chunk: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        _drop_cache(fd)
        n = 0
        while True:
            b = os.read(fd, chunk)
            if not b:
                return n
            n += len(b)
    finally:
        os.close(fd)


def _fs_info(path: str) -> Dict[str, Any]:
    """Filesystem type of the mount holding ``path`` and whether its device says rotational."""
    path = os.path.realpath(path)
    best, fstype, dev = "", None, None
    with contextlib.suppress(OSError):
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best):
                    best, dev, fstype = parts[1], parts[0], parts[2]
    rotational = None
    if dev and dev.startswith("/dev/"):
        name = os.path.basename(dev)
        for cand in (name, name.rstrip("0123456789").rstrip("p")):
            with contextlib.suppress(OSError, ValueError):
                with open(f"/sys/block/{cand}/queue/rotational") as f:
                    rotational = f.read().strip() == "1"
                break
    return {"mount": best or None, "fstype": fstype, "device": dev, "rotational": rotational}


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


def _check_fits_ram(scan: _Scan) -> Finding:
    try:
        import psutil

        avail = psutil.virtual_memory().available
    except ImportError:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    value = {"dataset": _mb(scan.total_bytes), "available_ram": _mb(avail)}
    if scan.complete and scan.total_bytes < 0.5 * avail:
        return Finding("fits_in_ram", "ok", value,
                       "the encoded dataset fits in RAM: fastdata.RAMCache(source) removes disk reads after the first epoch")
    return Finding("fits_in_ram", "info", value,
                   "does not fit comfortably in RAM: keep it on local SSD, ideally as an LMDB (fastdata-convert)")


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
    return Finding("lmdb_cache", "info", None,
                   ("no LMDB cache: `fastdata-convert DATA OUT.lmdb` packs many small files into one "
                    "(faster cold reads; --max-side also shrinks decode work)") if small else "no LMDB cache found")


def _sample_jpegs(scan: _Scan, n: int = 20) -> List[bytes]:
    jpegs = [p for p, s in scan.files if p.endswith(_JPEG_EXT) and 0 < s < 32 << 20]
    random.Random(0).shuffle(jpegs)
    out = []
    for p in jpegs[:n]:
        with contextlib.suppress(OSError):
            with open(p, "rb") as f:
                out.append(f.read())
    return out


def check_shm() -> List[Finding]:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return [Finding("dev_shm", "info", None, "/dev/shm not present")]
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    value = {"size": _mb(size), "free": _mb(free)}
    if size < 1 << 30:
        return [Finding("dev_shm", "warn", value,
                        "/dev/shm is small: torch DataLoader workers pass batches through it and crash with 'Bus error' "
                        "(docker: --shm-size=8g or --ipc=host); fastdata.Loader uses threads and does not need it")]
    return [Finding("dev_shm", "ok", value, "")]


# ---------------------------------------------------------------------------------------
# optional packages
# ---------------------------------------------------------------------------------------


def check_packages() -> List[Finding]:
    dists: Dict[str, str] = {}
    for d in importlib.metadata.distributions():
        name = (d.metadata["Name"] or "").lower()
        if name:
            dists[name] = d.version
    out = []

    def find(*names: str) -> Optional[Tuple[str, str]]:
        for n in names:
            if n in dists:
                return n, dists[n]
        return None

    dali = sorted((n, v) for n, v in dists.items() if n.startswith("nvidia-dali"))
    out.append(Finding("dali", "ok" if dali else "info", {n: v for n, v in dali} or None,
                       "" if dali else "not installed (optional GPU-decode backend): pip install nvidia-dali-cuda130"))
    tv = find("torchvision")
    out.append(Finding("torchvision", "ok" if tv else "info", tv[1] if tv else None,
                       "" if tv else "not installed: needed for torch DataLoader baselines and torchvision models"))
    pil = find("pillow-simd", "pillow")
    pil_value: Any = None
    advice = ""
    if pil:
        pil_value = {"dist": pil[0], "version": pil[1], "simd": pil[0] == "pillow-simd" or ".post" in pil[1]}
        with contextlib.suppress(ImportError, ValueError):
            from PIL import features

            pil_value["libjpeg_turbo"] = features.version_feature("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None
        if not pil_value.get("libjpeg_turbo"):
            advice = "Pillow is not linked with libjpeg-turbo: its decode (non-JPEG fallback, baselines) is slower"
    out.append(Finding("pillow", "ok" if pil else "warn", pil_value, advice if pil else "Pillow missing: pip install pillow"))
    lm = find("lmdb")
    out.append(Finding("lmdb", "ok" if lm else "info", lm[1] if lm else None,
                       "" if lm else "not installed: fastdata.LMDBSource and fastdata-convert need `pip install lmdb`"))
    cv = find("opencv-python-headless", "opencv-python", "opencv-contrib-python")
    out.append(Finding("opencv", "ok" if cv else "info", f"{cv[0]} {cv[1]}" if cv else None, ""))
    nv = find("nvidia-ml-py", "pynvml")
    out.append(Finding("nvml", "ok" if nv else "info", f"{nv[0]} {nv[1]}" if nv else None,
                       "" if nv else "optional: pip install nvidia-ml-py so the stall meter reports GPU utilization"))
    ps = find("psutil")
    out.append(Finding("psutil", "ok" if ps else "info", ps[1] if ps else None,
                       "" if ps else "optional: pip install psutil for CPU utilization of DataLoader worker processes"))
    return out


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
