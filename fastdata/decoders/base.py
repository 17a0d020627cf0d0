"""The decoder plug-in: how the native engine, nvJPEG and DALI take part in one pipeline.

A batch reaches the decoders planned (``PlannedBatch``, made by fastdata.decoders.routing):
its encoded bytes, and each sample's crop box and flip from the native header reader,
keyed by (seed, epoch, index). The pipeline asks the decoders in order which rows each
``accepts``; the native decoder comes last and accepts everything, so every row has one.
Then, per decoder, on the pipeline's producer thread::

    handle = decoder.start(batch, rows)    # queue the work (GPU decoders: on the pipeline's stream)
    done = decoder.finish(handle, host)    # in the order started
    decoder.discard(handle)                # instead of finish: a started batch nobody will collect

A decoder either writes its rows into ``host`` (``len(rows)`` rows of the batch's pinned
slot: the native decoder) or returns them as pixels (``DecodedRows.pixels``), and names the
rows it rejected; those go to the native decoder, so a batch is never lost. Decoders do not
normalize, copy to the device or replace failed samples: the pipeline does each once.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import torch

from ..errors import DecodeError
from ..io.encoded import Item
from ..io.engine import CropPlan

@dataclass(frozen=True)
class BatchOutput:
    """The batch the consumer receives, allocated before any decoder runs, so that a GPU
    resampler writes its rows into it directly (gpu_resize.resample_batch, place_rows).

    pixels: the output indexed [row, y, x, channel], at whatever strides (the NHWC view of an
    NCHW or channels_last float batch, or the uint8 NHWC batch itself). scale/bias: per channel,
    the kernels write ``x * scale + bias`` (float32, multiply then add: the native threads'
    normalize) for pixel value x in 0..255; None: x itself. ``tensor`` is what is handed out.
    """

    tensor: torch.Tensor
    pixels: torch.Tensor
    scale: Optional[Tuple[float, float, float]] = None
    bias: Optional[Tuple[float, float, float]] = None

    @staticmethod
    def allocate(n: int, out_hw: Tuple[int, int], dtype: Optional[torch.dtype], channels_last: bool,
                 scale_bias: Optional[Tuple[Sequence[float], Sequence[float]]],
                 device: torch.device) -> "BatchOutput":
        """``n`` rows of ``out_hw`` pixels: uint8 [n, H, W, 3] when ``dtype`` is None, else ``dtype``
        [n, 3, H, W] (channels_last memory when asked) normalized with ``scale_bias``."""
        h, w = out_hw
        if dtype is None:
            tensor = torch.empty((n, h, w, 3), dtype=torch.uint8, device=device)
            return BatchOutput(tensor, tensor)
        if scale_bias is None:
            raise ValueError("a float output needs its normalization (scale, bias)")
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        tensor = torch.empty((n, 3, h, w), dtype=dtype, device=device, memory_format=fmt)
        # float32 values, as the kernels (and the native threads) compute with them
        scale, bias = (tuple(float(np.float32(v)) for v in vals) for vals in scale_bias)
        return BatchOutput(tensor, tensor.permute(0, 2, 3, 1), scale, bias)  # type: ignore[arg-type]


@dataclass
class PlannedBatch:
    """One batch as the decoders see it.

    items: what the source returned (paths or encoded buffers); indices: int64 dataset
    indices (the RNG keys); names: per row, for errors (may be lazy: only failed rows are
    looked up). datas and plan are filled when some decoder other than the native one is
    configured: encoded bytes as writable uint8 arrays (empty when unreadable, or when hybrid
    did not read the row: routing.plan_batch's ``datas``), and the crop
    plan from the headers. unplanned: rows whose bytes or header could not be read; only the
    native decoder gets them, and reports them as it would without a plan. output: where a
    decoder with ``writes_output`` puts its rows (None: it returns them as pixels).
    """

    items: Sequence[Item]
    indices: np.ndarray
    epoch: int
    names: Sequence[Optional[str]]
    datas: Optional[List[np.ndarray]] = None
    plan: Optional[CropPlan] = None
    not_jpeg: frozenset = frozenset()
    unplanned: frozenset = frozenset()
    output: Optional[BatchOutput] = None

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class DecodedRows:
    """What ``Decoder.finish`` returns.

    pixels: for a decoder that does not write into ``host``: [k, H, W, 3] uint8, or float32
    holding values 0..255, for the rows it was given minus ``rejected``, in order (None when
    k is 0). failures: (row, DecodeError) for rows that could not be decoded: the native
    decoder's host rows hold zeros; another decoder's failed rows may hold anything in
    ``pixels`` or the output (the pipeline makes them black host rows, so that the skip policy
    can decode a replacement there). rejected: rows this decoder could not take after all
    (they go native).
    seconds: the decoder's own time for these rows where it measures one (the hybrid split's
    GPU rate), else None. written: the rows given minus the rejected ones are in the batch's
    ``output`` already, and ``pixels`` is None.
    """

    pixels: Optional[torch.Tensor] = None
    failures: List[Tuple[int, DecodeError]] = field(default_factory=list)
    rejected: List[int] = field(default_factory=list)
    seconds: Optional[float] = None
    written: bool = False


class Decoder(Protocol):
    """What a decoder offers the pipeline (see the module docstring)."""

    name: str
    depth: int  # batches that may be started before the first one is finished

    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        """Which rows of ``batch`` this decoder takes (bool [len(batch)], from the header facts
        in ``batch``)."""

    def start(self, batch: PlannedBatch, rows: List[int]) -> Any:
        """Queue the decode of ``rows`` (sorted); returns a handle for ``finish``/``discard``."""

    def finish(self, handle: Any, host: Optional[np.ndarray]) -> DecodedRows:
        """Complete a started decode. ``host``: uint8 [len(rows), H, W, 3] pinned memory for
        decoders that write on the host (the native decoder's may hold the output's float type
        when the native threads normalize: the CPU path with no other decoder)."""

    def discard(self, handle: Any) -> None:
        """Drop a started decode nobody will finish; never raises."""

    def close(self) -> None:
        """Release the decoder's resources. Idempotent."""


