"""Prefetch across epoch boundaries: while epoch e is consumed, the producer already decodes
the first batches of the epoch the next iteration yields, so short epochs do not drain the
pipeline; what the user sees (batches, order, resume, set_epoch) is unchanged.

Observed through an instrumented source (which batches were fetched, and how often), never
through timing: waits below are deadlines for a hang, not measurements.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np
import pytest
import torch

import fastdata
from fastdata.cli.demo import photo_like_jpeg

N, B = 12, 4  # three batches per epoch
DEADLINE_S = 60.0


class RecordingSource(fastdata.FileList):
    """A FileList that records every fetch (as a tuple of dataset indices)."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int]):
        super().__init__(paths, labels)
        self.fetched: List[Tuple[int, ...]] = []
        self._changed = threading.Condition()

    def fetch(self, indices):
        with self._changed:
            self.fetched.append(tuple(int(i) for i in indices))
            self._changed.notify_all()
        return super().fetch(indices)

    def wait_for(self, batch: Sequence[int]) -> bool:
        """Block until ``batch`` has been fetched (False after the deadline)."""
        key = tuple(int(i) for i in batch)
        with self._changed:
            return self._changed.wait_for(lambda: key in self.fetched, timeout=DEADLINE_S)

    def wait_fetches(self, n: int) -> bool:
        """Block until ``n`` fetches have happened (False after the deadline)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.fetched) >= n, timeout=DEADLINE_S)

    def wait_for_count(self, batch: Sequence[int], n: int) -> bool:
        """Block until ``batch`` has been fetched ``n`` times (False after the deadline)."""
        key = tuple(int(i) for i in batch)
        with self._changed:
            return self._changed.wait_for(lambda: self.fetched.count(key) >= n, timeout=DEADLINE_S)

    def count(self, batch: Sequence[int]) -> int:
        key = tuple(int(i) for i in batch)
        with self._changed:
            return self.fetched.count(key)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> List[str]:
    root = tmp_path_factory.mktemp("epochs")
    out = []
    for i in range(N):
        p = root / f"{i:02d}.jpg"
        p.write_bytes(photo_like_jpeg(9, i, 64 + 2 * i, 48))
        out.append(str(p))
    return out


def make(paths: List[str], **kw) -> Tuple[fastdata.Loader, RecordingSource]:
    source = RecordingSource(paths, [i % 3 for i in range(len(paths))])
    cfg = dict(batch_size=B, transform=fastdata.RandomResizedCrop(24), seed=11, threads=2, device="cpu",
               dtype=torch.uint8, prefetch=3)
    cfg.update(kw)
    return fastdata.Loader(source, **cfg), source


def reference(paths: List[str], epoch: int, start: int = 0) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Epoch ``epoch`` from batch ``start`` from a fresh loader that never saw another epoch."""
    loader, _ = make(paths)
    with loader:
        state = loader.state_dict()
        state.update(epoch=epoch, batch=start)
        loader.load_state_dict(state)
        return [(x.clone(), y.clone()) for x, y in loader]


def assert_batches_equal(got, want) -> None:
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_next_epoch_is_decoded_before_this_one_is_exhausted(paths):
    loader, source = make(paths)
    with loader:
        next_epoch = list(loader.order.batches(1))
        it = iter(loader)
        first = [(x.clone(), y.clone()) for x, y in [next(it), next(it)]]
        # The queue now has room for epoch 0's last batch, its end and epoch 1's first batch.
        # The producer fetches epoch 1's second batch only after it decoded and queued the
        # first: both happen while epoch 0 still has a batch to hand out.
        assert source.wait_for(next_epoch[1]), "epoch 1 was not prefetched while epoch 0 was consumed"
        assert len(it) == 1 and not it.exhausted
        rest = [(x.clone(), y.clone()) for x, y in it]
        epoch1 = [(x.clone(), y.clone()) for x, y in loader]  # the implied next epoch, adopted
        # Each of epoch 1's batches was fetched (and decoded) exactly once: the lookahead was used.
        assert all(source.count(b) == 1 for b in next_epoch)
        assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["batch"] == 0
    assert_batches_equal(first + rest, reference(paths, 0))
    assert_batches_equal(epoch1, reference(paths, 1))


def test_set_epoch_to_the_next_epoch_adopts_and_to_another_drops_the_lookahead(paths):
    loader, source = make(paths)
    with loader:
        loader.set_epoch(4)
        got4 = [(x.clone(), y.clone()) for x, y in loader]
        epoch5 = list(loader.order.batches(5))
        assert source.wait_for(epoch5[0])
        loader.set_epoch(5)  # the lookahead's epoch: its batches are used
        got5 = [(x.clone(), y.clone()) for x, y in loader]
        assert all(source.count(b) == 1 for b in epoch5)
        assert source.wait_for(list(loader.order.batches(6))[0])
        loader.set_epoch(9)  # not the lookahead's epoch: it is dropped, epoch 9 is produced
        got9 = [(x.clone(), y.clone()) for x, y in loader]
    assert_batches_equal(got4, reference(paths, 4))
    assert_batches_equal(got5, reference(paths, 5))
    assert_batches_equal(got9, reference(paths, 9))


