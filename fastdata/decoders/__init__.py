"""Decoding backends behind fastdata.Loader: "native" (libjpeg-turbo threads), "nvjpeg", "dali".

Every backend has the same small interface, called from the Loader's producer thread::

    backend = make_backend(name, transform, device=..., dtype=..., mean=..., std=...,
                           channels_last=..., seed=..., strict=..., max_pixels=..., threads=...)
    images, failures, failed_rows = backend.run(items, indices, epoch)
    backend.close()

and the same crops: every backend takes its boxes and flips from the native engine's plan
for (seed, epoch, index), so switching backends changes decoder rounding, not the samples.
"""
from __future__ import annotations

from typing import Any

from ..io.transforms import Transform
from .common import BatchBackend

__all__ = ["BACKENDS", "BatchBackend", "make_backend", "DALI_MISSING"]

BACKENDS = ("native", "nvjpeg", "dali")

DALI_MISSING = "backend='dali' needs NVIDIA DALI: pip install fastdata[dali] (nvidia-dali-cuda130)"


def make_backend(name: str, transform: Transform, **config: Any) -> BatchBackend:
    """Build backend ``name`` ("native", "nvjpeg" or "dali") for ``transform``.

    config: device, dtype, mean, std, channels_last, seed, strict, max_pixels, threads, and
    for "dali" also hw_decoder_load, batch_size, prefetch (see DaliBackend).
    Raises ImportError with the install command when DALI is asked for but missing.
    """
    if name == "native":
        from .native import NativeBackend
        return NativeBackend(transform, **config)
    if name == "nvjpeg":
        from .nvjpeg import NvjpegBackend
        return NvjpegBackend(transform, **config)
    if name == "dali":
        from .dali import DaliBackend, dali_available
        if not dali_available():
            raise ImportError(DALI_MISSING)
        return DaliBackend(transform, **config)
    raise ValueError(f"backend must be one of {', '.join(repr(b) for b in BACKENDS)}, got {name!r}")
