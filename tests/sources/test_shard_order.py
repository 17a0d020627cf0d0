"""ShardOrder: the epoch order of tar shards split over ranks (a pure function, no data)."""
from __future__ import annotations

import numpy as np
import pytest

from fastdata.sources.shard_order import ShardOrder


def orders(counts, world, batch=5, **kw):
    return [ShardOrder(tuple(counts), batch, rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_disjoint_shards_every_sample_once_equal_batches(world: int) -> None:
    counts = [10] * 6
    for epoch in range(3):
        per_rank = [list(o.rank_indices(epoch)) for o in orders(counts, world, seed=4, shuffle_buffer=7)]
        union = [i for r in per_rank for i in r]
        assert sorted(union) == list(range(60))
        assert len({o.num_batches for o in orders(counts, world)}) == 1
        shards = [{i // 10 for i in r} for r in per_rank]
        assert all(not (a & b) for k, a in enumerate(shards) for b in shards[k + 1:]), "ranks share a shard"


def test_unequal_shards_equal_batches_and_documented_loss_or_padding() -> None:
    counts = [10, 10, 10, 10, 3]
    for drop_last in (True, False):
        os_ = orders(counts, 2, drop_last=drop_last, batch=4)
        assert len({o.num_batches for o in os_}) == 1
        for epoch in range(4):
            idx = [o.rank_indices(epoch) for o in os_]
            assert all(len(i) == os_[0].per_rank for i in idx)
            union = np.concatenate(idx)
            if drop_last:  # each rank keeps the 2 smallest shards' worth: 13 samples
                assert os_[0].per_rank == 13 and len(set(union.tolist())) == 26
            else:  # each rank pads to the 3 largest shards' worth by repeating its own stream
                assert os_[0].per_rank == 30 and set(union.tolist()) == set(range(43))


def test_shuffle_buffer_is_bounded_and_epochs_differ() -> None:
    o = ShardOrder((50,) * 4, 8, seed=2, shuffle_buffer=16)
    for epoch in range(3):
        emit = o.emit_order(epoch)
        assert sorted(emit.tolist()) == list(range(200))
        # output p is read at most shuffle_buffer - 1 positions ahead of it
        assert (emit - np.arange(200)).max() <= 15
    assert not np.array_equal(o.rank_indices(0), o.rank_indices(1))
    assert np.array_equal(o.rank_indices(1), ShardOrder((50,) * 4, 8, seed=2, shuffle_buffer=16).rank_indices(1))
    plain = ShardOrder((50,) * 4, 8, shuffle=False)
    assert plain.rank_indices(0).tolist() == list(range(200))


def test_refuses_too_few_shards_for_the_ranks() -> None:
    with pytest.raises(ValueError, match="every rank needs a shard"):
        ShardOrder((10, 10), 2, rank=0, world_size=3)
