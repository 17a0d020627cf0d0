"""Epoch order: which dataset indices each rank's batches hold.

The order of epoch e is a pure function of (seed, e, dataset size): a resumed run or
another rank computes exactly the same permutation without any communication.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class ShardedOrder:
    """``num_samples`` dataset indices split into per-rank batches.

    Every rank yields the same number of batches (DDP never waits on a missing one):
    with ``drop_last`` each rank keeps ``num_samples // world_size`` samples and drops a
    partial last batch; otherwise the permutation is padded by wrapping around (as
    ``DistributedSampler`` does) so each rank holds ``ceil(num_samples / world_size)``,
    and the last batch may be short. Rank r takes positions r, r + world, r + 2 world, ...
    """

    num_samples: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = True
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError("the source is empty")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank} world_size={self.world_size}")
        if self.seed < 0:
            raise ValueError("seed must be non-negative")
        if self.num_batches == 0:
            raise ValueError(f"{self.num_samples} samples over {self.world_size} rank(s) make no batch of "
                             f"{self.batch_size} with drop_last=True")

    @property
    def per_rank(self) -> int:
        if self.drop_last:
            return self.num_samples // self.world_size
        return -(-self.num_samples // self.world_size)

    @property
    def num_batches(self) -> int:
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The whole dataset's order for ``epoch`` (int64)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.Generator(np.random.Philox(key=[self.seed, epoch]))
        return rng.permutation(self.num_samples).astype(np.int64)

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's samples for ``epoch``, in order (int64 [per_rank])."""
        perm = self.permutation(epoch)
        total = self.per_rank * self.world_size
        if total > len(perm):  # pad by wrapping around
            perm = np.concatenate([perm, np.resize(perm, total - len(perm))])
        return perm[self.rank:total:self.world_size][: self.per_rank]

    def batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of ``epoch`` from batch ``start`` on."""
        mine = self.rank_indices(epoch)
        for b in range(start, self.num_batches):
            yield mine[b * self.batch_size:(b + 1) * self.batch_size]
