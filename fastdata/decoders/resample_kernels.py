"""The Triton kernels behind ``gpu_resize``: Pillow's separable resample of a whole ragged
batch, one launch per pass (``resample_batch``), rows decoded elsewhere placed into the output
(``place_rows``).

Arithmetic is the native engine's (csrc/core/resize.cpp), integer for integer: weights in
fixed point with ``BITS`` fractional bits (gpu_resize.FIXED_BITS), int32 sums started at one
half, shifted and clipped to 0..255 after each pass, horizontal pass first (Pillow's order).
So the output does not depend on the GPU, the block sizes or the rest of the batch.

Addresses are computed here from a few per-image scalars (a row of ``meta``, fields below)
and the per-axis ``first``/``weights`` tables; no per-pixel index tensors exist. The
horizontal pass writes the ragged stack of source rows every image needs (``ROWS`` rows of
image b from stacked row ``ROW0``) as uint8 rows of ``out_w * 3`` interleaved RGB values;
the vertical pass reads that stack and writes each output value straight into its place in the
caller's output (``_store_values``): image b of the batch goes to image ``OUT_IMAGE`` of the
output, at any strides (an NCHW or channels_last batch seen as [N, H, W, 3]), as the 0..255
value itself or normalized (``x * scale + bias`` per channel in float32, multiply then add, as
the native threads normalize), cast to the output's dtype (uint8, float16, bfloat16, float32).
So a GPU decoder's rows need no float intermediate, no placing and no separate normalize pass.
``place_rows`` writes rows decoded elsewhere (the host's, uploaded) into the same output the
same way.

Under ``TRITON_INTERPRET=1`` (set before this module is imported) the kernels run on CPU
tensors with numpy: that is how the tests run without a GPU.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Fields of one image's row of ``meta`` (int32, or int64 when an offset may pass 2**31).
ADDR0: tl.constexpr = tl.constexpr(0)     # element offset of oriented pixel (0, 0), channel 0
X_STEP: tl.constexpr = tl.constexpr(1)    # elements per oriented x step (EXIF folded in)
Y_STEP: tl.constexpr = tl.constexpr(2)    # elements per oriented y step
CH_STEP: tl.constexpr = tl.constexpr(3)   # elements between channels (1 for HWC, H*W for CHW)
Y_LO: tl.constexpr = tl.constexpr(4)      # first oriented source row the vertical filter reads
ROWS: tl.constexpr = tl.constexpr(5)      # source rows it reads (need_hi - need_lo)
ROW0: tl.constexpr = tl.constexpr(6)      # the image's first row in the intermediate stack
TAPS_X: tl.constexpr = tl.constexpr(7)    # horizontal taps this image uses (its widest output)
TAPS_Y: tl.constexpr = tl.constexpr(8)    # vertical taps this image uses
OUT_IMAGE: tl.constexpr = tl.constexpr(9)  # the output image (batch row) this image is written to
META_FIELDS: tl.constexpr = tl.constexpr(10)


@triton.jit
def _clip8(acc, BITS: tl.constexpr):
    # Pillow's clip8: drop the fraction (the sum started at one half, so this rounds) and clip.
    return tl.minimum(tl.maximum(acc >> BITS, 0), 255)


@triton.jit
def _store_values(out, image, y, v, value, ok, o_image, o_y, o_x, o_ch, s0, s1, s2, b0, b1, b2,
                  NORMALIZE: tl.constexpr, INTERLEAVED: tl.constexpr):
    # value: int32 0..255 at output rows ``y`` [BLOCK_H] x interleaved values ``v`` [BLOCK_C]
    # (v = 3 * x + channel) of output image ``image``; out[image, y, x, ch] is at
    # image * o_image + y * o_y + x * o_x + ch * o_ch. INTERLEAVED (o_x == 3, o_ch == 1: uint8
    # NHWC, channels_last) says so to the compiler, whose stores are then contiguous (vectorized).
    x = v // 3
    ch = v - 3 * x
    if INTERLEAVED:
        dst = out + image * o_image + (y * o_y)[:, None] + v[None, :]
    else:
        dst = out + image * o_image + (y * o_y)[:, None] + (x * o_x + ch * o_ch)[None, :]
    if NORMALIZE:
        scale = tl.where(ch == 0, s0, tl.where(ch == 1, s1, s2))
        bias = tl.where(ch == 0, b0, tl.where(ch == 1, b1, b2))
        # Multiply, then add (no fused multiply-add: the kernels are launched without fp fusion):
        # the native threads' normalize_row, bit for bit.
        result = value.to(tl.float32) * scale[None, :] + bias[None, :]
    else:
        result = value
    if out.dtype.element_ty == tl.bfloat16:
        result = _to_bfloat16(result.to(tl.float32))
    else:
        result = result.to(out.dtype.element_ty)
    tl.store(dst, result, mask=ok)


@triton.jit
def _to_bfloat16(x):
    # float32 -> bfloat16 rounded to nearest, ties to even (torch's rounding, and the GPU's
    # cvt.rn), in integer steps: Triton's interpreter truncates instead (Triton 3.8), and the
    # tests run there. The values here are finite.
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _image_of_block(block_start, pid, num_images, search_steps):
    # The image whose run of row blocks holds block ``pid`` (``block_start``: B + 1 prefix sums),
    # by binary search, so that no program idles on a ragged batch.
    lo = pid * 0
    hi = lo + num_images
    for _ in range(search_steps):  # invariant: block_start[lo] <= pid < block_start[hi]
        mid = (lo + hi) // 2
        right = tl.load(block_start + mid) <= pid
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.jit
def horizontal_pass(src, stack, meta, block_start, first_x, weights_x, num_images, search_steps, taps_x, out_w,
                    BITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """Program (p, q): BLOCK_R stacked rows of one image x BLOCK_W output columns, 3 channels.

    Images own consecutive runs of row blocks (``block_start``, B + 1 prefix sums); the
    image of block p is found by binary search, so no program idles on a ragged batch.
    """
    pid = tl.program_id(0)
    b = _image_of_block(block_start, pid, num_images, search_steps)
    m = meta + b * META_FIELDS
    addr0 = tl.load(m + ADDR0)
    x_step = tl.load(m + X_STEP)
    y_step = tl.load(m + Y_STEP)
    ch_step = tl.load(m + CH_STEP)
    y_lo = tl.load(m + Y_LO)
    rows = tl.load(m + ROWS)
    row0 = tl.load(m + ROW0)
    taps = tl.load(m + TAPS_X)

    r = (pid - tl.load(block_start + b)) * BLOCK_R + tl.arange(0, BLOCK_R)  # the image's rows
    k = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)  # output columns
    r_ok = r < rows
    k_ok = k < out_w
    first = tl.load(first_x + b * out_w + k, mask=k_ok, other=0)
    # Element offset of tap 0 for each (row, column); tap t adds t * x_step.
    at = (addr0 + (y_lo + r) * y_step)[:, None] + (first * x_step)[None, :]
    w_row = weights_x + (b * out_w + k) * taps_x
    half = 1 << (BITS - 1)
    acc_r = tl.full([BLOCK_R, BLOCK_W], half, tl.int32)
    acc_g = tl.full([BLOCK_R, BLOCK_W], half, tl.int32)
    acc_b = tl.full([BLOCK_R, BLOCK_W], half, tl.int32)
    for t in range(taps):
        w = tl.load(w_row + t, mask=k_ok, other=0).to(tl.int32)
        # Taps past a column's own count have weight 0 and may lie outside the image: skip them.
        ok = r_ok[:, None] & (k_ok & (w != 0))[None, :]
        p = src + at + t * x_step
        acc_r += tl.load(p, mask=ok, other=0).to(tl.int32) * w[None, :]
        acc_g += tl.load(p + ch_step, mask=ok, other=0).to(tl.int32) * w[None, :]
        acc_b += tl.load(p + 2 * ch_step, mask=ok, other=0).to(tl.int32) * w[None, :]
    out = stack + ((row0 + r) * (out_w * 3))[:, None] + (k * 3)[None, :]
    ok = r_ok[:, None] & k_ok[None, :]
    tl.store(out, _clip8(acc_r, BITS).to(tl.uint8), mask=ok)
    tl.store(out + 1, _clip8(acc_g, BITS).to(tl.uint8), mask=ok)
    tl.store(out + 2, _clip8(acc_b, BITS).to(tl.uint8), mask=ok)


@triton.jit
def vertical_pass(stack, out, meta, first_y, weights_y, taps_y, out_h, row_len,
                  o_image, o_y, o_x, o_ch, s0, s1, s2, b0, b1, b2,
                  BITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, NORMALIZE: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    """Program (p, q): BLOCK_H output rows of image p // cdiv(out_h, BLOCK_H) x BLOCK_C of the
    ``row_len = out_w * 3`` interleaved values of a row (contiguous in the stack), written into
    ``out`` through ``_store_values`` (strides ``o_*``, normalized with ``s*``/``b*`` when
    NORMALIZE; INTERLEAVED when o_x == 3 and o_ch == 1)."""
    blocks_h = tl.cdiv(out_h, BLOCK_H)
    b = tl.program_id(0) // blocks_h
    m = meta + b * META_FIELDS
    y_lo = tl.load(m + Y_LO)
    row0 = tl.load(m + ROW0)
    taps = tl.load(m + TAPS_Y)
    image = tl.load(m + OUT_IMAGE)

    i = (tl.program_id(0) % blocks_h) * BLOCK_H + tl.arange(0, BLOCK_H)  # output rows
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    i_ok = i < out_h
    c_ok = c < row_len
    first = tl.load(first_y + b * out_h + i, mask=i_ok, other=0)
    src_row = row0 + first - y_lo  # the stacked row of tap 0
    w_col = weights_y + (b * out_h + i) * taps_y
    acc = tl.full([BLOCK_H, BLOCK_C], 1 << (BITS - 1), tl.int32)
    for t in range(taps):
        w = tl.load(w_col + t, mask=i_ok, other=0).to(tl.int32)
        ok = (i_ok & (w != 0))[:, None] & c_ok[None, :]
        v = tl.load(stack + ((src_row + t) * row_len)[:, None] + c[None, :], mask=ok, other=0)
        acc += v.to(tl.int32) * w[:, None]
    _store_values(out, image, i, c, _clip8(acc, BITS), i_ok[:, None] & c_ok[None, :], o_image, o_y, o_x, o_ch,
                  s0, s1, s2, b0, b1, b2, NORMALIZE, INTERLEAVED)


@triton.jit
def place_rows(src, out, images, out_h, row_len, o_image, o_y, o_x, o_ch, s0, s1, s2, b0, b1, b2,
               BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, NORMALIZE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rows decoded elsewhere into the output: ``src`` is uint8 [k, out_h, out_w, 3] (contiguous),
    row j goes to output image ``images[j]`` through ``_store_values``. Program (p, q): BLOCK_H
    rows of image p // cdiv(out_h, BLOCK_H) x BLOCK_C interleaved values."""
    blocks_h = tl.cdiv(out_h, BLOCK_H)
    j = (tl.program_id(0) // blocks_h).to(images.dtype.element_ty)  # int64 offsets when ``images`` is
    image = tl.load(images + j)
    i = (tl.program_id(0) % blocks_h) * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (i < out_h)[:, None] & (c < row_len)[None, :]
    value = tl.load(src + (j * out_h + i)[:, None] * row_len + c[None, :], mask=ok, other=0).to(tl.int32)
    _store_values(out, image, i, c, value, ok, o_image, o_y, o_x, o_ch, s0, s1, s2, b0, b1, b2, NORMALIZE,
                  INTERLEAVED)


# True when TRITON_INTERPRET=1 was set before this module was imported: the kernels then run
# on CPU tensors (slowly, with numpy) and not on CUDA ones.
INTERPRETED = isinstance(horizontal_pass, InterpretedFunction)
