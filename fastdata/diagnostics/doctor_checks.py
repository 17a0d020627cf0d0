"""The checks behind ``fastdata-doctor``: each is a small function returning ``Finding``s
(name, status, value, advice) about this machine or a dataset directory.

``fail`` marks a broken setup (torch cannot see an installed GPU, pinned memory fails,
libjpeg-turbo without SIMD), ``warn`` something slow but working. The command line that runs
them and prints the findings is fastdata/cli/doctor.py; the checks that need higher layers
(decode rate: the demo set's generator and the public ``fastdata.decode``; storage: opening an
LMDB cache through sources) live there too.

Measurements are short: ~1 s of reads per storage check, 64 MiB host-to-device copies.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import importlib.metadata
import os
import random
import time
from typing import Any, Dict, List, Optional, Tuple

from ..io.host import usable_cores

__all__ = ["Finding", "STATUSES", "check_torch", "check_cuda", "check_pinned_and_h2d", "check_cpu", "check_load",
           "check_libjpeg", "check_shm", "check_packages"]

STATUSES = ("ok", "warn", "fail", "info")
_JPEG_EXT = (".jpg", ".jpeg", ".JPG", ".JPEG")
_SCAN_BUDGET_S = 2.0  # stop counting files after this long and say "at least"


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
                      "consider an LMDB made with fastdata-convert (restart-indexed crops) or pre-shrunk images "
                      "(fastdata-convert --max-side); where fastdata.profile finds the loader input-bound "
                      "from files, try the CPU+GPU split (backend='hybrid')")
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
    # fastdata's own switches for tests and A/B runs, slow when left set in a training job (the
    # extension names those set, by its own reading of the environment)
    forced = list(info.get("test_switches", []))
    if forced:
        return [Finding("libjpeg_turbo", "warn", info,
                        f"{' and '.join(forced)} set: fastdata's decoders run their slower copies (tests and A/B runs "
                        "only; progressive JPEGs decode ~1.4-1.9x slower, and FORCE_SCALAR also slows resizing); "
                        "unset it")]
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


def _check_fits_ram(scan: _Scan) -> Finding:
    try:
        import psutil

        avail = psutil.virtual_memory().available
    except ImportError:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    value = {"dataset": _mb(scan.total_bytes), "available_ram": _mb(avail)}
    if scan.complete and scan.total_bytes < 0.5 * avail:
        return Finding("fits_in_ram", "ok", value,
                       "the encoded dataset fits in RAM: fastdata.RAMCache(source) removes disk reads after the first epoch "
                       "(of a fastdata-convert LMDB, RAMCache(LMDBSource(path)), it keeps the faster restart-indexed records)")
    return Finding("fits_in_ram", "info", value,
                   "does not fit comfortably in RAM: keep it on local SSD, ideally as an LMDB (fastdata-convert)")


def _jpeg_paths(scan: _Scan) -> List[str]:
    """The scan's JPEG files (non-empty, under 32 MB) in one fixed random order: every check
    that samples DATA's JPEGs takes a prefix of it."""
    jpegs = [p for p, s in scan.files if p.endswith(_JPEG_EXT) and 0 < s < 32 << 20]
    random.Random(0).shuffle(jpegs)
    return jpegs


def _sample_jpegs(scan: _Scan, n: int = 20) -> List[bytes]:
    out = []
    for p in _jpeg_paths(scan)[:n]:
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
