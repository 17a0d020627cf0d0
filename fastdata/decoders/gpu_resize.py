"""Batched crop + antialiased resize + flip on the GPU (or CPU), in torch only (the pipeline normalizes).

One call resamples a whole batch of decoded images of different sizes, with no Python
loop over images: the decoded images live in one flat uint8 buffer (per-image element
offsets), and every output pixel is a gather over its filter taps. The filter is Pillow's
antialiased bilinear (triangle, support widened by the downscale factor), the same filter
the native engine uses, so ``resample_batch`` matches ``Image.crop(box).resize(size,
BILINEAR)`` and the native engine up to rounding.

Separable, in Pillow's order: a horizontal pass over the source rows each image needs
(ragged: rows of all images stacked), rounded to uint8 values like Pillow, then a vertical
pass into [B, H, W, 3]. The Python loops run over filter taps (a handful) and over chunks
of the batch (to bound index memory), never over images.

EXIF orientation and the horizontal flip are folded into the gather indices: boxes are in
oriented coordinates, decoded pixels stay as stored (nvJPEG does not rotate), and an oriented
pixel (xo, yo) maps to a stored element through a per-image affine map.

Filter tables are computed in float64 numpy on the host (they are small: B x out x taps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .base import to_device

__all__ = ["AxisTables", "axis_tables", "filter_support", "filter_reach", "ImageLayout", "resample_batch",
           "orientation_maps"]

# Elements of index memory per gather (int64): bounds the working set of one chunk.
_CHUNK_ELEMENTS = 48 * 1024 * 1024


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
    ``first[b, k] + t`` (t < taps) with weights ``weights[b, k, t]`` (zero past the tap count;
    positions there are clamped in range). ``need_lo/need_hi`` [B]: source span read."""

    first: np.ndarray    # int64 [B, out]
    weights: np.ndarray  # float32 [B, out, taps]
    need_lo: np.ndarray  # int64 [B]
    need_hi: np.ndarray  # int64 [B]

    @property
    def taps(self) -> int:
        return int(self.weights.shape[2])


def axis_tables(start: np.ndarray, scale: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: int,
                reverse: Optional[np.ndarray] = None) -> AxisTables:
    """Pillow's ``precompute_coeffs`` (bilinear, antialiased) for a batch, vectorized.

    start/scale: float64 [B] — output pixel k samples source centre ``start + (k + 0.5) * scale``.
    lo/hi: int64 [B] — the window the filter may read (Pillow's crop: the box; a fused
    resize + center crop: the whole image). reverse: bool [B] mirrors the output (flip).
    Mirrors csrc/core/resize.cpp build_axis_filter line by line.
    """
    start = np.asarray(start, np.float64)
    scale = np.asarray(scale, np.float64)
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    if np.any(hi <= lo):
        raise ValueError("every crop window must hold at least one source pixel")
    if np.any(scale <= 0):
        raise ValueError("scale must be positive")
    b = start.shape[0]
    support = filter_support(scale)  # Pillow's filterscale; the triangle's support is 1 * filterscale
    max_taps = (np.ceil(support) * 2 + 1).astype(np.int64)
    origin = (start - lo)[:, None]
    window = (hi - lo)[:, None]
    k = np.arange(out, dtype=np.float64)[None, :]
    center = origin + (k + 0.5) * scale[:, None]
    sup = support[:, None]
    xmin = np.trunc(center - sup + 0.5).astype(np.int64)  # C's int cast truncates
    xmin = np.maximum(xmin, 0)
    xmax = np.minimum(np.trunc(center + sup + 0.5).astype(np.int64), window)
    n = np.minimum(xmax - xmin, max_taps[:, None])
    empty = n <= 0  # the window is empty here: take the nearest pixel
    xmin = np.where(empty, np.clip(np.trunc(center).astype(np.int64), 0, window - 1), xmin)
    n = np.where(empty, 1, n)
    taps = int(n.max()) if n.size else 1
    t = np.arange(taps, dtype=np.int64)[None, None, :]
    d = np.abs((t + xmin[..., None] - center[..., None] + 0.5) / sup[..., None])
    w = np.where((t < n[..., None]) & (d < 1.0), 1.0 - d, 0.0)
    ww = w.sum(axis=2, keepdims=True)
    degenerate = ww[..., 0] == 0
    if degenerate.any():
        w[degenerate] = 0.0
        w[degenerate, 0] = 1.0
        ww = np.where(ww == 0, 1.0, ww)
    w = w / ww
    first = lo[:, None] + xmin
    need_lo = first.min(axis=1) if out else lo.copy()
    need_hi = (first + n).max(axis=1) if out else lo + 1
    if reverse is not None and np.any(reverse):
        rev = np.asarray(reverse, bool)
        first[rev] = first[rev, ::-1]
        w[rev] = w[rev, ::-1]
    return AxisTables(first=first.reshape(b, out), weights=w.astype(np.float32), need_lo=need_lo, need_hi=need_hi)


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
    def packed(shapes: Sequence[Tuple[int, int]], chw: bool) -> "ImageLayout":
        """Images stored back to back (``torch.cat`` of flattened tensors); shapes are (H, W)."""
        hw = np.asarray(shapes, np.int64).reshape(-1, 2)
        h, w = hw[:, 0], hw[:, 1]
        sizes = h * w * 3
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        if chw:
            return ImageLayout(base, h, w, w.copy(), np.ones_like(w), h * w)
        return ImageLayout(base, h, w, w * 3, np.full_like(w, 3), np.ones_like(w))


