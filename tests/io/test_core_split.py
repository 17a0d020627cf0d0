"""io.host's division of a process's CPUs for hybrid (split_cores) and the per-thread pins.

Oracles: the kernel's own affinity masks (os.sched_getaffinity of each thread) and the split
rules written out by hand for masks given explicitly.
"""
from __future__ import annotations

import os
import threading

import pytest

from fastdata.io import host
from fastdata.io.host import CoreSplit, pin_current_thread, split_cores, threads_started_on
from fastdata.loader.producer import ProducerThread

linux_masks = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux affinity masks")


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_the_highest_cpus_are_reserved_and_the_rest_go_native(monkeypatch):
    monkeypatch.setattr(host, "_sibling_groups", lambda cpus: [[c] for c in cpus])
    split = split_cores(3, range(16))
    assert split == CoreSplit(gpu_side=(13, 14, 15), native=tuple(range(13)))
    assert split.describe() == "native threads on 0-12, the GPU side on 13-15"
    # a mask with holes (taskset, a cpuset): only its own CPUs, the highest three reserved
    mask = [0, 2, 3, 4, 5, 6, 7, 8, 9, 20, 21, 22, 30]
    assert split_cores(3, mask) == CoreSplit((21, 22, 30), (0, 2, 3, 4, 5, 6, 7, 8, 9, 20))


def test_hyperthread_siblings_are_reserved_together(monkeypatch):
    # 8 cores x 2 threads, Linux's usual numbering: CPU c and c + 8 share a core
    monkeypatch.setattr(host, "_sibling_groups", lambda cpus: [[c, c + 8] for c in cpus if c < 8])
    split = split_cores(3, range(16))
    # whole cores until at least 3 CPUs: cores 7 and 6, both threads of each
    assert split is not None and split.gpu_side == (6, 7, 14, 15)
    assert not set(split.gpu_side) & set(split.native) and len(split.native) == 12


@pytest.mark.parametrize("cpus, reserve", [(range(10), 3), (range(16), 0), (range(4), 1)])
def test_no_split_below_the_native_minimum_or_without_a_reserve(cpus, reserve):
    # range(10) leaves 7 for the native threads, one under MIN_NATIVE_CPUS
    assert split_cores(reserve, cpus) is None


def test_no_split_when_ranks_share_the_node(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # each rank would reserve the same cores
    assert split_cores(3, range(64)) is None


@linux_masks
def test_sibling_groups_cover_the_mask_once():
    usable = sorted(os.sched_getaffinity(0))
    groups = host._sibling_groups(usable)
    assert sorted(c for g in groups for c in g) == usable


@linux_masks
def test_pinning_a_thread_and_giving_its_mask_back():
    usable = sorted(os.sched_getaffinity(0))
    seen = {}

    def worker():
        seen["pinned"] = pin_current_thread(usable[:1])
        seen["mask"] = sorted(os.sched_getaffinity(0))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"pinned": True, "mask": usable[:1]}
    assert sorted(os.sched_getaffinity(0)) == usable  # only that thread
    with threads_started_on(usable[-1:]) as pinned:
        assert pinned and sorted(os.sched_getaffinity(0)) == usable[-1:]
        child = threading.Thread(target=lambda: seen.update(child=sorted(os.sched_getaffinity(0))))
        child.start()  # a thread started in the block takes the block's mask
        child.join()
    assert seen["child"] == usable[-1:]
    assert sorted(os.sched_getaffinity(0)) == usable  # given back
    outside = next(c for c in range(1023, -1, -1) if c not in usable)
    assert not pin_current_thread([outside])
    with threads_started_on([outside]) as pinned:
        assert not pinned
    assert sorted(os.sched_getaffinity(0)) == usable
    assert pin_current_thread(None)


@linux_masks
def test_the_producer_thread_keeps_to_its_cpus():
    usable = sorted(os.sched_getaffinity(0))
    thread = ProducerThread("fastdata-test-producer", cpus=usable[-1:])
    seen = []
    thread.finish_with(lambda: seen.append(sorted(os.sched_getaffinity(0))))
    assert thread.close()
    assert seen == [usable[-1:]] and thread.affinity_held
    refused = ProducerThread("fastdata-test-producer", cpus=[next(c for c in range(1023, -1, -1) if c not in usable)])
    refused.finish_with(lambda: None)
    assert refused.close() and not refused.affinity_held
