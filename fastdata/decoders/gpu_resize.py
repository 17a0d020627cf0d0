"""Batched crop + antialiased resize + flip on the GPU: Triton kernels, one launch per pass.

One call resamples a whole batch of decoded images of different sizes, with no Python
loop over images: the decoded images live in one flat uint8 buffer (``ImageLayout``: per
image a base offset and strides, so HWC and CHW both work), and two kernels
(resample_kernels.py) do Pillow's separable resample for all of them at once: a horizontal
pass over the ragged stack of source rows each image needs, into a uint8 intermediate, then
a vertical pass that writes each image into its row of the batch's output (``BatchOutput``:
normalized, in the output's dtype and layout) or, without one, into float32 [B, H, W, 3]. The filter is Pillow's antialiased bilinear
(triangle, support widened by the downscale factor), in the native engine's fixed-point
arithmetic (csrc/core/resize.cpp) and Pillow's order (horizontal pass first). For the same
decoded pixels ``resample_batch`` gives the native engine's bytes where that engine also runs
the horizontal pass first (source rows <= output rows), and differs by at most one level
where it saves work by running the vertical pass first; it matches
``Image.crop(box).resize(size, BILINEAR)`` to rounding (Pillow's weights have more bits).

EXIF orientation and the horizontal flip are folded into addressing: boxes are in oriented
coordinates, decoded pixels stay as stored (nvJPEG does not rotate), and an oriented pixel
(xo, yo) maps to a stored element through a per-image affine map (``orientation_maps``).

The host computes only small tables, in float64 numpy like the native engine: per image a
row of scalars, per axis the first tap and fixed-point weights of each output (B x out x
taps), uploaded in one copy. The kernels compute every element address themselves.

Why Triton: it ships with CUDA builds of torch (no extra dependency such as CV-CUDA), keeps
exactly the native engine's filter (the GPU and CPU paths give the same pixels), and its
interpreter (``TRITON_INTERPRET=1``) runs the same kernels on CPU tensors, so the tests
need no GPU. Generic torch ops (a gather per filter tap over int64 index tensors, the
previous implementation) moved several times the bytes and launched a kernel per tap.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _C
from .base import BatchOutput, to_device

__all__ = ["AxisTables", "axis_tables", "filter_support", "filter_reach", "ImageLayout", "resample_batch",
           "place_rows", "orientation_maps"]

# Fractional bits of the fixed-point filter weights: csrc/core/resize.h kResizeBits16.
FIXED_BITS = 14
# Largest element offset the kernels compute in int32; past it, in int64 (tests lower it).
_INT32_OFFSETS = 2 ** 31 - 1
# Reuse filter tables across batches (_C.axis_filters' cache: bit-identical, it saves building
# them on the host every batch). False builds each batch's afresh: kept for the A/B in
# docs/results.md, "Filter tables kept across batches".
REUSE_FILTERS = True

# Every launch of these kernels holds this lock: the gpu decoder's resample thread and the
# producer thread (place_rows) launch at once. Triton's runtime is not made for launches from
# several threads (its first-call compile and caches; triton-lang/triton#5933), and its
# interpreter keeps the grid in global state: two threads at once failed there with
# "x >= grid_dim[0]" (a Loader on the CPU stand-in, 2026-12-05). On a GPU a launch holds it for
# the launch alone, and for the compile at a kernel variant's first call (once per process); under
# the interpreter for the whole kernel.
_LAUNCH_LOCK = threading.Lock()


def filter_support(scale: np.ndarray) -> np.ndarray:
    """Half-width, in source pixels, of the resize filter for ``scale`` source pixels per
    output pixel: Pillow's bilinear triangle (support 1), widened by the downscale factor to
    antialias. csrc/core/resize.cpp (build_axis_filter) uses the same filter."""
    return np.maximum(np.asarray(scale, np.float64), 1.0)


def filter_reach(scale: np.ndarray) -> np.ndarray:
    """Source pixels the filter may read beyond each edge of its box: the support rounded up,
    plus one pixel of margin (the DALI backend's decode window for a fused resize + crop)."""
    return np.ceil(filter_support(scale)) + 1


@dataclass
class AxisTables:
    """Filter taps for one axis of a batch: output k of image b reads source positions
    ``first[b, k] + t`` (t < taps) with weights ``weights[b, k, t]``, the native engine's
    fixed-point weights (FIXED_BITS fractional bits; zero past the output's tap count, where
    positions may lie outside the window). ``max_count`` [B]: the taps an image's widest
    output uses. ``need_lo/need_hi`` [B]: source span read."""

    first: np.ndarray      # int32 [B, out]
    weights: np.ndarray    # int16 [B, out, taps]
    max_count: np.ndarray  # int64 [B]
    need_lo: np.ndarray    # int64 [B]
    need_hi: np.ndarray    # int64 [B]

    @property
    def taps(self) -> int:
        return int(self.weights.shape[2])


def axis_tables(start: np.ndarray, scale: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: int,
                reverse: Optional[np.ndarray] = None) -> AxisTables:
    """Pillow's ``precompute_coeffs`` (bilinear, antialiased) for a batch: the native engine's
    own tables (csrc/core/resize.cpp build_axis_filter, through ``_C.axis_filters``), so the
    GPU and CPU paths use the same taps and rounded weights.

    start/scale: float64 [B] — output pixel k samples source centre ``start + (k + 0.5) * scale``.
    lo/hi: int64 [B] — the window the filter may read (Pillow's crop: the box; a fused
    resize + center crop: the whole image). reverse: bool [B] mirrors the output (flip).
    """
    start = np.asarray(start, np.float64)
    if reverse is None:
        reverse = np.zeros(start.shape[0], bool)
    first, weights, max_count, need_lo, need_hi = _C.axis_filters(start, scale, lo, hi, int(out), reverse,
                                                                  REUSE_FILTERS)
    return AxisTables(first=first, weights=weights, max_count=max_count, need_lo=need_lo, need_hi=need_hi)


def orientation_maps(orientation: np.ndarray, stored_h: np.ndarray, stored_w: np.ndarray) -> np.ndarray:
    """Per image, stored (xs, ys) as an affine function of oriented (xo, yo), for EXIF 1..8.

    Returns int64 [B, 6] = (x0, x_from_xo, x_from_yo, y0, y_from_xo, y_from_yo):
    ``xs = x0 + x_from_xo * xo + x_from_yo * yo`` and likewise ys. Orientation 6 means the
    stored image is shown rotated 90 degrees clockwise (Pillow's ``exif_transpose``).
    """
    o = np.asarray(orientation, np.int64)
    if np.any((o < 1) | (o > 8)):
        raise ValueError(f"EXIF orientation must be in 1..8, got {sorted(set(o.tolist()))}")
    w1 = np.asarray(stored_w, np.int64) - 1
    h1 = np.asarray(stored_h, np.int64) - 1
    zero = np.zeros_like(o)
    one = np.ones_like(o)
    table = {
        1: (zero, one, zero, zero, zero, one),
        2: (w1, -one, zero, zero, zero, one),
        3: (w1, -one, zero, h1, zero, -one),
        4: (zero, one, zero, h1, zero, -one),
        5: (zero, zero, one, zero, one, zero),
        6: (zero, zero, one, h1, -one, zero),
        7: (w1, zero, -one, h1, -one, zero),
        8: (w1, zero, -one, zero, one, zero),
    }
    result = np.zeros((o.shape[0], 6), np.int64)
    for value, cols in table.items():  # eight cases, not a loop over images
        mask = o == value
        if mask.any():
            result[mask] = np.stack([c[mask] for c in cols], axis=1)
    return result


@dataclass
class ImageLayout:
    """Where each decoded image lives in the flat uint8 buffer (all int64 [B]).

    Element (x, y, c) of stored image b is ``base + y * row_stride + x * pix_stride + c * ch_stride``:
    HWC images have (W*3, 3, 1), CHW images (W, 1, H*W). ``height``/``width`` are as stored.
    """

    base: np.ndarray
    height: np.ndarray
    width: np.ndarray
    row_stride: np.ndarray
    pix_stride: np.ndarray
    ch_stride: np.ndarray

    @staticmethod
    def packed(shapes: Sequence[Tuple[int, int]] | np.ndarray, chw: bool, align: int = 1) -> "ImageLayout":
        """Images stored back to back (``torch.cat`` of flattened tensors), each starting at a
        multiple of ``align`` bytes; shapes are (H, W)."""
        hw = np.asarray(shapes, np.int64).reshape(-1, 2)
        h, w = hw[:, 0], hw[:, 1]
        slots = -(-(h * w * 3) // align) * align
        base = np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64)
        if chw:
            return ImageLayout(base, h, w, w.copy(), np.ones_like(w), h * w)
        return ImageLayout(base, h, w, w * 3, np.full_like(w, 3), np.ones_like(w))

    def arrays(self) -> Tuple[np.ndarray, ...]:
        """(base, height, width, row_stride, pix_stride, ch_stride) as int64 arrays."""
        return tuple(np.asarray(getattr(self, f.name), np.int64) for f in fields(self))

    def nbytes(self) -> int:
        """Bytes a buffer needs to hold every image: one past the farthest element."""
        base, h, w, row, pix, ch = self.arrays()
        if base.size == 0:
            return 0
        return int((base + (h - 1) * row + (w - 1) * pix + 2 * ch).max()) + 1

    def select(self, keep: np.ndarray) -> "ImageLayout":
        """The layout of the images ``keep`` picks (a boolean mask or indices), in the same buffer."""
        return ImageLayout(*(a[keep] for a in self.arrays()))


def resample_batch(flat: torch.Tensor, layout: ImageLayout, boxes: np.ndarray, flips: np.ndarray,
                   orientations: np.ndarray, out_hw: Tuple[int, int], clip_to_box: bool,
                   into: Optional[BatchOutput] = None, rows: Optional[np.ndarray] = None) -> torch.Tensor:
    """Crop, resize (antialiased bilinear) and flip every image of a batch: two kernel launches.

    flat: uint8 1-D CUDA tensor holding all decoded images (see ``ImageLayout``); a CPU
    tensor only under Triton's interpreter (``TRITON_INTERPRET=1``, the tests without a GPU).
    boxes: float64 [B, 4] (x0, y0, x1, y1) in EXIF-oriented pixel coordinates.
    flips: bool [B] horizontal flips. orientations: int [B] EXIF 1..8 of the stored pixels.
    clip_to_box: the filter reads only inside the box (RandomResizedCrop, like Pillow's
    crop + resize); otherwise the whole image (a fused resize + center crop).
    into/rows: image j is written into row ``rows[j]`` of ``into`` (the batch's output, on
    ``flat.device``; normalized and cast as ``into`` says) and ``into.tensor`` is returned.
    Without them: float32 [B, H, W, 3] on ``flat.device`` with integer values in 0..255 (the
    native engine's filter and rounding, see the module docstring). Queued on the current CUDA
    stream, without a host sync.
    """
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise TypeError(f"flat must be a 1-D uint8 tensor, got {flat.dtype} with {flat.dim()} dims")
    device = flat.device
    kernels = _kernels_on(device, "resample_batch")
    out_h, out_w = int(out_hw[0]), int(out_hw[1])
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    n = boxes.shape[0]
    if out_h < 0 or out_w < 0:
        raise ValueError(f"output size must be non-negative, got {out_hw}")
    if into is None:
        into = BatchOutput(*(2 * [torch.empty((n, out_h, out_w, 3), dtype=torch.float32, device=device)]))
        rows = np.arange(n, dtype=np.int64)
    out_rows = _check_output(into, rows, n, (out_h, out_w), device)
    if n == 0 or out_h == 0 or out_w == 0:
        return into.tensor
    _check_layout(layout, n, flat.numel())
    o = np.asarray(orientations, np.int64)
    transposed = o >= 5
    oh = np.where(transposed, layout.width, layout.height)  # oriented size
    ow = np.where(transposed, layout.height, layout.width)
    if np.any(boxes[:, 2] <= boxes[:, 0]) or np.any(boxes[:, 3] <= boxes[:, 1]):
        raise ValueError("crop boxes must have positive width and height")
    if clip_to_box:
        xlo, xhi = np.maximum(0, np.floor(boxes[:, 0])), np.minimum(ow, np.ceil(boxes[:, 2]))
        ylo, yhi = np.maximum(0, np.floor(boxes[:, 1])), np.minimum(oh, np.ceil(boxes[:, 3]))
    else:
        xlo, xhi, ylo, yhi = np.zeros(n), ow, np.zeros(n), oh
    fx = axis_tables(boxes[:, 0], (boxes[:, 2] - boxes[:, 0]) / out_w, xlo.astype(np.int64), xhi.astype(np.int64),
                     out_w, reverse=np.asarray(flips, bool))
    fy = axis_tables(boxes[:, 1], (boxes[:, 3] - boxes[:, 1]) / out_h, ylo.astype(np.int64), yhi.astype(np.int64),
                     out_h)
    amap = orientation_maps(o, layout.height, layout.width)
    rows = fy.need_hi - fy.need_lo  # source rows each image's vertical filter reads
    row0 = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    stacked_rows = int(rows.sum())
    tiles = _tiles(out_h, out_w, kernels.INTERPRETED)
    blocks = -(-rows // tiles.rows)  # row blocks of the horizontal pass per image
    block_start = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int32)

    meta = np.zeros((n, kernels.META_FIELDS.value), np.int64)
    # Element offset of oriented pixel (xo, yo), channel c: ADDR0 + X_STEP * xo + Y_STEP * yo + c * CH_STEP.
    meta[:, kernels.ADDR0.value] = layout.base + amap[:, 0] * layout.pix_stride + amap[:, 3] * layout.row_stride
    meta[:, kernels.X_STEP.value] = amap[:, 1] * layout.pix_stride + amap[:, 4] * layout.row_stride
    meta[:, kernels.Y_STEP.value] = amap[:, 2] * layout.pix_stride + amap[:, 5] * layout.row_stride
    meta[:, kernels.CH_STEP.value] = layout.ch_stride
    meta[:, kernels.Y_LO.value] = fy.need_lo
    meta[:, kernels.ROWS.value] = rows
    meta[:, kernels.ROW0.value] = row0
    meta[:, kernels.TAPS_X.value] = fx.max_count
    meta[:, kernels.TAPS_Y.value] = fy.max_count
    meta[:, kernels.OUT_IMAGE.value] = out_rows
    # int32 offsets where every buffer allows (half the integer work); the kernels follow meta's type.
    wide = max(flat.numel(), stacked_rows * out_w * 3, _output_span(into)) > _INT32_OFFSETS
    if max(fx.weights.size, fy.weights.size) > 2 ** 31 - 1:
        raise ValueError("batch too large for one resample: split it")
    meta_t, block_start_t, first_x, first_y, weights_x, weights_y = _upload(
        device, meta if wide else meta.astype(np.int32), block_start, fx.first,
        fy.first, fx.weights, fy.weights)

    stack = torch.empty((stacked_rows, out_w * 3), dtype=torch.uint8, device=device)
    steps = int(np.ceil(np.log2(n))) if n > 1 else 0  # binary search over block_start
    out_args, out_consts = _output_args(into)
    # Triton launches on the current device's current stream. Without fp fusion the normalize
    # multiplies, then adds (no FMA), as the native threads do; naming it also keeps Triton >= 3.9
    # from warning about its default.
    with _launching(device):
        kernels.horizontal_pass[(int(block_start[-1]), -(-out_w // tiles.width))](
            flat, stack, meta_t, block_start_t, first_x, weights_x, n, steps, fx.taps, out_w,
            BITS=FIXED_BITS, BLOCK_R=tiles.rows, BLOCK_W=tiles.width, num_warps=4, enable_fp_fusion=False)
        kernels.vertical_pass[(n * -(-out_h // tiles.out_rows), -(-(out_w * 3) // tiles.values))](
            stack, into.pixels, meta_t, first_y, weights_y, fy.taps, out_h, out_w * 3, *out_args,
            BITS=FIXED_BITS, BLOCK_H=tiles.out_rows, BLOCK_C=tiles.values, **out_consts, num_warps=4,
            enable_fp_fusion=False)
    return into.tensor


def place_rows(pixels: torch.Tensor, into: BatchOutput, rows: Sequence[int]) -> torch.Tensor:
    """Write ``pixels`` (uint8 [k, H, W, 3], decoded elsewhere: the host's rows, uploaded) into
    rows ``rows`` of the batch's output, normalized and cast as the resampler writes its own
    (one kernel launch); returns ``into.tensor``. Queued on the current CUDA stream."""
    if pixels.dtype != torch.uint8 or pixels.dim() != 4 or pixels.shape[3] != 3:
        raise TypeError(f"pixels must be uint8 [k, H, W, 3], got {pixels.dtype} {tuple(pixels.shape)}")
    k, out_h, out_w = int(pixels.shape[0]), int(pixels.shape[1]), int(pixels.shape[2])
    device = pixels.device
    kernels = _kernels_on(device, "place_rows")
    rows = _check_output(into, rows, k, (out_h, out_w), device)
    if k == 0 or out_h == 0 or out_w == 0:
        return into.tensor
    pixels = pixels.contiguous()
    # The kernel's offsets follow ``images``' type: int64 where a buffer passes 2**31 elements.
    wide = max(pixels.numel(), _output_span(into)) > _INT32_OFFSETS
    (images,) = _upload(device, rows if wide else rows.astype(np.int32))
    tiles = _tiles(out_h, out_w, kernels.INTERPRETED)
    out_args, out_consts = _output_args(into)
    with _launching(device):
        kernels.place_rows[(k * -(-out_h // tiles.out_rows), -(-(out_w * 3) // tiles.values))](
            pixels, into.pixels, images, out_h, out_w * 3, *out_args, BLOCK_H=tiles.out_rows, BLOCK_C=tiles.values,
            **out_consts, num_warps=4, enable_fp_fusion=False)
    return into.tensor


def _check_output(into: BatchOutput, rows: Optional[Sequence[int]], n: int, out_hw: Tuple[int, int],
                  device: torch.device) -> np.ndarray:
    """``rows`` as int64 [n] after checking them and ``into`` against the images to write."""
    pixels = into.pixels
    if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (out_hw[0], out_hw[1], 3):
        raise ValueError(f"the output must be [N, {out_hw[0]}, {out_hw[1]}, 3] as pixels, got {tuple(pixels.shape)}")
    if pixels.dtype not in (torch.uint8, torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"the output must be uint8, float16, bfloat16 or float32, got {pixels.dtype}")
    if pixels.device != device and not (pixels.device.type == device.type == "cuda" and device.index is None):
        raise ValueError(f"the output is on {pixels.device}, the images on {device}")
    if (into.scale is None) != (into.bias is None):
        raise ValueError("scale and bias go together")
    if rows is None:
        raise ValueError("an output needs the rows to write each image into")
    rows = np.asarray(rows, np.int64).reshape(-1)
    if rows.shape != (n,):
        raise ValueError(f"{n} images but {rows.shape[0]} output rows")
    if n and (rows.min() < 0 or rows.max() >= pixels.shape[0]):
        raise ValueError(f"output rows must be in 0..{pixels.shape[0] - 1}")
    return rows


def _output_span(into: BatchOutput) -> int:
    """One past the farthest element offset the kernels compute in ``into``."""
    p = into.pixels
    return 1 + sum((size - 1) * stride for size, stride in zip(p.shape, p.stride())) if p.numel() else 0


def _output_args(into: BatchOutput) -> Tuple[Tuple[Any, ...], Dict[str, bool]]:
    """What vertical_pass and place_rows take about the output: its strides (o_image, o_y, o_x,
    o_ch) and normalization (s0, s1, s2, b0, b1, b2; unused without it), then the constexprs
    NORMALIZE and INTERLEAVED (a row's values contiguous, x-major then channel: NHWC rows of a
    channels_last or uint8 output, whose stores the compiler can vectorize)."""
    strides = tuple(into.pixels.stride())
    if into.scale is None:
        normalization: Tuple[float, ...] = (1.0, 1.0, 1.0, 0.0, 0.0, 0.0)
    else:
        normalization = (*into.scale, *into.bias)
    return (*strides, *normalization), {"NORMALIZE": into.scale is not None, "INTERLEAVED": strides[2:] == (3, 1)}


def _kernels_on(device: torch.device, caller: str) -> ModuleType:
    """The kernels module, for tensors on ``device``: CUDA, or the CPU under Triton's interpreter."""
    kernels = _kernels()
    if device.type != "cuda" and not (device.type == "cpu" and kernels.INTERPRETED):
        raise ValueError(f"{caller} runs Triton kernels on CUDA tensors; got a tensor on {device} (CPU tensors "
                         "run only under Triton's interpreter: TRITON_INTERPRET=1 set before fastdata is imported)")
    return kernels


@contextlib.contextmanager
def _launching(device: torch.device) -> Iterator[None]:
    """Around a launch: ``device`` current (Triton launches on the current device's current
    stream) and _LAUNCH_LOCK held."""
    with (torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()), _LAUNCH_LOCK:
        yield


def _check_layout(layout: ImageLayout, n: int, numel: int) -> None:
    # The kernels trust these addresses: a layout past the buffer would read out of bounds.
    arrays = layout.arrays()
    if any(a.shape != (n,) for a in arrays):
        raise ValueError(f"layout must describe the {n} images of the batch, got shapes {[a.shape for a in arrays]}")
    base, h, w, row, pix, ch = arrays
    if np.any(h <= 0) or np.any(w <= 0) or np.any(row < 0) or np.any(pix < 0) or np.any(ch < 0):
        raise ValueError("layout sizes must be positive and strides non-negative")
    if np.any(base < 0):
        raise ValueError("layout offsets must be non-negative")
    if layout.nbytes() > numel:
        raise ValueError(f"layout reaches element {layout.nbytes() - 1} of a buffer of {numel}")


@dataclass(frozen=True)
class Tiles:
    """Block sizes of the two kernels. Horizontal: ``rows`` stacked rows x ``width`` output
    pixels (3 channels each). Vertical: ``out_rows`` output rows x ``values`` of a row's
    out_w * 3 interleaved values. Any sizes give the same output (the tests check)."""

    rows: int
    width: int
    out_rows: int
    values: int


def _tiles(out_h: int, out_w: int, interpreted: bool) -> Tiles:
    # Sizes are powers of two (tl.arange). On a GPU about 1024 outputs (x3 in the horizontal)
    # per program of 4 warps; 224 wide: 2 x 128 pixels, 3 x 256 values (87.5% busy). Under the
    # interpreter every program costs Python overhead and numpy likes big blocks: tall tiles.
    if interpreted:
        return Tiles(rows=128, width=min(512, _next_pow2(out_w)), out_rows=min(128, _next_pow2(out_h)),
                     values=min(2048, _next_pow2(out_w * 3)))
    width = min(128, _next_pow2(out_w))
    values = min(256, _next_pow2(out_w * 3))
    return Tiles(rows=max(1, min(16, 1024 // width)), width=width,
                 out_rows=max(1, min(16, 1024 // values, _next_pow2(out_h))), values=values)


def _next_pow2(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def _kernels() -> ModuleType:
    """resample_kernels, imported on first use: Triton comes with CUDA builds of torch, and
    importing this module (DALI uses ``filter_reach``) must not need it."""
    try:
        from . import resample_kernels
    except ImportError as e:
        raise ImportError("the GPU resampler needs Triton (CUDA builds of torch include it; else pip install triton)") from e
    return resample_kernels


def _upload(device: torch.device, *arrays: np.ndarray) -> List[torch.Tensor]:
    """Several small host tables to the device in one copy, each keeping its dtype; returns
    device views shaped like the inputs."""
    chunks, spans, at = [], [], 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        pad = -at % 8  # every view starts aligned for its dtype
        chunks.append(np.zeros(pad, np.uint8))
        at += pad
        chunks.append(a.reshape(-1).view(np.uint8))
        spans.append((at, a))
        at += a.nbytes
    dev = to_device(torch.from_numpy(np.concatenate(chunks)), device)
    return [dev[s:s + a.nbytes].view(torch.from_numpy(a[:0]).dtype).view(a.shape) for s, a in spans]
