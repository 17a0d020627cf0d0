"""ShardedOrder: epoch permutations, rank shards and resume offsets (no images, no threads).

Oracle: ``torch.utils.data.DistributedSampler``. With ``shuffle=False`` our rank indices
must equal its indices exactly (same padding by wrapping, same stride split, same
drop_last rule); with ``shuffle=True`` they must be its indices mapped through our epoch
permutation (the shard *structure* is the sampler's, only the permutation differs).
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from fastdata.loader.sampler import ShardedOrder

torch_data = pytest.importorskip("torch.utils.data")

SIZES = (1, 2, 3, 7, 8, 10, 33, 64)


def _sampler_indices(n: int, world: int, rank: int, drop_last: bool) -> list:
    """DistributedSampler's unshuffled indices for ``rank`` (the oracle)."""
    sampler = torch_data.DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                            drop_last=drop_last)
    return list(sampler)


def _orders(n: int, batch: int, world: int, **kw) -> list:
    return [ShardedOrder(n, batch, rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", SIZES)
def test_rank_indices_match_distributed_sampler(n: int, world: int, drop_last: bool, shuffle: bool) -> None:
    if drop_last and n < world:
        with pytest.raises(ValueError, match="no batch"):
            ShardedOrder(n, 1, drop_last=True, world_size=world)
        return
    for epoch in (0, 3):
        for order in _orders(n, 1, world, drop_last=drop_last, shuffle=shuffle, seed=5):
            perm = order.permutation(epoch)
            want = perm[_sampler_indices(n, world, order.rank, drop_last)]
            np.testing.assert_array_equal(order.rank_indices(epoch), want)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", SIZES)
def test_shards_disjoint_covering_padding_only_duplicates(n: int, world: int) -> None:
    epoch = 2
    orders = _orders(n, 3, world, drop_last=False, seed=11)
    shards = [o.rank_indices(epoch) for o in orders]
    per_rank = -(-n // world)
    assert all(len(s) == per_rank for s in shards)
    union = np.concatenate(shards)
    assert set(union.tolist()) == set(range(n)), "the union over ranks must cover the dataset"
    # Duplicates are exactly the wrap-around padding: the first (total - n) samples of the
    # epoch's permutation, each once more per full wrap.
    pad = per_rank * world - n
    counts = Counter(union.tolist())
    perm = orders[0].permutation(epoch)
    expected_extra = Counter(np.resize(perm, pad).tolist()) if pad else Counter()
    extra = Counter({k: c - 1 for k, c in counts.items() if c > 1})
    assert extra == expected_extra


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [8, 9, 10, 33, 64])
def test_drop_last_shards_are_disjoint(n: int, world: int) -> None:
    orders = _orders(n, 2, world, drop_last=True, seed=1)
    seen = [set(np.concatenate(list(o.batches(0))).tolist()) for o in orders]
    for a, b in itertools.combinations(seen, 2):
        assert not a & b
    # Only the samples that cannot fill a whole batch on every rank are left out.
    per_rank = n // world
    assert sum(len(s) for s in seen) == world * (per_rank // 2) * 2


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n,batch", [(10, 3), (33, 4), (64, 8), (7, 2), (5, 5)])
def test_every_rank_has_the_same_batch_count(n: int, batch: int, world: int, drop_last: bool) -> None:
    try:
        orders = _orders(n, batch, world, drop_last=drop_last)
    except ValueError:
        assert drop_last and n // world < batch  # the only case allowed to refuse
        return
    counts = {len(list(o.batches(0))) for o in orders}
    assert counts == {orders[0].num_batches}
    # The DataLoader(DistributedSampler, batch_size, drop_last) count, per rank.
    per_rank = len(_sampler_indices(n, world, 0, drop_last))
    assert orders[0].num_batches == (per_rank // batch if drop_last else -(-per_rank // batch))
    for o in orders:
        sizes = [len(b) for b in o.batches(0)]
        assert all(s == batch for s in sizes[:-1])
        assert (sizes[-1] == batch) if drop_last else (1 <= sizes[-1] <= batch)


def test_permutation_is_a_permutation_and_depends_on_seed_and_epoch() -> None:
    n = 257
    a = ShardedOrder(n, 8, seed=0)
    perms = [a.permutation(e) for e in range(4)]
    for p in perms:
        assert p.dtype == np.int64
        np.testing.assert_array_equal(np.sort(p), np.arange(n))
    for p, q in itertools.combinations(perms, 2):
        assert not np.array_equal(p, q), "different epochs must give different orders"
    np.testing.assert_array_equal(ShardedOrder(n, 8, seed=0).permutation(1), perms[1])
    assert not np.array_equal(ShardedOrder(n, 8, seed=1).permutation(1), perms[1])
    # Not the identity (a shuffle that forgot to shuffle would pass the checks above only
    # if it varied some other way).
    assert not np.array_equal(perms[0], np.arange(n))


def test_unshuffled_order_is_identity_every_epoch() -> None:
    o = ShardedOrder(10, 4, shuffle=False, drop_last=False)
    for e in range(3):
        np.testing.assert_array_equal(np.concatenate(list(o.batches(e))), np.arange(10))


@pytest.mark.parametrize("start", [0, 1, 4, 7])
def test_batches_from_start_are_the_tail(start: int) -> None:
    o = ShardedOrder(30, 4, seed=3, drop_last=False, rank=1, world_size=2)
    full = list(o.batches(5))
    tail = list(o.batches(5, start))
    assert len(tail) == max(0, len(full) - start)
    for x, y in zip(full[start:], tail):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kw", [
    dict(num_samples=0, batch_size=1),
    dict(num_samples=5, batch_size=0),
    dict(num_samples=5, batch_size=1, rank=2, world_size=2),
    dict(num_samples=5, batch_size=1, rank=-1, world_size=2),
    dict(num_samples=5, batch_size=1, world_size=0),
    dict(num_samples=5, batch_size=1, seed=-1),
    dict(num_samples=5, batch_size=6, drop_last=True),
])
def test_bad_arguments_raise(kw: dict) -> None:
    with pytest.raises(ValueError):
        ShardedOrder(**kw)
