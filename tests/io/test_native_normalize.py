"""The engine's float32 output (``normalize=``): exactly the uint8 output times the per-channel
scale plus the bias, in float32 (csrc/core/engine.cpp normalize_row: AVX2 with streaming
stores for 32-byte aligned rows, SSE2 with streaming stores for 16-byte aligned ones,
unaligned stores otherwise, a scalar tail), with or without the CPU-dispatched paths."""
from __future__ import annotations

import numpy as np
import pytest

import fastdata
from fastdata.io.engine import Engine, scale_bias_for

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
