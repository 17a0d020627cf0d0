"""What this process may use of the machine: cores and CPU time (no torch, no numpy).

One definition for the library, its tools and the benchmarks, so a thread count, a
"cores busy" figure and a CPU-time column always mean the same thing.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import psutil

__all__ = ["usable_cores", "cores_per_local_rank", "process_cpu_seconds", "thread_cpu_seconds",
           "thread_runqueue_seconds", "CoreSplit", "split_cores", "pin_current_thread", "threads_started_on"]


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask where the OS reports one
    (a container or ``taskset`` limit), else every core; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def cores_per_local_rank() -> int:
    """This process's share of ``usable_cores()`` when several ranks of a job run on the node:
    split evenly among them (``LOCAL_WORLD_SIZE``, which torchrun sets; 1 when unset), at
    least 1. Without the split every rank's Loader would start a thread per core, N ranks x
    all cores.

    The affinity mask is taken as shared by the node's ranks (torchrun's default, and a
    container's or job step's cpuset). A launcher that pins each rank to cores of its own
    *and* sets LOCAL_WORLD_SIZE (torchrun's NUMA binding, numactl wrappers) makes the mask
    the rank's share already, and this splits it again: pass ``threads=`` there. Without
    LOCAL_WORLD_SIZE (srun per rank) the mask is used whole."""
    return max(1, usable_cores() // _local_ranks())


def _local_ranks() -> int:
    raw = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        ranks = int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {raw!r}") from None
    if ranks < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {raw!r}")
    return ranks


@dataclass(frozen=True)
class CoreSplit:
    """The CPUs of one process divided between the threads that feed a GPU (``gpu_side``) and
    the native decode threads (``native``), so that the first never preempt the second."""

    gpu_side: Tuple[int, ...]
    native: Tuple[int, ...]

    def describe(self) -> str:
        return f"native threads on {_ranges(self.native)}, the GPU side on {_ranges(self.gpu_side)}"


# split_cores leaves the CPUs as they are below this many for the native threads: the split was
# measured on 16 cores only, and on a small box the reserved ones would idle a large part of it.
MIN_NATIVE_CPUS = 8


def split_cores(reserve: int, cpus: Optional[Iterable[int]] = None) -> Optional[CoreSplit]:
    """``reserve`` CPUs (whole physical cores: a core's hyperthread siblings go together) for
    the GPU side, the rest of ``cpus`` (default: this process's affinity mask) for the native
    threads; the reserved ones are the highest-numbered. None where no split is made: reserve
    < 1, fewer than MIN_NATIVE_CPUS would be left, several ranks share the node
    (``LOCAL_WORLD_SIZE`` > 1: each would reserve the same cores), or no affinity mask (not
    Linux)."""
    if reserve < 1 or _local_ranks() > 1:
        return None
    if cpus is None:
        try:
            cpus = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            return None
    usable = sorted(set(cpus))
    gpu_side: List[int] = []
    for group in reversed(_sibling_groups(usable)):
        if len(gpu_side) >= reserve:
            break
        gpu_side.extend(group)
    native = [c for c in usable if c not in gpu_side]
    if len(native) < MIN_NATIVE_CPUS:
        return None
    return CoreSplit(tuple(sorted(gpu_side)), tuple(native))


def _sibling_groups(cpus: Sequence[int]) -> List[List[int]]:
    """``cpus`` grouped by physical core (sysfs' thread_siblings_list; a CPU it does not
    describe is its own group), in the order of each group's lowest CPU."""
    wanted, seen, groups = set(cpus), set(), []
    for cpu in cpus:
        if cpu in seen:
            continue
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                siblings = _parse_cpu_list(f.read())
        except (OSError, ValueError):
            siblings = {cpu}
        group = sorted((siblings & wanted) | {cpu})
        seen.update(group)
        groups.append(group)
    return groups


def _parse_cpu_list(text: str) -> set:
    """The kernel's CPU list format: "0,8" or "0-3,8-11"."""
    out = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _ranges(cpus: Sequence[int]) -> str:
    """CPU numbers as the kernel writes them: 0-2,5."""
    runs: List[List[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def pin_current_thread(cpus: Optional[Sequence[int]]) -> bool:
    """Keeps the calling thread to ``cpus`` (Linux: the affinity mask is per thread). True
    on success or for None; False where the OS refused, and the thread runs where it did."""
    if cpus is None:
        return True
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError, ValueError):
        return False
    return True


@contextlib.contextmanager
def threads_started_on(cpus: Optional[Sequence[int]]) -> Iterator[bool]:
    """The calling thread kept to ``cpus`` inside the block and given its own CPUs back after
    it: the threads a library starts in the block (they take their creator's mask) keep to
    ``cpus``. Yields whether the pin held (True for None)."""
    if cpus is None:
        yield True
        return
    try:
        before = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        yield False
        return
    pinned = pin_current_thread(cpus)
    try:
        yield pinned
    finally:
        if pinned:
            os.sched_setaffinity(0, before)


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its child processes (DataLoader
    workers): live children (read from each, recursively) plus those already reaped.

    A child that exits between being listed and being read is left out: take differences
    over a window in which the workers stay alive.
    """
    proc = psutil.Process()
    own = proc.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            t = child.cpu_times()
        except psutil.Error:  # a worker exiting between listing and reading
            continue
        total += t.user + t.system
    return total


def thread_cpu_seconds() -> Dict[str, float]:
    """User + system CPU seconds of this process's live threads, summed by what they are:
    a Python thread by its name (suffixes such as a pool's ``_0`` or an object id dropped,
    so a pool is one entry), a native thread (the decode engine's, CUDA's, a codec library's, torch's
    intra-op threads) by its OS name. Threads that ended are not counted: take differences
    over a window in which the loader's threads stay alive. Linux only (empty elsewhere)."""
    totals: Dict[str, float] = {}
    try:
        threads = psutil.Process().threads()
    except (psutil.Error, AttributeError):
        return totals
    labels = _thread_labels([t.id for t in threads])
    for t in threads:
        if t.id in labels:
            totals[labels[t.id]] = totals.get(labels[t.id], 0.0) + t.user_time + t.system_time
    return totals


def thread_runqueue_seconds() -> Dict[str, float]:
    """Seconds this process's live threads spent runnable but waiting for a core (the
    kernel's run-queue delay, ``/proc/self/task/*/schedstat``), summed by the labels of
    ``thread_cpu_seconds``. A thread that waits for a lock, an event or the GPU is not
    runnable and does not count: this is contention for cores alone (more runnable threads
    than cores, or threads of higher priority taking them). Take differences over a window,
    as for ``thread_cpu_seconds``. Linux only; empty where the kernel keeps no such figures (no
    schedstat file, or one that reads all zeros: scheduler statistics compiled out)."""
    totals: Dict[str, float] = {}
    try:
        with open("/proc/self/schedstat") as f:
            if not any(int(x) for x in f.read().split()):  # this process has run: zeros mean not kept
                return totals
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return totals
    labels = _thread_labels(tids)
    for tid, label in labels.items():
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                fields = f.read().split()  # ns on a core, ns waiting on a run queue, timeslices
        except OSError:
            continue  # ended between listing and reading, or no schedstat in this kernel
        if len(fields) >= 2:
            totals[label] = totals.get(label, 0.0) + int(fields[1]) / 1e9
    return totals


def _thread_labels(tids: List[int]) -> Dict[int, str]:
    """What each thread is (see ``thread_cpu_seconds``), by native thread id; threads that
    ended before their OS name was read are left out."""
    python_names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    labels: Dict[int, str] = {}
    for tid in tids:
        name = python_names.get(tid)
        if name is not None:
            labels[tid] = "py:" + re.sub(r"(_\d+|-[0-9a-f]{8,})$", "", name)
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                labels[tid] = f.read().strip() or "?"
        except OSError:
            continue  # ended between listing and reading
    return labels
