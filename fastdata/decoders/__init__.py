"""The decoders the Loader's pipeline can use: "native" (libjpeg-turbo threads, always
present: it takes every row the others do not), "gpu" (nvImageCodec on the GPU's hardware
JPEG engines, the ``gpu`` extra; "hybrid" is the same decoder sharing each batch with the
native threads, balanced by the pipeline), "nvjpeg" (torchvision's GPU decoder) and "dali"
(NVIDIA DALI, optional extra).

Every decoder has the same small interface (fastdata.decoders.base.Decoder): it says which
rows it ``accepts`` from the header facts of a planned batch (routing.py), then ``start``s
and ``finish``es them. All take their crop boxes and flips from the native engine's plan for
(seed, epoch, index), so switching decoders changes rounding, not the samples.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..io.transforms import Transform
from .base import Decoder

__all__ = ["BACKENDS", "DALI_MISSING", "Decoder", "make_decoder"]

BACKENDS = ("native", "gpu", "hybrid", "nvjpeg", "dali")

DALI_MISSING = "backend='dali' needs NVIDIA DALI: pip install fastdata[dali] (nvidia-dali-cuda130)"


def make_decoder(name: str, transform: Transform, *, device: torch.device, threads: int,
                 **options: Any) -> Optional[Decoder]:
    """The decoder that runs before the native one for backend ``name``: None for "native",
    an NvImageCodecDecoder for "gpu" and "hybrid" (``options``: cpu_threads, decode_threads, lanes, depth), an
    NvjpegDecoder, or a DaliDecoder (``options``: hw_decoder_load, batch_size, prefetch).

    Raises ValueError for an unknown name or a GPU decoder without CUDA, and ImportError with
    the install command when DALI or nvImageCodec is asked for but missing.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(repr(b) for b in BACKENDS)}, got {name!r}")
    if name not in ("dali", "gpu", "hybrid") and options:
        raise TypeError(f"backend={name!r} takes no options, got {sorted(options)}")
    if name == "native":
        return None
    if name in ("gpu", "hybrid"):
        from . import nvimgcodec
        if name == "hybrid":  # its own layout (nvimgcodec.HYBRID_DECODE_LANES), where not given
            options = dict(options)
            for key, default in (("lanes", nvimgcodec.HYBRID_DECODE_LANES), ("depth", nvimgcodec.HYBRID_DEPTH)):
                if options.get(key) is None:
                    options[key] = default
        return nvimgcodec.NvImageCodecDecoder(transform, device=device, **options)
    if name == "nvjpeg":
        from .nvjpeg import NvjpegDecoder
        return NvjpegDecoder(transform, device=device)
    from .dali import DaliDecoder, dali_available
    if not dali_available():
        raise ImportError(DALI_MISSING)
    return DaliDecoder(transform, device=device, threads=threads, **options)