def test_resume_and_early_exit_are_unchanged(paths):
    loader, source = make(paths)
    with loader:
        for x, y in loader:  # epoch 0, fully
            pass
        it = iter(loader)  # epoch 1, adopted from the lookahead
        next(it)
        state = loader.state_dict()
        assert (state["epoch"], state["batch"]) == (1, 1)
        next(it)
        del it  # left early: the lookahead of epoch 2 is dropped, the next iteration is epoch 2
        got2 = [(x.clone(), y.clone()) for x, y in loader]
        assert loader.state_dict()["epoch"] == 3
    resumed, _ = make(paths)
    with resumed:
        resumed.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert_batches_equal(rest, reference(paths, 1, 1))
    assert_batches_equal(got2, reference(paths, 2))


def test_one_batch_epochs_keep_the_pipeline_fed(paths):
    """Epochs of a single batch: each epoch is fetched (and decoded) before it is asked for,
    and exactly once."""
    loader, source = make(paths[:B], prefetch=2)
    with loader:
        seen = []
        for e in range(6):
            seen.append([(x.clone(), y.clone()) for x, y in loader])
            # epoch e + 1's batch is fetched while nobody has asked for it yet
            assert source.wait_fetches(e + 2)
        assert len(source.fetched) == 7  # epochs 0-5 and the lookahead of 6: nothing fetched twice
    for e, got in enumerate(seen):
        want_loader, _ = make(paths[:B], prefetch=2)
        with want_loader:
            want_loader.set_epoch(e)
            want = [(x.clone(), y.clone()) for x, y in want_loader]
        assert_batches_equal(got, want)


def test_an_epoch_consumed_without_its_stop_iteration_still_hands_over(paths):
    """``for step in range(len(loader)): next(it)`` never sees StopIteration: the next
    iteration still takes the prefetched epoch, and the old iterator is over."""
    loader, source = make(paths)
    with loader:
        it = iter(loader)
        first = [next(it)[1].clone() for _ in range(len(loader))]
        assert it.exhausted
        epoch1 = list(loader.order.batches(1))
        assert source.wait_for(epoch1[0])
        second = [y.clone() for _, y in loader]
        assert all(source.count(b) == 1 for b in epoch1)
        with pytest.raises(StopIteration):
            next(it)
        del it
        third = [y.clone() for _, y in loader]  # the dropped, exhausted iterator stopped nothing
    for e, got in enumerate((first, second, third)):
        assert [y.tolist() for y in got] == [y.tolist() for _, y in reference(paths, e)]


def test_set_epoch_between_epochs_starts_that_epoch_before_iter(paths):
    """The evaluation pattern, ``set_epoch(0)`` before every pass: the producer begins the
    asked-for epoch at ``set_epoch``, and ``iter()`` takes those batches."""
    loader, source = make(paths)
    with loader:
        first = list(loader.order.batches(0))[0]
        assert all(tuple(b) != tuple(first) for b in loader.order.batches(1))  # told apart from the lookahead
        passes = []
        for k in range(3):
            loader.set_epoch(0)
            if k:
                assert source.wait_for_count(first, k + 1), "set_epoch did not start the epoch"
            passes.append([(x.clone(), y.clone()) for x, y in loader])
        assert source.count(first) == 3  # once per pass: every prefetched pass was used
    want = reference(paths, 0)
    for got in passes:
        assert_batches_equal(got, want)


def test_set_epoch_mid_epoch_redirects_the_lookahead(paths):
    loader, source = make(paths)
    with loader:
        loader.set_epoch(3)
        it = iter(loader)
        loader.set_epoch(7)  # while epoch 3 runs: the producer goes on into 7, not 4
        got3 = [(x.clone(), y.clone()) for x, y in it]
        epoch7 = list(loader.order.batches(7))
        assert source.wait_for(epoch7[0])
        got7 = [(x.clone(), y.clone()) for x, y in loader]
        assert all(source.count(b) == 1 for b in epoch7)
        assert source.count(list(loader.order.batches(4))[0]) == 0
        assert loader.state_dict()["epoch"] == 8
    assert_batches_equal(got3, reference(paths, 3))
    assert_batches_equal(got7, reference(paths, 7))


def test_stats_count_an_epochs_failures_not_the_lookaheads(paths, tmp_path):
    """A failure decoded ahead for the next epoch counts only when that batch is received:
    stats() after an epoch holds that epoch's failures (before the fix: both epochs')."""
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff" + bytes(range(256)) * 8)  # a JPEG start, then garbage
    files = [str(bad)] + paths[1:]
    loader, source = make(files, shuffle=False, on_error="skip")
    with loader, pytest.warns(RuntimeWarning, match="replaced an undecodable sample"):
        for _ in loader:
            pass
        # The lookahead has decoded epoch 1's first batch (the failing one) once it fetches
        # epoch 1's second batch: the native decoder finishes a batch before starting the next.
        assert source.wait_for_count(range(B, 2 * B), 2)
        assert loader.stats().failures == 1
        for _ in loader:
            pass
        assert loader.stats().failures == 2
