"""The Loader's CUDA path: same pixels as the CPU path, stream-safe handoff, real overlap."""
from __future__ import annotations

import time

import pytest
import torch

import fastdata
from fastdata.cli.demo import photo_like_jpeg

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def source():
    data = [photo_like_jpeg(11, i, 200 + 13 * i, 150 + 7 * i) for i in range(48)]
    return fastdata.BytesSource(data, [i % 4 for i in range(48)])


def _batches(source, **kw):
    with fastdata.Loader(source, batch_size=16, transform=fastdata.RandomResizedCrop(96), seed=3,
                         threads=4, backend="native", **kw) as loader:
        return [(x, y) for x, y in loader]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_output_equals_cpu_output(source, dtype):
    cpu = _batches(source, device="cpu", dtype=torch.float32)
    gpu = _batches(source, device="cuda", dtype=dtype)
    assert len(cpu) == len(gpu) == 3
    tol = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}[dtype]
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.device.type == "cuda" and xg.dtype == dtype and yg.dtype == torch.int64
        assert xg.shape == (16, 3, 96, 96) and xg.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(yc, yg.cpu())
        err = (xg.float().cpu() - xc).abs() / xc.abs().clamp_min(1.0)
        assert err.max().item() <= tol


def test_uint8_cuda_output_is_the_native_nhwc(source):
    cpu = _batches(source, device="cpu", dtype=torch.uint8)
    gpu = _batches(source, device="cuda", dtype=torch.uint8)
    for (xc, _), (xg, _) in zip(cpu, gpu):
        assert xg.device.type == "cuda" and torch.equal(xc, xg.cpu())


def test_slow_step_sees_no_data_wait(source):
    """With a step much slower than decoding, prefetch hides the input pipeline."""
    big = fastdata.BytesSource(list(source.buffers) * 4, list(source.labels) * 4)
    with fastdata.Loader(big, batch_size=16, transform=fastdata.RandomResizedCrop(96), threads=4,
                         device="cuda", dtype=torch.float16, prefetch=3, backend="native") as loader:
        steps = 0
        t0 = time.perf_counter()
        for x, _ in loader:
            torch.cuda._sleep(50_000_000)  # ~25-50 ms of GPU time per step, asynchronously
            torch.cuda.synchronize()
            steps += 1
        wall = time.perf_counter() - t0
        stats = loader.stats()
    assert steps == len(loader)
    # The first batch is always waited for; after it the wait must be a small share.
    assert stats.wait_seconds < 0.1 * wall, (stats.wait_seconds, wall)
    assert stats.h2d_seconds > 0