def _round_u8(x: torch.Tensor) -> torch.Tensor:
    # Pillow rounds half up and clips to 0..255 after each pass (8-bit images).
    return torch.floor(x + 0.5).clamp_(0.0, 255.0)


def resample_batch(flat: torch.Tensor, layout: ImageLayout, boxes: np.ndarray, flips: np.ndarray,
                   orientations: np.ndarray, out_hw: Tuple[int, int], clip_to_box: bool) -> torch.Tensor:
    """Crop, resize (antialiased bilinear) and flip every image of a batch in one pass.

    flat: uint8 1-D tensor on any device holding all decoded images (see ``ImageLayout``).
    boxes: float64 [B, 4] (x0, y0, x1, y1) in EXIF-oriented pixel coordinates.
    flips: bool [B] horizontal flips. orientations: int [B] EXIF 1..8 of the stored pixels.
    clip_to_box: the filter reads only inside the box (RandomResizedCrop, like Pillow's
    crop + resize); otherwise the whole image (a fused resize + center crop).
    Returns float32 [B, H, W, 3] on ``flat.device`` with integer values in 0..255 (rounded as
    Pillow does), ready for the pipeline's normalize (fastdata.loader.cuda.GpuNormalizer).
    Runs on the current CUDA stream.
    """
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise TypeError(f"flat must be a 1-D uint8 tensor, got {flat.dtype} with {flat.dim()} dims")
    out_h, out_w = int(out_hw[0]), int(out_hw[1])
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    n = boxes.shape[0]
    device = flat.device
    if n == 0:
        return torch.empty((0, out_h, out_w, 3), dtype=torch.float32, device=device)
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
    # Element offset of oriented pixel (xo, yo), channel c: const + cx * xo + cy * yo + c * ch.
    cx = amap[:, 1] * layout.pix_stride + amap[:, 4] * layout.row_stride
    cy = amap[:, 2] * layout.pix_stride + amap[:, 5] * layout.row_stride
    const = layout.base + amap[:, 0] * layout.pix_stride + amap[:, 3] * layout.row_stride
    # Horizontal tap positions, clamped inside the oriented image (their weight is 0 past the count).
    xpos = np.minimum(fx.first[:, :, None] + np.arange(fx.taps)[None, None, :], (ow - 1)[:, None, None])
    xoff = xpos * cx[:, None, None]  # int64 [B, out_w, taps]
    rows = fy.need_hi - fy.need_lo
    out = torch.empty((n, out_h, out_w, 3), dtype=torch.float32, device=device)
    # Chunks of whole images whose stacked source rows fit the index budget.
    per_row = out_w * 3
    starts = [0]
    acc = 0
    for b in range(n):  # host-side bookkeeping over ints only; no kernels launched here
        acc += int(rows[b]) * per_row
        if acc > _CHUNK_ELEMENTS and b > starts[-1]:
            starts.append(b)
            acc = int(rows[b]) * per_row
    starts.append(n)
    for c0, c1 in zip(starts[:-1], starts[1:]):
        _resample_chunk(flat, slice(c0, c1), rows, fx, fy, xoff, cx, cy, const, layout.ch_stride,
                        out[c0:c1], out_w)
    return out


