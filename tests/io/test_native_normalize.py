"""The engine's normalized outputs (``normalize=``): exactly the uint8 output times the
per-channel scale plus the bias, in float32 (csrc/core/normalize.cpp: AVX2 with streaming
stores for 32-byte aligned rows, SSE2 with streaming stores for 16-byte aligned ones,
unaligned stores otherwise, a scalar tail), and that float32 value rounded as torch rounds it
into float16 and bfloat16 (AVX2 + F16C for 16-byte aligned rows, else the portable rounding),
with or without the CPU-dispatched paths."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.io.engine import Engine, scale_bias_for
from fastdata.loader.pinned_ring import engine_array

import imagegen as ig

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.mark.parametrize("size", [(37, 29), (64, 48), (5, 4), (8, 9)])  # 3 * pixels: not, and a multiple of 12 or 24
@pytest.mark.parametrize("misalign", [0, 1, 2, 4])  # floats after a 64-byte boundary: 32-, 16-byte aligned or not
def test_float_output_is_exactly_the_scaled_uint8_output(size, misalign):
    h, w = size
    datas = [ig.encode_jpeg(ig.photo_like(90, 120, index=i)) for i in range(5)]
    rrc = fastdata.RandomResizedCrop((h, w))
    eng = Engine(2)
    u8 = np.empty((5, h, w, 3), np.uint8)
    eng.run(datas, rrc, u8, seed=3, epoch=1)
    raw = np.full(5 * h * w * 3 + 32, np.nan, np.float32)
    buf = raw[(-raw.ctypes.data % 64) // 4:]  # starts on a 64-byte boundary
    f32 = buf[misalign:misalign + 5 * h * w * 3].reshape(5, h, w, 3)
    eng.run(datas, rrc, f32, seed=3, epoch=1, normalize=(MEAN, STD))
    scale, bias = (np.asarray(v, np.float32) for v in scale_bias_for(MEAN, STD))
    want = u8.astype(np.float32) * scale + bias  # float32 multiply, then add: no fused multiply-add
    np.testing.assert_array_equal(f32, want)
    assert np.isnan(buf[:misalign]).all() and np.isnan(buf[misalign + f32.size:]).all()  # nothing outside
    eng.close()


HALVES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _half_out(n: int, h: int, w: int, dtype: torch.dtype, misalign: int):
    """A [n, h, w, 3] tensor of ``dtype`` starting ``misalign`` values after a 64-byte boundary,
    with guard values around it, and the numpy array the engine writes (bfloat16: its bits)."""
    size = n * h * w * 3
    raw = torch.full((size + 64,), 7.0, dtype=dtype)
    skip = (-raw.data_ptr() % 64) // 2
    out = raw[skip + misalign:skip + misalign + size].view(n, h, w, 3)
    return raw, out, engine_array(out)


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("size", [(37, 29), (64, 48), (5, 4), (8, 9)])
@pytest.mark.parametrize("misalign", [0, 3, 8])  # 16-byte aligned rows (streamed) or not (plain stores)
def test_half_outputs_are_the_float32_values_cast_as_torch_casts(dtype, size, misalign):
    h, w = size
    datas = [ig.encode_jpeg(ig.photo_like(90, 120, index=i)) for i in range(5)]
    rrc = fastdata.RandomResizedCrop((h, w))
    eng = Engine(2)
    f32 = np.empty((5, h, w, 3), np.float32)
    eng.run(datas, rrc, f32, seed=3, epoch=1, normalize=(MEAN, STD))
    raw, out, array = _half_out(5, h, w, HALVES[dtype], misalign)
    eng.run(datas, rrc, array, seed=3, epoch=1, normalize=(MEAN, STD))
    want = torch.from_numpy(f32).to(HALVES[dtype])
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))  # bits: -0.0 and 0.0 told apart
    guard = torch.ones(raw.numel(), dtype=torch.bool)
    start = (out.data_ptr() - raw.data_ptr()) // 2
    guard[start:start + out.numel()] = False
    assert (raw[guard] == 7).all()  # nothing written outside
    eng.close()


def test_half_outputs_round_every_normalized_value_of_any_scale_as_torch():
    # Most byte values (a ramp through JPEG: ~200 of 256 per channel) with scales and biases
    # that land on ties, subnormal halves, values past float16's range and exact zeros
    # (x * scale + bias == 0 for x = 128), per output type.
    eng = Engine(1)
    rrc = fastdata.CenterCrop(16)  # 256 pixels: a ramp over 0..255 in each channel before JPEG
    ramp = np.arange(256, dtype=np.uint8).reshape(16, 16)
    img = np.stack([ramp, ramp[::-1], ramp.T], axis=-1)
    data = ig.encode_jpeg(Image.fromarray(img), quality=100, subsampling="4:4:4")
    u8 = np.empty((1, 16, 16, 3), np.uint8)
    eng.run([data], rrc, u8)
    for scale, bias in [((1 / 255, 2 ** -14 / 7, 1.0 / 3), (0.0, -2 ** -20, -42.5)),
                        ((300.0, 257.0, 2 ** -24), (-128 * 300.0, -65519.0, 2 ** -25)),
                        ((1 + 2 ** -11, 1 + 2 ** -8, 1 + 2 ** -10), (0.5, 2 ** -9, 1024.0))]:
        mean = tuple(-b / s for s, b in zip(scale, bias))
        std = tuple(1 / (255 * s) for s in scale)
        f32 = np.empty((1, 16, 16, 3), np.float32)
        eng.run([data], rrc, f32, normalize=(mean, std))
        got_scale, got_bias = (np.asarray(v, np.float32) for v in scale_bias_for(mean, std))
        np.testing.assert_array_equal(f32, u8.astype(np.float32) * got_scale + got_bias)
        for dtype in HALVES.values():
            for misalign in (0, 1):
                _, out, array = _half_out(1, 16, 16, dtype, misalign)
                eng.run([data], rrc, array, normalize=(mean, std))
                want = torch.from_numpy(f32).to(dtype)
                assert torch.equal(out.view(torch.int16), want.view(torch.int16)), (dtype, misalign, scale)
    eng.close()


def test_portable_half_rounding_is_torch_rounding():
    # The rounding the portable path uses, value by value, against torch's casts: edge cases
    # (ties at every exponent, subnormal halves, the overflow boundary, infinities, NaN) and a
    # million random float32 bit patterns.
    from fastdata import _C

    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2 ** -24, 2 ** -25, 2 ** -25 * 1.0001, 2 ** -26,
             6.1e-5, 6.097555e-05, 3.0e-8, 1e-40, np.inf, -np.inf, 1e38, 3.4e38]
    ties = [(1 + (2 * k + 1) * 2 ** -11) * 2.0 ** e for e in range(-14, 16) for k in range(4)]
    bf_ties = [(1 + (2 * k + 1) * 2 ** -8) * 2.0 ** e for e in range(-126, 127, 7) for k in range(4)]
    values = np.concatenate([np.array(edges + ties + bf_ties, np.float32),
                             rng.integers(0, 2 ** 32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    values = np.concatenate([values, -values])
    t = torch.from_numpy(values)
    finite = torch.isfinite(t) | torch.isinf(t)
    for bf16, dtype in ((False, torch.float16), (True, torch.bfloat16)):
        got = torch.from_numpy(_C._half_bits(values, bf16).view(np.int16))
        want = t.to(dtype).view(torch.int16)
        assert torch.equal(got[finite], want[finite]), bf16
        assert torch.isnan(got[~finite].view(dtype)).all()  # NaN stays NaN (its payload bits may differ)


def test_half_outputs_are_the_same_on_the_portable_path():
    # FASTDATA_FORCE_SCALAR=1 (no AVX2/F16C) in a child: the same bits as this process's path.
    script = """
import hashlib, sys, numpy as np, torch, fastdata
from fastdata.io.engine import Engine
sys.path.insert(0, {tests!r})
import imagegen as ig
from fastdata.loader.pinned_ring import engine_array
datas = [ig.encode_jpeg(ig.photo_like(90, 120, index=i)) for i in range(5)]
eng = Engine(2)
for dtype in (torch.float16, torch.bfloat16):
    for hw in ((37, 29), (16, 10)):  # rows 16-byte aligned in turn (streamed) or all (the second)
        out = torch.empty((5, *hw, 3), dtype=dtype)
        eng.run(datas, fastdata.RandomResizedCrop(hw), engine_array(out), seed=3, epoch=1,
                normalize=({mean!r}, {std!r}))
        print(hashlib.sha256(engine_array(out).tobytes()).hexdigest(), float(out.float().sum()))
"""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # imagegen.py's folder
    code = script.format(tests=tests, mean=MEAN, std=STD)
    outs = []
    for switch in ("0", "1"):
        env = dict(os.environ, FASTDATA_FORCE_SCALAR=switch)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout)
    assert outs[0] == outs[1] and len(outs[0].split()) == 8
