"""The conversion's worker pool: each input processed in forked workers, results in input order."""
from __future__ import annotations

import multiprocessing
from collections import deque
from typing import Iterator, Optional, Sequence, Tuple

from .records import Result, process_one, worker_chunk, worker_init


def processed_in_order(todo: Sequence[Tuple[int, str]], workers: int, max_side: Optional[int], quality: int,
                       keep_progressive: bool) -> Iterator[Result]:
    """:func:`process_one` of each ``(position, path)`` in ``todo``, yielded in that order
    (``workers`` forked processes; a bounded look-ahead keeps memory flat). Used by the
    LMDB writer and by ``--format tar``."""
    if workers <= 1:
        for pos, path in todo:
            yield process_one(pos, path, max_side, quality, keep_progressive)
        return
    chunk = max(1, min(32, len(todo) // (workers * 8) or 1))
    chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
    # fork: workers need only this module; forking is ~ms where spawn re-imports numpy.
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=worker_init, initargs=(max_side, quality, keep_progressive)) as pool:
        inflight: deque = deque()
        it = iter(chunks)
        for c in it:
            inflight.append(pool.apply_async(worker_chunk, (c,)))
            if len(inflight) >= workers * 4:
                break
        while inflight:
            results = inflight.popleft().get()
            nxt = next(it, None)
            if nxt is not None:
                inflight.append(pool.apply_async(worker_chunk, (nxt,)))
            yield from results