def _upload(device: torch.device, dtype: np.dtype, *arrays: np.ndarray) -> List[torch.Tensor]:
    """Several small host tables to the device in one copy; returns views shaped like the inputs."""
    flat = np.concatenate([np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays])
    dev = to_device(torch.from_numpy(flat), device)
    views, at = [], 0
    for a in arrays:
        views.append(dev[at:at + a.size].view(a.shape))
        at += a.size
    return views


def _resample_chunk(flat: torch.Tensor, sl: slice, rows: np.ndarray, fx: AxisTables, fy: AxisTables,
                    xoff: np.ndarray, cx: np.ndarray, cy: np.ndarray, const: np.ndarray, ch: np.ndarray,
                    out: torch.Tensor, out_w: int) -> None:
    device = flat.device
    nrows = rows[sl]
    b = nrows.shape[0]
    # Ragged stack of the oriented source rows each image needs.
    row_img = np.repeat(np.arange(b, dtype=np.int64), nrows)
    row_start = np.concatenate([[0], np.cumsum(nrows)[:-1]]).astype(np.int64)
    row_yo = np.arange(row_img.shape[0], dtype=np.int64) - row_start[row_img] + fy.need_lo[sl][row_img]
    rowbase = const[sl][row_img] + cy[sl][row_img] * row_yo
    chan = np.arange(3, dtype=np.int64)[None, :] * ch[sl][:, None]  # [b, 3]
    # Vertical pass: output row i of image j reads stacked rows row_start[j] + (first + t - need_lo).
    hi = (fy.need_hi[sl] - 1)[:, None, None]
    ypos = np.minimum(fy.first[sl][:, :, None] + np.arange(fy.taps)[None, None, :], hi)
    ridx = row_start[:, None, None] + ypos - fy.need_lo[sl][:, None, None]  # [b, out_h, taps]
    # int32 indices halve the index traffic (index_select takes them) when the buffer allows.
    itype = np.int32 if flat.numel() < 2 ** 31 - 1 and row_img.shape[0] < 2 ** 31 - 1 else np.int64
    row_img_t, rowbase_t, chan_t, xoff_t, ridx_t = _upload(device, itype, row_img, rowbase, chan, xoff[sl], ridx)
    wx_t, wy_t = _upload(device, np.float32, fx.weights[sl], fy.weights[sl])
    rb = rowbase_t[:, None, None] + chan_t.index_select(0, row_img_t)[:, None, :]  # [R, 1, 3]
    tmp = torch.zeros((row_img.shape[0], out_w, 3), dtype=torch.float32, device=device)
    for t in range(fx.taps):
        idx = rb + xoff_t[:, :, t].index_select(0, row_img_t)[:, :, None]  # [R, out_w, 3]
        pix = flat.index_select(0, idx.reshape(-1)).view(idx.shape).to(torch.float32)
        tmp.addcmul_(pix, wx_t[:, :, t].index_select(0, row_img_t)[:, :, None])
    tmp = _round_u8(tmp)
    out.zero_()
    flat_out = out.view(-1, out_w, 3)
    for t in range(fy.taps):
        src = tmp.index_select(0, ridx_t[:, :, t].reshape(-1))
        flat_out.addcmul_(src, wy_t[:, :, t].reshape(-1)[:, None, None])
    out.copy_(_round_u8(out))
