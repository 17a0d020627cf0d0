"""The resampler writes each image straight into its row of the batch's output (``BatchOutput``):
normalized, in the output's dtype and layout, at any row; ``place_rows`` writes rows decoded
elsewhere into the same output the same way.

Oracle: the resampler's own float32 output (itself checked against Pillow and the native engine
in test_gpu_resize.py) normalized in numpy as the native threads do it (float32, multiply then
add) and cast by torch: every value must be equal, bit for bit, for every dtype and layout.
Runs under Triton's interpreter without a GPU (tests/conftest.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.decoders.base import BatchOutput
from fastdata.decoders.gpu_resize import ImageLayout, place_rows, resample_batch
from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD, scale_bias_for

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
OUT = (12, 10)


def batch(seed=3):
    rng = np.random.default_rng(seed)
    sizes = [(23, 31), (40, 17), (16, 16), (35, 44)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    flat = torch.cat([torch.from_numpy(a).reshape(-1) for a in images]).to(DEVICE)
    layout = ImageLayout.packed(sizes, chw=False)
    boxes = np.array([[1.5, 2.0, 29.0, 20.5], [0, 0, 17, 40], [3, 1, 9, 14], [5.25, 4, 44, 35]], float)
    flips = np.array([False, True, True, False])
    orientations = np.array([1, 6, 3, 8])
    return flat, layout, boxes, flips, orientations


def reference(pixels: np.ndarray, scale_bias, dtype: torch.dtype) -> torch.Tensor:
    """float32 0..255 [k, H, W, 3] -> the output values, as the native threads normalize."""
    if scale_bias is None:
        return torch.from_numpy(pixels).to(dtype)
    scale, bias = (np.asarray(v, np.float32) for v in scale_bias)
    return torch.from_numpy(pixels.astype(np.float32) * scale + bias).to(dtype)


CASES = [(None, False), (torch.float32, True), (torch.float32, False), (torch.float16, True),
         (torch.float16, False), (torch.bfloat16, True), (torch.bfloat16, False)]


@pytest.mark.parametrize("dtype,channels_last", CASES)
def test_resampled_rows_land_normalized_in_their_places(dtype, channels_last):
    flat, layout, boxes, flips, orientations = batch()
    plain = resample_batch(flat, layout, boxes, flips, orientations, OUT, True).cpu().numpy()
    scale_bias = scale_bias_for(IMAGENET_MEAN, IMAGENET_STD) if dtype is not None else None
    out = BatchOutput.allocate(7, OUT, dtype, channels_last, scale_bias, DEVICE)
    out.pixels.zero_()
    rows = np.array([5, 0, 3, 6])
    got = resample_batch(flat, layout, boxes, flips, orientations, OUT, True, into=out, rows=rows)
    assert got is out.tensor
    if dtype is None:
        assert got.shape == (7, *OUT, 3) and got.dtype == torch.uint8
    else:
        assert got.shape == (7, 3, *OUT) and got.dtype == dtype
        assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    pixels = out.pixels.cpu()
    want = reference(plain, scale_bias, pixels.dtype)
    for j, row in enumerate(rows):
        assert torch.equal(pixels[row], want[j]), (j, row)
    untouched = sorted(set(range(7)) - set(rows.tolist()))
    assert not pixels[untouched].to(torch.float32).any()  # rows no image was written to stay as they were


@pytest.mark.parametrize("dtype,channels_last", CASES)
def test_placed_rows_equal_resampled_rows_of_the_same_pixels(dtype, channels_last):
    # The host's rows and the GPU's rows of one batch must be normalized the same way: uint8
    # pixels placed equal the resampler's rows with those values.
    flat, layout, boxes, flips, orientations = batch(5)
    plain = resample_batch(flat, layout, boxes, flips, orientations, OUT, True)
    scale_bias = scale_bias_for((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)) if dtype is not None else None
    a = BatchOutput.allocate(4, OUT, dtype, channels_last, scale_bias, DEVICE)
    b = BatchOutput.allocate(4, OUT, dtype, channels_last, scale_bias, DEVICE)
    rows = np.array([2, 3, 1, 0])
    resample_batch(flat, layout, boxes, flips, orientations, OUT, True, into=a, rows=rows)
    place_rows(plain.to(torch.uint8), b, rows)
    assert torch.equal(a.tensor.cpu(), b.tensor.cpu())
    want = reference(plain.cpu().numpy(), scale_bias, b.pixels.dtype)
    assert torch.equal(b.pixels.cpu()[rows], want)


def test_normalized_output_equals_the_native_threads_float32():
    # The CPU output path (native threads write float32 themselves) and the GPU path agree bit
    # for bit on the same uint8 pixels: both multiply, then add, in float32.
    from fastdata.io.engine import Engine
    from fastdata.io.transforms import CenterCrop
    from fastdata.cli.demo import photo_like_jpeg
    datas = [np.frombuffer(photo_like_jpeg(2, i, 40 + 3 * i, 30 + 2 * i), np.uint8) for i in range(3)]
    engine = Engine(1)
    t = CenterCrop(12, resize=14)
    hw = t.output_size
    try:
        u8 = np.zeros((3, *hw, 3), np.uint8)
        f32 = np.zeros((3, *hw, 3), np.float32)
        assert not engine.run(datas, t, u8).failures
        assert not engine.run(datas, t, f32, normalize=(IMAGENET_MEAN, IMAGENET_STD)).failures
    finally:
        engine.close()
    out = BatchOutput.allocate(3, hw, torch.float32, True, scale_bias_for(IMAGENET_MEAN, IMAGENET_STD), DEVICE)
    place_rows(torch.from_numpy(u8).to(DEVICE), out, [0, 1, 2])
    assert u8.any() and f32.any()
    assert np.array_equal(out.pixels.cpu().numpy(), f32)


def test_bad_outputs_and_rows_raise():
    flat, layout, boxes, flips, orientations = batch()
    out = BatchOutput.allocate(4, OUT, torch.float16, True, scale_bias_for(IMAGENET_MEAN, IMAGENET_STD), DEVICE)
    args = (flat, layout, boxes, flips, orientations, OUT, True)
    with pytest.raises(ValueError, match="rows"):
        resample_batch(*args, into=out, rows=[0, 1, 2])
    with pytest.raises(ValueError, match="0..3"):
        resample_batch(*args, into=out, rows=[0, 1, 2, 4])
    with pytest.raises(ValueError, match=r"\[N, 8, 8, 3\]"):
        resample_batch(flat, layout, boxes, flips, orientations, (8, 8), True, into=out, rows=[0, 1, 2, 3])
    with pytest.raises(TypeError, match="uint8"):
        place_rows(torch.zeros((1, *OUT, 3), dtype=torch.float32, device=DEVICE), out, [0])
    wrong = BatchOutput(out.tensor, out.pixels.to(torch.int32))
    with pytest.raises(TypeError, match="float16"):
        place_rows(torch.zeros((1, *OUT, 3), dtype=torch.uint8, device=DEVICE), wrong, [0])
    with pytest.raises(ValueError, match="normalization"):
        BatchOutput.allocate(2, OUT, torch.float16, True, None, DEVICE)
