"""What this process may use of the machine: cores and CPU time (no torch, no numpy).

One definition for the library, its tools and the benchmarks, so a thread count, a
"cores busy" figure and a CPU-time column always mean the same thing.
"""
from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    import resource
except ImportError:  # not Unix
    resource = None

import psutil

__all__ = ["usable_cores", "cores_per_local_rank", "process_cpu_seconds", "thread_cpu_seconds",
           "thread_runqueue_seconds", "calling_thread_cpu", "THREAD_CPU_SPLIT"]

# Whether the OS splits a single thread's CPU time into user and kernel time (Linux's
# getrusage(RUSAGE_THREAD)); where it does not, calling_thread_cpu's kernel part means nothing.
THREAD_CPU_SPLIT = resource is not None and hasattr(resource, "RUSAGE_THREAD")


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
    cores = usable_cores()
    raw = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        ranks = int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {raw!r}") from None
    if ranks < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {raw!r}")
    return max(1, cores // ranks)


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


def calling_thread_cpu() -> Tuple[float, float]:
    """The calling thread's CPU seconds so far (``time.thread_time``, exact), and the part of
    them spent in the kernel (``getrusage(RUSAGE_THREAD)``; 0.0 where ``THREAD_CPU_SPLIT`` is
    False). The kernel splits a thread's time by sampling it at each clock tick and scales that
    split to the thread's whole history, so only the sum over many short windows is a fair
    split; on a busy machine, where the ticks undercount a thread's run time, a window's
    difference on a long-lived thread also carries its earlier work's split (the test measures
    on fresh threads for that reason). Take differences over a window."""
    total = time.thread_time()
    return total, resource.getrusage(resource.RUSAGE_THREAD).ru_stime if THREAD_CPU_SPLIT else 0.0


def thread_runqueue_seconds() -> Dict[str, float]:
    """Seconds this process's live threads spent runnable but waiting for a core (the
    kernel's run-queue delay, ``/proc/self/task/*/schedstat``), summed by the labels of
    ``thread_cpu_seconds``. A thread that waits for a lock, an event or the GPU is not
    runnable and does not count: this is contention for cores alone (more runnable threads
    than cores, or threads of higher priority taking them). Take differences over a window,
    as for ``thread_cpu_seconds``. Linux only; empty where the kernel keeps no such figures (no
    schedstat file, or one that reads all zeros: scheduler statistics compiled out)."""
    try:
        with open("/proc/self/schedstat") as f:
            if not any(int(x) for x in f.read().split()):  # this process has run: zeros mean not kept
                return {}
    except (OSError, ValueError):
        return {}
    def waiting(schedstat: str) -> Optional[float]:
        fields = schedstat.split()  # ns on a core, ns waiting on a run queue, timeslices
        return int(fields[1]) / 1e9 if len(fields) >= 2 else None
    return _summed_per_thread("schedstat", waiting)


def thread_minor_faults() -> Dict[str, int]:
    """Minor page faults of this process's live threads, summed by the labels of
    ``thread_cpu_seconds`` (``/proc/self/task/*/stat``): pages touched for the first time since
    the kernel handed them over (fresh memory from malloc, or memory malloc gave back and took
    again), each a trap and a page zeroed by the kernel: up to about 2.6 us each on the 2-core
    box (reading 121 kB files into fresh buffers, forty-third session). Take differences over a
    window, as for ``thread_cpu_seconds``. Linux only (empty elsewhere)."""
    def minflt(stat: str) -> Optional[int]:
        # after the name, which may hold spaces and ')': state, ppid, pgrp, session, tty, tpgid, flags, minflt
        fields = stat.rsplit(")", 1)[-1].split()
        return int(fields[7]) if len(fields) > 7 else None
    return _summed_per_thread("stat", minflt)


def _summed_per_thread(name: str, value: Callable[[str], Optional[float]]) -> Dict[str, Any]:
    """``value`` of each live thread's ``/proc/self/task/<tid>/<name>`` (of the file's text; None
    to skip the thread), summed by the labels of ``thread_cpu_seconds``. Threads
    that end between listing and reading, or lack the file, are left out; empty off Linux."""
    totals: Dict[str, Any] = {}
    try:
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return totals
    for tid, label in _thread_labels(tids).items():
        try:
            with open(f"/proc/self/task/{tid}/{name}") as f:
                v = value(f.read())
        except (OSError, ValueError):
            continue
        if v is not None:
            totals[label] = totals.get(label, 0) + v
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
