"""GPU counters read on a background thread: the GPU's busy share (the stall meter's GPU
utilization) and its hardware JPEG engines' busy share (fastdata-bench's engine occupancy),
through NVML (``pynvml``, the nvidia-ml-py package that CUDA builds of torch bring).

``gpu_util_reader`` and ``jpeg_util_reader`` return (read, source): ``read`` is a
zero-argument callable returning a percentage (it raises if the counter fails later), ``source``
says where it comes from; or None where the counter cannot be read (no CUDA, no NVML, a driver
or GPU without it). ``PeriodicSampler`` calls a ``read`` every ``period`` seconds and keeps the
values.
"""
from __future__ import annotations

import sys
import threading
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

__all__ = ["PeriodicSampler", "gpu_util_reader", "jpeg_util_reader"]


class PeriodicSampler:
    """Calls ``read`` on a daemon thread, ``period`` seconds apart, from ``start`` to ``stop``,
    and keeps the values (the last ``keep`` of them) for ``take``. A ``read`` that raises
    ends the sampling quietly."""

    def __init__(self, read: Callable[[], float], source: str, *, period: float, name: str,
                 keep: Optional[int] = None):
        self.source = source
        self._read = read
        self._period = period
        self._name = name
        self._samples: Deque[float] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def name(self) -> str:
        """Its thread's name."""
        return self._name

    def start(self) -> None:
        """(Re)start sampling; a no-op while the thread runs."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name=self._name, daemon=True)
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self._period):
            try:
                value = float(self._read())
            except Exception:  # NVML can fail transiently (driver reset, MIG); stop sampling quietly
                return
            with self._lock:
                self._samples.append(value)

    def take(self) -> List[float]:
        """The samples since the last take."""
        with self._lock:
            samples = list(self._samples)
            self._samples.clear()
        return samples

    def stop(self) -> None:
        """Stop sampling; samples taken so far stay available to ``take``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


def _nvml_handle() -> Tuple[Any, Any]:
    """(pynvml, the NVML handle of torch's current CUDA device); raises where there is none."""
    torch = sys.modules["torch"]
    import pynvml

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    # NVML indexes ignore CUDA_VISIBLE_DEVICES; the UUID names the same physical GPU.
    return pynvml, pynvml.nvmlDeviceGetHandleByUUID(("GPU-" + uuid if not uuid.startswith("GPU-") else uuid).encode())


def _cuda() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available()


def gpu_util_reader() -> Optional[Tuple[Callable[[], float], str]]:
    """A reader of the current CUDA device's utilization (percent of time a kernel ran) and
    its source ("nvml" or "torch"), or None."""
    if not _cuda():
        return None
    try:
        pynvml, handle = _nvml_handle()
        pynvml.nvmlDeviceGetUtilizationRates(handle)
        return (lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), "nvml"
    except Exception:  # pynvml absent or too old, or NVML unusable here: try torch's wrapper
        pass
    torch = sys.modules["torch"]
    device = torch.cuda.current_device()
    try:
        torch.cuda.utilization(device)
        return (lambda: torch.cuda.utilization(device)), "torch"
    except Exception:  # torch.cuda.utilization needs pynvml/amdsmi; no GPU util then
        return None


def jpeg_util_reader() -> Optional[Tuple[Callable[[], float], str]]:
    """A reader of how busy the current CUDA device's hardware JPEG engines are (percent, the
    driver's average over its last sampling period, over all the engines) and its source
    ("nvml"), or None (no pynvml, or a GPU or driver without the counter)."""
    if not _cuda():
        return None
    try:
        pynvml, handle = _nvml_handle()
        pynvml.nvmlDeviceGetJpgUtilization(handle)  # [percent, sampling period in us]
        return (lambda: pynvml.nvmlDeviceGetJpgUtilization(handle)[0]), "nvml"
    except Exception:  # pynvml absent or too old, NVML unusable, or no JPEG engines here
        return None
