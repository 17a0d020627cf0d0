"""The conversion's worker pool: each input processed in forked workers, results in input order."""
from __future__ import annotations

import multiprocessing
import time
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
        try:
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
        finally:
            _drain(pool, inflight)


# How long a pool left early (an error, or a consumer that stopped) waits for its chunks in flight.
DRAIN_SECONDS = 60.0


def _drain(pool, inflight: deque) -> None:
    """Let the workers finish the chunks in flight and exit, so that the ``with`` block's
    ``Pool.terminate`` finds no busy worker. Terminating a worker that is putting its result
    can leave the result queue's lock held, and then ``terminate`` waits for a task-handler
    thread blocked on that lock: a CI run sat ~8 minutes there after a conversion raised
    (2026-12-03; Python's docs warn that a terminated process can break the queues and locks it
    was using). Chunks still running after DRAIN_SECONDS (a worker stuck on a file) are left
    to ``terminate``."""
    pool.close()
    deadline = time.monotonic() + DRAIN_SECONDS
    for pending in inflight:
        pending.wait(max(0.0, deadline - time.monotonic()))
    if all(pending.ready() for pending in inflight):
        pool.join()
