"""Epoch order over tar shards: shards split across ranks, samples shuffled in a bounded
buffer. A pure function of (seed, epoch, rank, world size, shard sizes), like
``fastdata.sampler.ShardedOrder`` whose interface it shares, so the Loader's batches,
``len``, ``state_dict`` and resume work unchanged.

Per epoch e:
1. the shards are permuted (seed, e) and dealt round-robin: rank r reads shards
   r, r + W, r + 2W, ... of the permutation (disjoint shards, read start to end);
2. every rank's stream is cut (``drop_last``) or padded by wrapping around its own stream
   (not ``drop_last``) to ``per_rank`` samples, the same on every rank and in every epoch:
   the fewest (most) samples any rank can be dealt, so every rank has the same number of
   batches without communicating;
3. the stream passes through a shuffle buffer of ``shuffle_buffer`` samples (the
   WebDataset buffer: emit a random slot and refill it; it starts emitting a tenth full
   and grows to its size).
A sample's global index (its place in the shard index) keys its crop, so crops do not
depend on the number of ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Tuple

import numpy as np

# (shard, first position in the shard, number of samples): a run of the rank's stream.
Segment = Tuple[int, int, int]


@dataclass(frozen=True)
class ShardOrder:
    shard_counts: Tuple[int, ...]
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = True
    rank: int = 0
    world_size: int = 1
    shuffle_buffer: int = 1000
    _starts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = np.asarray(self.shard_counts, dtype=np.int64)
        object.__setattr__(self, "_starts", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        if self.num_samples < 1:
            raise ValueError("the shards hold no samples")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank} world_size={self.world_size}")
        if self.seed < 0:
            raise ValueError("seed must be non-negative")
        if self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {self.shuffle_buffer}")
        if len(counts) < self.world_size and self.drop_last:
            raise ValueError(f"{len(counts)} shard(s) for {self.world_size} ranks: every rank needs a shard "
                             "(write smaller shards, or drop_last=False to repeat)")
        if self.num_batches == 0:
            raise ValueError(f"{self.per_rank} samples per rank make no batch of {self.batch_size} with drop_last=True")

    @property
    def num_samples(self) -> int:
        return int(self._starts[-1])

    @property
    def per_rank(self) -> int:
        """Samples each rank yields per epoch, whatever shards it is dealt."""
        counts = np.sort(np.asarray(self.shard_counts, dtype=np.int64))
        s, w = len(counts), self.world_size
        if self.drop_last:  # a rank is dealt at least s // w shards: the smallest ones at worst
            return int(counts[:s // w].sum())
        return int(counts[::-1][:-(-s // w)].sum())  # at most ceil(s / w) shards: the largest ones

    @property
    def num_batches(self) -> int:
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def _rng(self, epoch: int, stream: int) -> np.random.Generator:
        return np.random.Generator(np.random.Philox(key=[self.seed, (int(epoch) << 24) ^ stream]))

    def shard_permutation(self, epoch: int) -> np.ndarray:
        n = len(self.shard_counts)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return self._rng(epoch, 0xFFFFFF).permutation(n).astype(np.int64)

    def segments(self, epoch: int) -> List[Segment]:
        """This rank's stream for ``epoch`` as runs of consecutive samples in shards."""
        mine = [int(s) for s in self.shard_permutation(epoch)[self.rank::self.world_size]]
        need, out = self.per_rank, []
        if not mine:  # more ranks than shards (drop_last=False only): wrap over all shards
            mine = [int(s) for s in self.shard_permutation(epoch)]
        while need > 0:
            for s in mine:
                take = min(need, int(self.shard_counts[s]))
                if take:
                    out.append((s, 0, take))
                need -= take
                if need == 0:
                    break
        return out

    def stream_indices(self, epoch: int) -> np.ndarray:
        """Global sample indices of this rank's stream, in read order (int64 [per_rank])."""
        return np.concatenate([np.arange(self._starts[s] + a, self._starts[s] + a + n, dtype=np.int64)
                               for s, a, n in self.segments(epoch)])

    def emit_order(self, epoch: int) -> np.ndarray:
        """Stream positions in the order the shuffle buffer emits them (int64 [per_rank]).
        Position p of the output is read at most ``shuffle_buffer`` samples earlier."""
        n = self.per_rank
        if not self.shuffle or self.shuffle_buffer == 1:
            return np.arange(n, dtype=np.int64)
        size = min(self.shuffle_buffer, n)
        draws = self._rng(epoch, self.rank).random(n)
        # Start emitting at a tenth of the buffer and grow it by one per output (two reads
        # per emit) until full, as WebDataset's shuffle does: the first batch does not wait
        # for the whole buffer to be read.
        nxt = max(1, size // 10)
        buf = list(range(nxt))
        out = np.empty(n, dtype=np.int64)
        for p in range(n):
            for _ in range(2 if len(buf) < size else 1):
                if nxt < n and len(buf) < size:
                    buf.append(nxt)
                    nxt += 1
            j = int(draws[p] * len(buf))
            out[p] = buf[j]
            buf[j] = buf[-1]
            buf.pop()
        return out

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's samples for ``epoch``, in order (global indices, int64 [per_rank])."""
        return self.stream_indices(epoch)[self.emit_order(epoch)]

    def batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        mine = self.rank_indices(epoch)
        for b in range(start, self.num_batches):
            yield mine[b * self.batch_size:(b + 1) * self.batch_size]
