"""The Loader over TarShards served by a real HTTP server (127.0.0.1): every sample once per
epoch over simulated ranks with equal batch counts, crops keyed by the global index, exact
resume with another thread count, damaged shards raised or counted. Oracles: the labels
(each sample's label is its global index) and fastdata.decode_batch on the bytes written."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch

import fastdata
from fastdata.sources.shard_stream import ShardSampleError

from shardserver import ShardServer, sample_jpeg, write_shards

N_SHARDS, PER_SHARD = 6, 10


@pytest.fixture()
def served(tmp_path: Path):
    folder = tmp_path / "shards"
    write_shards(folder, [PER_SHARD] * N_SHARDS)
    fastdata.TarShards(str(folder) + "/train-{000000..000005}.tar").index.save(str(folder / "index.json"))
    with ShardServer(folder) as srv:
        yield srv, folder


def run_epochs(source: fastdata.TarShards, epochs: int, transform, **kw) -> List[Tuple[np.ndarray, np.ndarray]]:
    out = []
    with fastdata.Loader(source, transform=transform, device="cpu", dtype=torch.uint8, seed=3, **kw) as loader:
        for e in range(epochs):
            loader.set_epoch(e)
            out += [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_per_epoch_over_ranks(served, world: int) -> None:
    srv, _ = served
    crop = fastdata.RandomResizedCrop(16)
    per_rank = [run_epochs(fastdata.TarShards(index=srv.url + "/index.json", shuffle_buffer=6), 2, crop,
                           batch_size=5, rank=r, world_size=world, threads=1) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1, "ranks differ in batch count"
    nb = len(per_rank[0]) // 2
    assert nb == N_SHARDS * PER_SHARD // world // 5
    images: Dict[Tuple[int, int], np.ndarray] = {}
    for epoch in range(2):
        labels = [np.concatenate([y for _, y in b[epoch * nb:(epoch + 1) * nb]]) for b in per_rank]
        union = np.concatenate(labels)
        assert sorted(union.tolist()) == list(range(N_SHARDS * PER_SHARD)), f"epoch {epoch}"
        shards = [set((lab // PER_SHARD).tolist()) for lab in labels]
        assert sum(len(s) for s in shards) == N_SHARDS, "a shard was split between ranks"
        for b in per_rank:
            for x, y in b[epoch * nb:(epoch + 1) * nb]:
                for img, lab in zip(x, y):
                    images[epoch, int(lab)] = img
    # the crop of sample i in epoch e is keyed by its global index: the same for any rank count
    one = fastdata.decode_batch([sample_jpeg(i) for i in range(60)], crop, seed=3, epoch=1, indices=list(range(60)))
    for i in range(60):
        np.testing.assert_array_equal(images[1, i], one[i])


def test_resume_mid_epoch_exact_with_other_thread_count(served) -> None:
    srv, _ = served
    url = srv.url + "/index.json"
    crop = fastdata.RandomResizedCrop(16)
    full = run_epochs(fastdata.TarShards(index=url, shuffle_buffer=8), 2, crop, batch_size=4, threads=1)
    a = fastdata.Loader(fastdata.TarShards(index=url, shuffle_buffer=8), batch_size=4, transform=crop, device="cpu",
                        dtype=torch.uint8, seed=3, threads=2)
    a.set_epoch(0)
    list(a)
    a.set_epoch(1)
    it = iter(a)
    for _ in range(5):
        next(it)
    state = a.state_dict()
    a.close()
    b = fastdata.Loader(fastdata.TarShards(index=url, shuffle_buffer=8), batch_size=4, transform=crop, device="cpu",
                        dtype=torch.uint8, seed=3, threads=1)
    b.load_state_dict(state)
    b.set_epoch(1)
    rest = [(x.numpy().copy(), y.numpy().copy()) for x, y in b]
    b.close()
    expected = full[len(full) // 2 + 5:]
    assert len(rest) == len(expected) == 10
    for (x, y), (ex, ey) in zip(rest, expected):
        np.testing.assert_array_equal(y, ey)
        np.testing.assert_array_equal(x, ex)


def test_cut_off_shard_raises_or_is_counted_and_replaced(served) -> None:
    srv, folder = served
    url = srv.url + "/index.json"
    index = fastdata.TarShards(index=url).index
    path = folder / "train-000004.tar"
    path.write_bytes(path.read_bytes()[:int(index.shards[4].offsets[7]) + 50])  # samples 47..49 cut off
    crop = fastdata.CenterCrop(16)
    with pytest.raises(ShardSampleError, match=r"train-000004\.tar: sample 's0000(47|48|49)\.jpg'.*cut off"):
        run_epochs(fastdata.TarShards(index=url, backoff=0.01), 1, crop, batch_size=5, threads=1)
    source = fastdata.TarShards(index=url, backoff=0.01)
    with pytest.warns(RuntimeWarning, match=r"replaced an undecodable sample.*train-000004\.tar \[s0000(47|48|49)\.jpg\]"):
        with fastdata.Loader(source, batch_size=5, transform=crop, device="cpu", dtype=torch.uint8, seed=3,
                             threads=1, on_error="skip") as loader:
            got = [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]
            # the 3 samples; apart, the replacements tried for them that were cut off too (48, 49 for 47; 49 for 48)
            stats = loader.stats()
            assert (stats.failures, stats.replacement_failures) == (3, 3)
    assert source.stats()["damaged"] == 3
    assert len(got) == 12
    labels = np.concatenate([y for _, y in got])
    assert not {47, 48, 49} & set(labels.tolist())  # replaced (by the next index that decodes)
    assert sorted(s["name"].rsplit("[", 1)[1] for s in source.skipped) == ["s000047.jpg]", "s000048.jpg]",
                                                                           "s000049.jpg]"]
    ref = fastdata.decode_batch([sample_jpeg(int(i)) for i in labels], crop)
    np.testing.assert_array_equal(np.concatenate([x for x, _ in got]), ref)


def test_leaving_an_epoch_early_and_closing_stops_the_readers(served) -> None:
    import threading

    srv, _ = served
    source = fastdata.TarShards(index=srv.url + "/index.json", shuffle_buffer=4, readahead=2)
    loader = fastdata.Loader(source, batch_size=5, transform=fastdata.CenterCrop(16), device="cpu",
                             dtype=torch.uint8, threads=1)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    first = [y.tolist() for _, y in loader]  # the next epoch starts a new stream, complete
    assert sorted(sum(first, [])) == list(range(60))
    loader.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("fastdata-shards")]


def test_set_epoch_mid_epoch_still_streams_the_asked_for_epoch(served) -> None:
    """set_epoch while an epoch is consumed points the producer's lookahead at that epoch; its
    batches still come through the read-ahead (no sample read on its own)."""
    srv, _ = served
    source = fastdata.TarShards(index=srv.url + "/index.json", shuffle_buffer=4)
    with fastdata.Loader(source, batch_size=5, transform=fastdata.CenterCrop(16), device="cpu",
                         dtype=torch.uint8, threads=1, seed=3) as loader:
        it = iter(loader)
        next(it)
        loader.set_epoch(5)
        rest = [y.tolist() for _, y in it]
        assert len(rest) == 11
        epoch5 = [y.tolist() for _, y in loader]
    assert sorted(sum(epoch5, [])) == list(range(60))
    expected = [b.tolist() for b in source.make_order(5, shuffle=True, seed=3, drop_last=True, rank=0,
                                                     world_size=1).batches(5)]
    assert epoch5 == expected
    assert source.stats()["random_reads"] == 0
