"""Named ranges around loader stages, for the PyTorch profiler and Nsight Systems.

``with stage("fastdata.decode"): ...`` marks a span of work:

* as an NVTX range (visible in Nsight Systems, from any thread) when NVTX is on:
  ``FASTDATA_NVTX=1`` in the environment or ``enable_nvtx(True)``;
* otherwise as a ``torch.profiler.record_function`` range when the PyTorch profiler is
  recording on the calling thread;
* otherwise not at all: the check costs well under a microsecond, where an unconditional
  ``record_function`` costs ~8 µs (measured on the 2-core CPU box), too much for a
  per-batch hot path.

The PyTorch profiler only records threads that were profiling when it started (its state
is thread-local), so spans opened on a loader's background thread show up in Nsight (NVTX)
but not in ``torch.profiler``; spans on the training thread (waiting for a batch, the H2D
enqueue, GPU normalize) show up in both.

torch is never imported here: when the process has not imported it, there is no profiler
to talk to, and ``import fastdata.diagnostics.tracing`` stays cheap for decode-only users.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import ContextManager, Iterator, Optional

__all__ = ["stage", "enable_nvtx", "nvtx_enabled", "STAGES"]

# Canonical stage names, so the loader, the stall meter and users agree on spelling.
STAGES = (
    "fastdata.wait",       # training thread blocked on the next batch
    "fastdata.fetch",      # source lookup: paths, LMDB gets, RAM cache slices
    "fastdata.decode",     # native decode + crop/resize/flip into the pinned slot
    "fastdata.fallback",   # non-JPEG samples decoded by Pillow
    "fastdata.h2d",        # enqueue of the host-to-device copy on the side stream
    "fastdata.normalize",  # GPU cast/normalize/channels_last
    "fastdata.step",       # the training step, as seen by the stall meter
)

_nvtx_on: bool = os.environ.get("FASTDATA_NVTX", "") not in ("", "0")
_NULL = contextlib.nullcontext()


def enable_nvtx(on: bool = True) -> None:
    """Turn NVTX ranges on or off for every later ``stage`` (process-wide, any thread)."""
    global _nvtx_on
    _nvtx_on = bool(on)


def nvtx_enabled() -> bool:
    return _nvtx_on


@contextlib.contextmanager
def _nvtx_range(name: str) -> Iterator[None]:
    nvtx = sys.modules["torch"].cuda.nvtx
    nvtx.range_push(name)
    try:
        yield
    finally:
        nvtx.range_pop()


def stage(name: str) -> ContextManager[None]:
    """A context manager marking ``name`` as a range; a shared no-op when nobody listens.

    Thread-safe; callable from any thread. ``name`` should be one of ``STAGES`` for the
    loader's own stages (any string works).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return _NULL
    if _nvtx_on:
        return _nvtx_range(name)
    if _profiler_recording(torch):
        return torch.profiler.record_function(name)
    return _NULL


def _profiler_recording(torch: object) -> bool:
    enabled: Optional[object] = getattr(
        getattr(getattr(torch, "_C", None), "_autograd", None), "_profiler_enabled", None
    )
    # A torch without the private probe: fall back to always recording (correct, slower).
    return bool(enabled()) if callable(enabled) else True
