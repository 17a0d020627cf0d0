"""The DALI backend, CPU-only (device_id=None), against the native backend for the same seed.

Needs NVIDIA DALI (pip install nvidia-dali-cuda130); skipped with that reason without it.
The missing-DALI error is checked everywhere.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.decoders import DALI_MISSING
from fastdata.loader.pipeline import make_backend
from fastdata.cli.demo import photo_like_jpeg
from gpu_params import needs_dali
from imagegen import hard_case_folder, psnr, with_each_exif_orientation



def test_missing_dali_raises_one_clear_error(monkeypatch):
    import fastdata.decoders.dali as dali_mod
    monkeypatch.setattr(dali_mod, "dali_available", lambda: False)
    with pytest.raises(ImportError) as info:
        make_backend("dali", fastdata.RandomResizedCrop(32), device="cpu")
    assert str(info.value) == DALI_MISSING
    assert "pip install fastdata[dali]" in DALI_MISSING


@needs_dali
@pytest.mark.parametrize("transform", [fastdata.RandomResizedCrop(64), fastdata.CenterCrop(56)])
def test_same_rows_crops_and_failures_as_native(tmp_path, transform):
    paths = hard_case_folder(tmp_path)
    indices = np.arange(500, 500 + len(paths))
    cfg = dict(device="cpu", dtype=None, seed=9, threads=2)
    with make_backend("dali", transform, **cfg) as dali, make_backend("native", transform, **cfg) as native:
        for epoch in (0, 1):
            a, fa, ra = dali.run(paths, indices, epoch)
            b, fb, rb = native.run(paths, indices, epoch)
            assert a.shape == b.shape and a.dtype == torch.uint8
            assert ra == rb and [(e.index, e.name) for e in fa] == [(e.index, e.name) for e in fb]
            assert [Path(e.name).name for e in fa] == ["garbage.jpg", "missing.jpg"]
            for row in range(len(paths) - 2):
                assert psnr(a[row], b[row]) >= 30, (paths[row], epoch, psnr(a[row], b[row]))
            sims = torch.tensor([[psnr(a[i], b[j]) for j in range(6)] for i in range(6)])
            assert (sims.argmax(1) == torch.arange(6)).all()
        # A sub-batch (what a resumed or sharded loader asks for) gives the same rows.
        sub = [1, 4, 5]
        c, _, _ = dali.run([paths[i] for i in sub], indices[sub], 1)
        torch.testing.assert_close(c, a[sub], atol=0, rtol=0)


@needs_dali
def test_crops_follow_exif_orientation_like_pillow(tmp_path):
    datas, refs = with_each_exif_orientation(Image.open(io.BytesIO(photo_like_jpeg(2, 0, 150, 100))))
    transform = fastdata.RandomResizedCrop(48, scale=(0.3, 0.6))
    with fastdata.Engine(1) as engine:
        plan = engine.plan(datas, transform, seed=3, indices=np.arange(8))
    with make_backend("dali", transform, device="cpu", dtype=None, seed=3, threads=1) as dali:
        out, failures, _ = dali.run(datas, np.arange(8), 0)
    assert not failures
    for i, ref in enumerate(refs):
        expect = ref.crop(tuple(int(v) for v in plan.boxes[i])).resize((48, 48), Image.BILINEAR)
        if plan.flips[i]:
            expect = expect.transpose(Image.FLIP_LEFT_RIGHT)
        assert psnr(out[i], torch.from_numpy(np.array(expect))) >= 40, i


@needs_dali
def test_normalized_dtypes_and_layouts(tmp_path):
    paths = hard_case_folder(tmp_path)[:6]
    transform = fastdata.RandomResizedCrop((40, 48))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with make_backend("dali", transform, device="cpu", dtype=None, seed=2, threads=2) as raw:
        u8, _, _ = raw.run(paths, np.arange(6), 0)
    ref = ((u8.double() / 255 - torch.tensor(mean, dtype=torch.float64)) / torch.tensor(std, dtype=torch.float64))
    ref = ref.permute(0, 3, 1, 2)
    for dtype, cl, tol in [(torch.float16, True, 5e-3), (torch.float32, False, 1e-4), (torch.bfloat16, True, 3e-2)]:
        with make_backend("dali", transform, device="cpu", dtype=dtype, mean=mean, std=std, channels_last=cl,
                          seed=2, threads=2) as be:
            y, failures, _ = be.run(paths, np.arange(6), 0)
        assert not failures and y.shape == (6, 3, 40, 48) and y.dtype == dtype
        assert y.is_contiguous(memory_format=torch.channels_last) if cl else y.is_contiguous()
        torch.testing.assert_close(y.double(), ref, atol=tol, rtol=0)


@needs_dali
def test_damaged_file_in_a_batch_is_reported_not_fatal():
    good = [photo_like_jpeg(5, i, 120, 90) for i in range(4)]
    bad = good[1][: len(good[1]) // 3]  # truncated: routed to the native decoder, which reports it
    datas = [good[0], bad, good[2], good[3]]
    transform = fastdata.RandomResizedCrop(32)
    indices = np.array([10, 11, 12, 13])
    with make_backend("dali", transform, device="cpu", dtype=None, seed=1, threads=1, strict=True) as dali:
        a, fa, ra = dali.run(datas, indices, 0)
        clean, _, _ = dali.run(good, indices, 0)
        stats = dict(dali.stats)
    assert ra == [1] and len(fa) == 1 and fa[0].index == 11 and (a[1] == 0).all()
    assert stats["gpu_rows"] == 3 + 4 and stats["native_rows"] == 1
    torch.testing.assert_close(a[[0, 2, 3]], clean[[0, 2, 3]], atol=0, rtol=0)
    with make_backend("dali", transform, device="cpu", dtype=None, seed=1, threads=1, strict=False) as dali:
        _, fa, ra = dali.run(datas, indices, 0)
    assert not fa and not ra  # non-strict: libjpeg decodes what is there, like the native path


class _FailingPipe:
    def feed_input(self, *args, **kwargs):
        raise RuntimeError("[/dali/...] Error in thread 0: decoding failed (injected)")


@needs_dali
def test_a_failing_dali_batch_falls_back_to_native_and_rebuilds():
    datas = [photo_like_jpeg(6, i, 120, 90) for i in range(4)]
    transform = fastdata.RandomResizedCrop(32)
    cfg = dict(device="cpu", dtype=None, seed=1, threads=1)
    with make_backend("dali", transform, **cfg) as dali, make_backend("native", transform, **cfg) as native:
        first, _, _ = dali.run(datas, np.arange(4), 0)
        dali.decoders[0]._pipe = _FailingPipe()
        a, fa, ra = dali.run(datas, np.arange(4), 0)
        b, _, _ = native.run(datas, np.arange(4), 0)
        assert not fa and not ra and dali.stats["gpu_rejected"] == 4
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # the whole batch came from the native path
        again, _, _ = dali.run(datas, np.arange(4), 0)  # a fresh pipeline serves the next batch
        torch.testing.assert_close(again, first, atol=0, rtol=0)


class _OutputsFailAfter:
    """A real DALI pipeline whose outputs() fails from the ``ok``-th call on, as DALI does
    when one sample of a scheduled batch cannot be decoded (the pipeline is then unusable)."""

    def __init__(self, pipe, ok: int):
        self.pipe, self.ok = pipe, ok

    def feed_input(self, *args, **kwargs):
        return self.pipe.feed_input(*args, **kwargs)

    def schedule_run(self):
        return self.pipe.schedule_run()

    def outputs(self, *args, **kwargs):
        if self.ok == 0:
            raise RuntimeError("[/dali/...] Critical error in pipeline: decoding failed (injected)")
        self.ok -= 1
        return self.pipe.outputs(*args, **kwargs)


def _ready(t: torch.Tensor) -> torch.Tensor:
    """A backend's output, usable on the default stream (on CUDA it is made on the backend's stream)."""
    if t.is_cuda:
        torch.cuda.synchronize()
    return t


in_flight_devices = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def _batches(n_batches: int, per: int = 4):
    datas = [photo_like_jpeg(8, i, 130 + 3 * i, 100) for i in range(n_batches * per)]
    return [(datas[k * per:(k + 1) * per], np.arange(k * per, (k + 1) * per)) for k in range(n_batches)]


@needs_dali
@in_flight_devices
def test_batches_in_flight_come_back_in_order_and_equal_one_at_a_time(device):
    transform = fastdata.RandomResizedCrop(40)
    cfg = dict(device=device, dtype=None, seed=2, threads=2)
    batches = _batches(4)
    with make_backend("dali", transform, **cfg) as one_at_a_time:
        expected = [_ready(one_at_a_time.run(d, i, 0)[0]) for d, i in batches]
    with make_backend("dali", transform, **cfg) as dali:
        assert dali.depth == 4
        pending = [dali.submit(d, i, 0) for d, i in batches[:3]]
        # A synchronous run() while three batches are in flight (what a skip replacement does)
        extra, _, _ = dali.run(*batches[3], 0)
        torch.testing.assert_close(_ready(extra), expected[3], atol=0, rtol=0)
        for p, want in zip(pending, expected):
            got, failures, rows = dali.collect(p)
            assert not failures and not rows
            torch.testing.assert_close(_ready(got), want, atol=0, rtol=0)
        dali.discard(dali.submit(*batches[0], 0))  # an abandoned batch leaves the queue in step
        again, _, _ = dali.run(*batches[1], 0)
        torch.testing.assert_close(_ready(again), expected[1], atol=0, rtol=0)


@needs_dali
@in_flight_devices
def test_a_pipeline_failing_with_batches_in_flight_loses_none_of_them(device):
    transform = fastdata.RandomResizedCrop(40)
    cfg = dict(device=device, dtype=None, seed=2, threads=2)
    batches = _batches(3)
    with make_backend("dali", transform, **cfg) as dali, make_backend("native", transform, **cfg) as native:
        first = _ready(dali.run(*batches[0], 0)[0])
        dali.decoders[0]._pipe = _OutputsFailAfter(dali.decoders[0]._pipe, ok=1)
        pending = [dali.submit(d, i, 0) for d, i in batches]
        outs = [dali.collect(p) for p in pending]
        torch.testing.assert_close(_ready(outs[0][0]), first, atol=0, rtol=0)  # taken before the failure
        for (got, failures, rows), (d, i) in zip(outs[1:], batches[1:]):
            assert not failures and not rows
            want = _ready(native.run(d, i, 0)[0])
            torch.testing.assert_close(_ready(got), want, atol=0, rtol=0)  # all rows native
        assert dali.stats["gpu_rejected"] == 8
        assert not isinstance(dali.decoders[0]._pipe, _OutputsFailAfter)  # the next batch built a new pipeline
        again, _, _ = dali.run(*batches[0], 0)
        torch.testing.assert_close(_ready(again), first, atol=0, rtol=0)


@needs_dali
def test_decode_windows_stay_inside_the_image_and_dali_takes_every_row():
    """Regression (issue 14): a RandomResizedCrop box edge computed in floating point can lie
    a hair past the image (459.00000000000006 rows of 459); its ceiling made a window one
    pixel too tall, DALI failed the whole batch ("cropping window ... is not valid"), the
    batch went native, and on the GPU the failed pipeline's destruction crashed the process.
    These 64 demo images hit that edge in epoch 0 with seed 0."""
    from fastdata.cli.demo import _KIND_CYCLE, demo_image
    idx = [i for i in range(800) if _KIND_CYCLE[i % len(_KIND_CYCLE)] == "baseline"][:64]
    datas = [np.frombuffer(demo_image(0, i, 100)[1], np.uint8) for i in idx]
    with make_backend("dali", fastdata.RandomResizedCrop(224), device="cpu", dtype=None, seed=0, threads=2) as dali:
        rows = list(range(len(datas)))
        for epoch in range(3):
            plan = dali.engine.plan(datas, dali.transform, seed=0, epoch=epoch, indices=np.arange(len(datas)))
            anchor, shape, _, _ = dali.decoders[0]._windows(plan, rows)
            assert (anchor >= 0).all()
            assert (anchor[:, 0] + shape[:, 0] <= plan.sizes[:, 1]).all(), epoch
            assert (anchor[:, 1] + shape[:, 1] <= plan.sizes[:, 0]).all(), epoch
            _, failures, _ = dali.run(datas, np.arange(len(datas)), epoch)
            assert failures == []
        assert dali.stats["gpu_rejected"] == 0 and dali.stats["native_rows"] == 0
        assert dali.stats["gpu_rows"] == 3 * len(datas)


@needs_dali
def test_reads_restart_indexed_cache_records_as_native_does(tmp_path):
    # fastdata-convert's LMDB records (a restart marker every MCU and an APP15 index) reach DALI's
    # decoder, which takes them all, and its crops match the native engine's on the same records.
    from fastdata.cache.build.writer import convert

    src = tmp_path / "src" / "class0"
    src.mkdir(parents=True)
    for i in range(6):
        (src / f"{i}.jpg").write_bytes(photo_like_jpeg(4, i, 160 + 9 * i, 120 + 5 * i))
    convert(str(tmp_path / "src"), str(tmp_path / "db"), workers=1)
    cfg = dict(transform=fastdata.RandomResizedCrop(64), device="cpu", dtype=torch.uint8, batch_size=6, threads=2,
               seed=3, shuffle=False)
    out = {}
    for backend in ("dali", "native"):
        with fastdata.Loader(fastdata.LMDBSource(str(tmp_path / "db")), backend=backend, **cfg) as loader:
            out[backend] = torch.cat([x for x, _ in loader])
            stats = loader.stats()
        if backend == "dali":
            assert stats.gpu_rows == 6 and stats.native_rows == 0 and stats.failures == 0  # DALI took every record
    assert len(out["dali"]) == len(out["native"]) == 6
    for row in range(6):
        assert psnr(out["dali"][row], out["native"][row]) >= 30, (row, psnr(out["dali"][row], out["native"][row]))