def check_plugged_decoder(decoder: Any) -> None:
    """Raise TypeError unless ``decoder`` (a ``backend=`` object) has ``accepts(batch)``: the
    protocol asked ``accepts(batch, row)`` per row before 2026-12-02, and such a decoder would
    otherwise fail on the producer thread with a bare TypeError."""
    try:
        params = inspect.signature(decoder.accepts).parameters.values()
    except (AttributeError, TypeError, ValueError) as e:
        raise TypeError(f"backend must be a backend name or a decoder with accepts(batch); got {decoder!r}") from e
    required = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) != 1:
        raise TypeError(f"{type(decoder).__name__}.accepts must take the planned batch alone and return a bool per "
                        f"row (Decoder.accepts(batch) -> np.ndarray); it takes {required}")


def stored_sizes(plan: CropPlan, rows: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """(heights, widths), int64, of ``rows``' images as their files store them: the plan's
    sizes are EXIF-oriented, and orientations 5-8 swap the two. GPU decoders return stored
    pixels (the resampler folds the orientation into its addressing)."""
    sel = np.asarray(rows, np.int64)
    sizes = np.asarray(plan.sizes, np.int64)[sel].reshape(-1, 2)
    turned = np.asarray(plan.orientations, np.int64)[sel] >= 5
    return np.where(turned, sizes[:, 1], sizes[:, 0]), np.where(turned, sizes[:, 0], sizes[:, 1])


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small per-batch host tensor (indices, tables, labels) on ``device``, queued on the
    current stream without blocking the host: a copy from pageable memory would wait for
    all work queued on the stream. The pinned staging block comes from torch's caching
    host allocator, which reuses it only after this copy has finished."""
    if device.type != "cuda":
        return host.to(device)
    pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
    try:
        # numpy copies on this thread; torch's copy of a table of a megabyte or so (the GPU
        # resampler's filters) is split over its intra-op thread pool, which a loader thread
        # should not wake for a memcpy (not measured apart: it changed with the blocking waits).
        np.copyto(pinned.numpy(), host.numpy())
    except TypeError:  # a dtype numpy lacks (bfloat16)
        pinned.copy_(host)
    return pinned.to(device, non_blocking=True)
