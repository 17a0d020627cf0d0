"""On a CUDA machine: the nvjpeg and DALI (mixed) backends against the native path.

Run: python -m pytest tests/gpu/test_gpu_backends.py -q -m gpu
(DALI cases are skipped unless nvidia-dali-cuda130 is installed.)
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.loader.pipeline import make_backend
from fastdata.decoders.gpu_resize import ImageLayout, resample_batch
from fastdata.cli.demo import photo_like_jpeg

from gpu_params import GPU_BACKENDS
from imagegen import hard_case_folder, psnr, with_each_exif_orientation

pytestmark = pytest.mark.gpu


def _consume(backend, out: torch.Tensor) -> torch.Tensor:
    # What the Loader does on the consumer side: wait for the backend's stream, then use.
    torch.cuda.current_stream().wait_stream(backend.stream)
    out.record_stream(torch.cuda.current_stream())
    return out


@pytest.mark.parametrize("name", GPU_BACKENDS)
@pytest.mark.parametrize("transform", [fastdata.RandomResizedCrop(96), fastdata.CenterCrop(80)])
def test_gpu_backend_matches_native_on_hard_folder(tmp_path, name, transform):
    paths = hard_case_folder(tmp_path)  # plain, CMYK, progressive, gray, PNG, EXIF 6/7, truncated, garbage, missing
    indices = np.arange(300, 300 + len(paths))
    with make_backend(name, transform, device="cuda", dtype=None, seed=7, threads=4) as gpu, \
            make_backend("native", transform, device="cpu", dtype=None, seed=7, threads=4) as native:
        for epoch in (0, 1):
            a, fa, ra = gpu.run(paths, indices, epoch)
            a = _consume(gpu, a).cpu()
            b, fb, rb = native.run(paths, indices, epoch)
            assert a.shape == b.shape and a.dtype == torch.uint8
            assert ra == rb and [(e.index, e.name) for e in fa] == [(e.index, e.name) for e in fb]
            for row in range(len(paths) - 2):
                assert psnr(a[row], b[row]) >= 30, (name, paths[row], psnr(a[row], b[row]))
            sims = torch.tensor([[psnr(a[i], b[j]) for j in range(6)] for i in range(6)])
            assert (sims.argmax(1) == torch.arange(6)).all()
        assert gpu.stats["gpu_rows"] >= 2 * 8  # most of the folder really went through the GPU


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_backend_normalized_fp16_channels_last(tmp_path, name):
    paths = hard_case_folder(tmp_path)[:8]
    transform = fastdata.RandomResizedCrop(64)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with make_backend(name, transform, device="cuda", dtype=None, seed=1, threads=4) as raw:
        u8, _, _ = raw.run(paths, np.arange(8), 0)
        u8 = _consume(raw, u8)
    with make_backend(name, transform, device="cuda", dtype=torch.float16, mean=mean, std=std, seed=1,
                      threads=4) as be:
        y, failures, _ = be.run(paths, np.arange(8), 0)
        y = _consume(be, y)
    assert not failures and y.shape == (8, 3, 64, 64) and y.dtype == torch.float16 and y.is_cuda
    assert y.is_contiguous(memory_format=torch.channels_last)
    m = torch.tensor(mean, device="cuda", dtype=torch.float64)
    s = torch.tensor(std, device="cuda", dtype=torch.float64)
    ref = ((u8.double() / 255 - m) / s).permute(0, 3, 1, 2)
    torch.testing.assert_close(y.double(), ref, atol=5e-3, rtol=0)


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_crops_follow_exif_orientation(name):
    datas, refs = with_each_exif_orientation(Image.open(io.BytesIO(photo_like_jpeg(2, 0, 150, 100))))
    transform = fastdata.RandomResizedCrop(48, scale=(0.3, 0.6))
    with fastdata.Engine(1) as engine:
        plan = engine.plan(datas, transform, seed=3, indices=np.arange(8))
    with make_backend(name, transform, device="cuda", dtype=None, seed=3, threads=2) as be:
        out, failures, _ = be.run(datas, np.arange(8), 0)
        out = _consume(be, out).cpu()
    assert not failures
    for i, ref in enumerate(refs):
        expect = ref.crop(tuple(int(v) for v in plan.boxes[i])).resize((48, 48), Image.BILINEAR)
        if plan.flips[i]:
            expect = expect.transpose(Image.FLIP_LEFT_RIGHT)
        assert psnr(out[i], torch.from_numpy(np.array(expect))) >= 35, (name, i + 1)


def test_resampler_runs_on_the_current_stream():
    # The input only becomes valid on a side stream behind a 50 ms sleep: kernels launched
    # anywhere but that (current) stream would read zeros. (tests/decoders/test_gpu_resize.py
    # checks the kernels' pixels on CUDA too.)
    images = [np.asarray(Image.open(io.BytesIO(photo_like_jpeg(1, i, 160 + 20 * i, 120))).convert("RGB"))
              for i in range(4)]
    src = torch.cat([torch.from_numpy(a.copy()).reshape(-1) for a in images]).cuda()
    flat = torch.zeros_like(src)
    layout = ImageLayout.packed([a.shape[:2] for a in images], chw=False)
    boxes = np.array([[3, 4, 150, 110], [0, 0, 180, 120], [20, 10, 90, 70], [5, 5, 200, 119]], float)
    flips = np.array([True, False, True, False])
    orient = np.ones(4, np.int64)  # stored = oriented: the Pillow reference below does not orient
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU clock cycles
        flat.copy_(src, non_blocking=True)
        out = resample_batch(flat, layout, boxes, flips, orient, (64, 72), True)
    side.synchronize()
    for i, a in enumerate(images):
        ref = Image.fromarray(a).crop(tuple(int(v) for v in boxes[i])).resize((72, 64), Image.BILINEAR)
        if flips[i]:
            ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
        ref = torch.from_numpy(np.array(ref)).float()
        assert (out[i].cpu() - ref).abs().max() <= 2, i
