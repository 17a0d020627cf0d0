"""fastdata.Loader with backend="dali" against backend="native": CPU-only DALI (device_id=None)
everywhere, and DALI's mixed GPU pipeline too where CUDA is present (``device`` = "cuda", marked gpu).

What the Loader owns must not change with the backend: order and labels for a seed,
sharding, exact resume, leaving an epoch early, output dtypes and layout. Pixels differ
only by decoder rounding (PSNR >= 30 dB against the native path).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fastdata
from fastdata.cli.demo import photo_like_jpeg
from gpu_params import needs_dali
from imagegen import psnr

pytestmark = needs_dali

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Where both loaders run: the CUDA case drives DALI's asynchronous mixed pipeline."""
    return request.param


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes x 9 photo-like JPEGs of varied sizes, each image distinct."""
    root = tmp_path_factory.mktemp("dali_folder")
    for c in range(3):
        d = root / f"class_{c}"
        d.mkdir()
        for i in range(9):
            (d / f"{i:02d}.jpg").write_bytes(photo_like_jpeg(21, 10 * c + i, 120 + 5 * i, 90 + 3 * c))
    return root


def loader(folder: Path, backend: str, device: str = "cpu", **kw) -> fastdata.Loader:
    cfg = dict(batch_size=4, transform=fastdata.RandomResizedCrop(48), shuffle=True, seed=5, threads=2,
               device=device, dtype=torch.uint8, backend=backend)
    cfg.update(kw)
    return fastdata.Loader(fastdata.ImageFolder(str(folder)), **cfg)


def epoch(ld: fastdata.Loader, e: int):
    ld.set_epoch(e)
    return [(x.clone(), y.clone()) for x, y in ld]


def test_same_order_labels_and_crops_as_native(folder, device):
    with loader(folder, "dali", device) as dali, loader(folder, "native", device) as native:
        assert len(dali) == len(native) == 6
        for e in (0, 1):
            got, want = epoch(dali, e), epoch(native, e)
            assert len(got) == len(want) == 6
            for (a, la), (b, lb) in zip(got, want):
                assert a.shape == b.shape == (4, 48, 48, 3) and a.dtype == torch.uint8
                assert torch.equal(la, lb)
                for row in range(4):
                    assert psnr(a[row], b[row]) >= 30
        assert not torch.equal(torch.cat([y for _, y in epoch(dali, 0)]), torch.cat([y for _, y in epoch(dali, 1)]))


def test_resume_mid_epoch_gives_exactly_the_remaining_batches(folder, device):
    with loader(folder, "dali", device) as ld:
        full = epoch(ld, 3)
        ld.set_epoch(3)
        it = iter(ld)
        for _ in range(2):
            next(it)
        state = ld.state_dict()
        it.close()
    with loader(folder, "dali", device) as resumed:
        resumed.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert len(rest) == 4
    for (a, la), (b, lb) in zip(rest, full[2:]):
        assert torch.equal(la, lb)
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_shards_follow_the_native_sampler(folder, device):
    seen = []
    for rank in (0, 1):
        with loader(folder, "dali", device, rank=rank, world_size=2) as dali, \
                loader(folder, "native", device, rank=rank, world_size=2) as native:
            got, want = epoch(dali, 0), epoch(native, 0)
            assert len(got) == len(want) == len(dali) == 3
            for (a, la), (b, lb) in zip(got, want):
                assert torch.equal(la, lb)
                assert min(psnr(a[r], b[r]) for r in range(4)) >= 30
            seen.append(torch.cat([x for x, _ in got]))
    # Disjoint shards: no image of rank 0 is (nearly) an image of rank 1.
    cross = max(psnr(a, b) for a in seen[0] for b in seen[1])
    assert cross < 30


def test_breaking_out_of_an_epoch_leaves_the_next_one_intact(folder, device):
    with loader(folder, "dali", device) as ld, loader(folder, "dali", device) as fresh:
        for e in range(3):
            ld.set_epoch(e)
            for k, _ in enumerate(ld):
                if k == 1:
                    break  # batches still in flight in the pipeline are discarded
        got = epoch(ld, 3)
        want = epoch(fresh, 3)
        for (a, la), (b, lb) in zip(got, want):
            assert torch.equal(la, lb)
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_normalized_float_output_matches_native(folder, device):
    kw = dict(dtype=torch.float32, mean=MEAN, std=STD, channels_last=True)
    with loader(folder, "dali", device, **kw) as dali, loader(folder, "native", device, **kw) as native:
        (a, la), (b, lb) = next(iter(dali)), next(iter(native))
    assert a.shape == b.shape == (4, 3, 48, 48) and a.dtype == b.dtype == torch.float32
    assert a.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(la, lb)
    assert float((a - b).abs().mean()) < 0.1  # ~ 6/255 in pixels, over std ~0.225


def test_an_error_starting_a_batch_comes_after_the_batches_before_it(folder):
    class Flaky(fastdata.ImageFolder):
        def fetch(self, indices):
            if 12 in [int(i) for i in indices]:  # batch 3 of an unshuffled epoch
                raise OSError("storage went away (injected)")
            return super().fetch(indices)

    got = []
    with fastdata.Loader(Flaky(str(folder)), batch_size=4, transform=fastdata.RandomResizedCrop(48), shuffle=False,
                         threads=2, device="cpu", dtype=torch.uint8, backend="dali") as ld:
        with pytest.raises(OSError, match="injected"):
            for _, labels in ld:
                got.append(labels.clone())
    # Batches 0-2 were submitted before batch 3 failed to start: they arrive first, in order.
    assert [g.tolist() for g in got] == [ld._labels[4 * k:4 * k + 4].tolist() for k in range(3)]
