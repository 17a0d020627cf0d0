"""LMDBSource: random access to a cache written by ``fastdata-convert``.

Opens read-only and lock-free, so any number of processes (DDP ranks, their workers)
read one cache at once without a lock file or reader table. The LMDB environment is
opened lazily per process: an environment must not be used across ``fork``, so a child
that inherits this object opens its own on first use (unless views fetched before the fork
are still alive there: see ``_acquire_env``).

``fetch`` returns zero-copy views into the map; each holds its fetch's read transaction and
the environment open (``_ReadLease``), so a view is valid for as long as it is alive.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..cache import format as cf
from ..cache.lmdb_file import check_lmdb_dir
from ..errors import DecodeError
from ..io.host import usable_cores

_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


VERIFY_MODES = ("once", "always", "off")


def verify_mode(verify: Union[bool, str]) -> str:
    """LMDBSource's ``verify`` argument as one of VERIFY_MODES (True: "once", False: "off")."""
    if verify is True:
        return "once"
    if verify is False:
        return "off"
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be True, False or one of {', '.join(map(repr, VERIFY_MODES))}, got {verify!r}")
    return verify


def _hash_pool() -> ThreadPoolExecutor:
    """One process-wide pool for record checksums (made anew in a forked child)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            _POOL = ThreadPoolExecutor(max_workers=usable_cores(), thread_name_prefix="fastdata-sha256")
            _POOL_PID = os.getpid()
        return _POOL

# py-lmdb refuses to open one environment twice in a process, so every LMDBSource of a
# path shares one read-only environment (an _OpenEnv), and so do the views its fetches return.
_ENVS: Dict[str, "_OpenEnv"] = {}
# Held to open, close and look up environments. A hold is dropped without it (list append/pop
# are atomic under the GIL) and a drop that leaves an environment unused closes it only when
# the lock is free at once, else leaves it to the lock's next holder (_UNUSED): drops run in
# finalizers on any thread (a view collected on the Loader's producer thread), and one that
# waited here could wait forever for a thread that holds the lock while a garbage collection
# it triggered finalizes a Loader, which waits for that producer thread.
_ENVS_LOCK = threading.RLock()
_UNUSED: List["_OpenEnv"] = []


class _OpenEnv:
    """One process's read-only, lock-free environment of a cache. It stays open while a source
    holds it (``sources``) or any view of a fetch is alive (``leases``; one item per hold):
    closing it unmaps the file, and a view read after that ends the process with SIGSEGV."""

    __slots__ = ("path", "env", "pid", "sources", "leases")

    def __init__(self, path: str, env: Any):
        self.path, self.env, self.pid = path, env, os.getpid()
        self.sources: List[int] = []
        self.leases: List[int] = []


def _acquire_env(path: str, readahead: bool, max_readers: int) -> _OpenEnv:
    """The process's environment for ``path``, held for a source (first opener's options win)."""
    import lmdb

    with _ENVS_LOCK:
        _close_unused()  # a dropped environment of this path must be closed before it is opened again
        entry = _ENVS.get(path)
        if entry is not None:
            entry.sources.append(1)  # held at once: a view collected meanwhile must not close it under us
            if entry.pid == os.getpid():
                return entry
            # Inherited through fork: the parent's sources never release it here (their holds
            # are not this process's). LMDB wants a child to open its own environment, and
            # py-lmdb opens a second one of the file only once this one is closed.
            entry.sources[:] = [1]
            if not entry.leases:
                entry.env.close()  # unmaps this process's copy only; no view points into it
                del _ENVS[path]
            else:
                # Views fetched before the fork are alive here and point into its map, so it
                # stays open, and this process reads through it. Safe for this environment:
                # lock-free and read-only, it has no lock file, reader table or writer mutex,
                # the state that LMDB's rule against using an environment after fork protects.
                entry.pid = os.getpid()
                return entry
        env = lmdb.open(path, subdir=True, readonly=True, lock=False, readahead=readahead,
                        max_readers=max_readers, max_dbs=0, meminit=False)
        entry = _ENVS[path] = _OpenEnv(path, env)
        entry.sources.append(1)
        return entry


def _release_env(entry: _OpenEnv, *, lease: bool = False) -> None:
    """Drop a source's (or a fetch's views') hold; the last one in the opening process closes
    it, now when the lock is free, else at the lock's next holder. Never waits."""
    (entry.leases if lease else entry.sources).pop()
    if entry.sources or entry.leases or entry.pid != os.getpid():
        return
    _UNUSED.append(entry)
    if _ENVS_LOCK.acquire(blocking=False):
        try:
            _close_unused()
        finally:
            _ENVS_LOCK.release()


def _close_unused() -> None:
    """Close the environments left unused (with _ENVS_LOCK held); one held again meanwhile stays."""
    while _UNUSED:
        entry = _UNUSED.pop()
        if entry.sources or entry.leases or entry.pid != os.getpid() or _ENVS.get(entry.path) is not entry:
            continue
        entry.env.close()
        del _ENVS[entry.path]


def held_open_here(path: str) -> str:
    """Why this process still has the cache at ``path`` open, for the error of another open of
    it (py-lmdb refuses a second one); '' when no LMDBSource or view holds it."""
    with _ENVS_LOCK:
        _close_unused()
        entry = _ENVS.get(os.path.abspath(path))
        if entry is None or entry.pid != os.getpid():
            return ""
        return (f" (this process holds it open: {len(entry.sources)} LMDBSource(s) and the views of "
                f"{len(entry.leases)} fetch(es) are alive, and views keep the cache mapped until they are "
                f"gone; copy what you keep with bytes(view))")


def _after_fork_in_child() -> None:
    global _ENVS_LOCK
    _ENVS_LOCK = threading.RLock()  # a parent thread may have held it at fork time


os.register_at_fork(after_in_child=_after_fork_in_child)


class _ReadLease:
    """One fetch's read transaction, held by every view that fetch returned (through
    ``_RecordBytes.lease``): the transaction, and the environment's map, stay open while any of
    them (or a slice, a memoryview or an array made from one) is alive. Read-only and lock-free,
    an open transaction costs nothing but its small struct, and nothing writes the cache, so
    a view shows its record's bytes for as long as it lives."""

    __slots__ = ("entry", "txn")

    def __init__(self, entry: _OpenEnv):
        txn = entry.env.begin(buffers=True)
        entry.leases.append(1)
        self.entry, self.txn = entry, txn

    def __del__(self) -> None:
        entry = getattr(self, "entry", None)
        if entry is not None:
            self.txn.abort()
            _release_env(entry, lease=True)


class _RecordBytes(np.ndarray):
    """uint8 [n] array over one record in the map; ``lease`` keeps the map open for it. Its
    ``memoryview`` is what ``fetch`` returns: the view's buffer owner is this array, so the
    view (and any slice or array made from it) holds the lease. Python < 3.12 has no
    ``__buffer__`` for a small class of our own; this costs ~1-3 µs a record on the 2-core box
    (a fetch's multi-get ~1.2 µs, a decode ~1 ms)."""

    __slots__ = ("lease",)


def _leased_view(record: memoryview, lease: _ReadLease) -> memoryview:
    arr = np.frombuffer(record, dtype=np.uint8).view(_RecordBytes)
    arr.lease = lease
    return memoryview(arr)


class LMDBSource:
    """Source over a complete fastdata LMDB cache.

    ``fetch`` checks each record against the SHA-256 of its stored bytes that the converter
    wrote (the first time it is read: ``verify="once"``, the default) and returns zero-copy
    read-only ``memoryview``s into the memory-mapped cache (one C-level multi-get per call). A
    view stays valid, and holds its record's bytes, for as long as it (or a slice or array made
    from it) is alive: the views hold their fetch's read transaction and the environment open,
    past the next ``fetch``, ``close()``, the source's own end, and a ``fork``. Copying instead
    cost 40-110 µs per 100 KB sample here (page faults on fresh allocations), which throttled
    a 16-thread engine; a view costs a few µs.

    Args:
        path: the cache directory (DST of fastdata-convert).
        readahead: OS readahead on the memory map. False (default) suits shuffled random
            access on caches larger than RAM; True suits sequential scans.
        max_readers: LMDB reader slots (unused without a lock file, kept high for safety).
        verify: check records against the SHA-256 of their stored bytes. A record that fails
            comes back as a ``DecodeError`` naming its index and key in the place of its bytes,
            which the engine reports as that sample's failure (so ``on_error`` raises or skips
            and counts it). ``"once"`` (the default; ``True`` means the same): each record is
            hashed the first time it is fetched through this source's memory map, and a record
            that passed is not hashed again while that map is open (the cache is complete and
            read-only, so its bytes cannot change under a reader; a record that failed is
            checked, and fails, on every fetch). ``"always"``: every fetch hashes every record
            again. ``False`` (or ``"off"``): no check.
            Cost: one SHA-256 per record, 84 µs of CPU for a 119 KB photo-like 500x375 JPEG
            on the 2-core box (OpenSSL with SHA-NI, 1.4 GB/s; 2026-12-02), about 10% of the
            same record's restart-indexed RandomResizedCrop(224) decode; a batch's records hash
            on a thread pool with the GIL released (benchmarks/bench_cache_checksum.py). With ``"always"`` the Loader paid that every epoch, and
            on the producer thread before each batch's decode: on the 2-core box it held the
            Loader at 0.80-0.84x of ``decode_batch`` on the same records; with ``"once"`` only the
            first epoch pays it (benchmarks/bench_loader_overhead.py, docs/results.md).
            Caches written before the stored-bytes checksum existed are checked only for
            records stored as the source's bytes (``checked`` says which).

    Raises:
        fastdata.cache.format.CacheFormatError: incomplete, newer-format or damaged cache,
            including a ``data.mdb`` cut shorter than its LMDB meta pages say (checked
            before mapping it, which would otherwise end the process with SIGBUS).
        FileNotFoundError: no cache at ``path``.
    """

    def __init__(self, path: str, *, readahead: bool = False, max_readers: int = 4096,
                 verify: Union[bool, str] = "once"):
        import lmdb

        self.path = os.path.abspath(path)
        self.readahead = readahead
        self.max_readers = max_readers
        self.verify = verify_mode(verify)
        check_lmdb_dir(self.path)  # before LMDB maps the file: a truncated one would SIGBUS
        self._opened: Optional[_OpenEnv] = None
        self._pid = -1
        try:
            opened = _acquire_env(self.path, readahead, max_readers)
        except lmdb.Error as exc:
            raise cf.CacheFormatError(f"{self.path}: LMDB cannot open it: {exc}") from None
        try:
            with opened.env.begin(buffers=False) as txn:
                self.meta: Dict[str, Any] = cf.check_complete(txn.get(cf.COMPLETE_KEY), txn.get(cf.META_KEY), self.path)
                n = self.meta["count"]
                self._labels = cf.unpack_labels(txn.get(cf.LABELS_KEY) or b"", n, self.path)
                self._paths_blob = txn.get(cf.PATHS_KEY) or b""
                self._sha = txn.get(cf.SHA256_KEY) or b""
                stored_sha = txn.get(cf.STORED_SHA256_KEY)
                reenc = txn.get(cf.REENCODED_KEY) or b""
        except lmdb.Error as exc:
            raise cf.CacheFormatError(f"{self.path}: LMDB cannot read it: {exc}") from None
        finally:
            # Not kept: the process that builds the source is often not the one that reads it.
            _release_env(opened)
        if len(self._sha) != cf.SHA256_SIZE * n or len(reenc) != n:
            raise cf.CacheFormatError(f"{self.path}: checksum or reencoded array does not hold {n} entries")
        if stored_sha is not None and len(stored_sha) != cf.SHA256_SIZE * n:
            raise cf.CacheFormatError(f"{self.path}: stored-bytes checksum array does not hold {n} entries")
        self._n = n
        self.classes: List[str] = list(self.meta["classes"])
        stored_as = np.frombuffer(reenc, dtype=np.uint8)
        # reencoded: lossy (decoded and re-encoded); transcoded: lossless progressive -> baseline;
        # restart_indexed: a baseline JPEG rewritten losslessly with a restart index (format 2).
        # In each case the stored bytes are not the source file's (its sha256 does not match them).
        self.reencoded = stored_as == cf.STORED_REENCODED
        self.transcoded = stored_as == cf.STORED_TRANSCODED
        # The checksum each record's stored bytes must have; older caches have one only for
        # records stored as the source's bytes (the others then go unchecked).
        self._record_sha = stored_sha if stored_sha is not None else self._sha
        self.checked = np.ones(n, dtype=bool) if stored_sha is not None else stored_as == cf.STORED_ORIGINAL
        # verify="once": records whose bytes passed their check through the current memory map;
        # made (empty) by _env whenever the environment is opened anew: another process, another map.
        self._verified: Optional[np.ndarray] = None
        self.restart_indexed = stored_as == cf.STORED_RESTART_INDEXED
        self.total_bytes = int(self.meta["bytes_out"])
        self._paths: Optional[List[str]] = None
        if self._labels.size and (self._labels.min() < 0 or self._labels.max() >= len(self.classes)):
            raise cf.CacheFormatError(f"{self.path}: labels out of range for {len(self.classes)} classes")

    # ---------------------------------------------------------------- environment per process
    def _env(self) -> _OpenEnv:
        pid = os.getpid()
        if self._opened is None or self._pid != pid:
            self._opened = _acquire_env(self.path, self.readahead, self.max_readers)
            self._pid = pid
            self._verified = np.zeros(self._n, dtype=bool)  # checks passed through another map do not count
        return self._opened

    def close(self) -> None:
        """Release this source's hold on the environment, which closes when no source and no
        fetched view uses it (views already returned stay valid). While it is open, this
        process cannot open the cache again otherwise (py-lmdb refuses it, fastdata-convert's
        ``resume`` included), and nothing can write to what the views show."""
        if self._opened is not None and self._pid == os.getpid():
            _release_env(self._opened)
        self._opened = None

    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:
        if getattr(self, "_opened", None) is not None:
            try:
                self.close()
            except (AttributeError, TypeError):
                # Collected while the interpreter shuts down, when this module's globals (os,
                # the environment registry) may already be None: the process is ending and the
                # OS unmaps the environment; printing "Exception ignored" would only alarm.
                if not _finalizing():
                    raise

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_opened"] = None
        state["_pid"] = -1
        state["_verified"] = None  # checks passed here do not travel
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)  # _opened is None: the first fetch opens the map and resets _verified

    # ---------------------------------------------------------------- Source protocol
    def __len__(self) -> int:
        return self._n

    @property
    def labels(self) -> np.ndarray:
        """int64 [N] class indices (read-only view)."""
        view = self._labels.view()
        view.flags.writeable = False
        return view

    def source_path(self, index: int) -> str:
        """Path of sample ``index``'s source file relative to ``meta['source']['root']``."""
        if self._paths is None:
            self._paths = cf.unpack_paths(self._paths_blob, self._n, self.path)
        return self._paths[self._check(index)]

    def sha256(self, index: int) -> bytes:
        """SHA-256 (32 bytes) of sample ``index``'s source file bytes."""
        i = self._check(index)
        return self._sha[i * cf.SHA256_SIZE:(i + 1) * cf.SHA256_SIZE]

    def stored_sha256(self, index: int) -> bytes:
        """SHA-256 (32 bytes) that sample ``index``'s stored record is checked against on fetch
        (the source's for format-1 caches, which store no separate one)."""
        i = self._check(index)
        return self._record_sha[i * cf.SHA256_SIZE:(i + 1) * cf.SHA256_SIZE]

    def name(self, index: int) -> str:
        return f"{self.path}[{index}] ({self.source_path(index)})"

    def _check(self, index: int) -> int:
        i = int(index)
        if not 0 <= i < self._n:
            raise IndexError(f"sample index {index} out of range for {self._n} samples in {self.path}")
        return i

    def fetch(self, indices: Sequence[int]) -> List[memoryview]:
        """Encoded bytes of each sample in ``indices``, in order, as zero-copy read-only views,
        valid for as long as they are alive (see the class docstring)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            bad = idx[(idx < 0) | (idx >= self._n)][0]
            raise IndexError(f"sample index {bad} out of range for {self._n} samples in {self.path}")
        order = idx.tolist()
        if not order:
            return []
        keys = list(map(cf.sample_key, order))
        lease = _ReadLease(self._env())
        # getmulti loops in C; order and duplicates follow ``keys``
        pairs = lease.txn.cursor().getmulti(keys)
        if len(pairs) != len(keys):
            got = {bytes(k) for k, _ in pairs}
            missing = [int.from_bytes(k, "big") for k in keys if k not in got]
            raise cf.CacheFormatError(f"{self.path}: record(s) {missing[:8]} missing from a complete cache")
        views: List[Any] = [_leased_view(v, lease) for _, v in pairs]
        if self.verify == "off":
            return views
        rows = range(len(order))
        if self.verify == "once":
            rows = np.flatnonzero(self.checked[idx] & ~self._verified[idx]).tolist()
        if rows:
            # hashlib releases the GIL for large inputs: a batch's records hash on all cores at
            # once, so the check costs the fetch about 1/cores of its serial time.
            checked = _hash_pool().map(self._checked, [order[r] for r in rows], [views[r] for r in rows])
            for r, item in zip(rows, checked):
                views[r] = item
        return views

    def _checked(self, index: int, view: memoryview) -> Any:  # on a _hash_pool thread
        """``view``, or a DecodeError naming the record when its bytes fail their SHA-256."""
        if not self.checked[index]:
            return view
        expected = self._record_sha[index * cf.SHA256_SIZE:(index + 1) * cf.SHA256_SIZE]
        if hashlib.sha256(view).digest() == expected:  # hashlib releases the GIL for large inputs
            self._verified[index] = True
            return view
        return DecodeError(f"cache record {cf.sample_key(index).hex()} fails its SHA-256 checksum: the cache "
                           f"file is damaged (re-copy it, or rebuild it with fastdata-convert)",
                           index=index, name=self.name(index))

    @property
    def skipped(self) -> List[Dict[str, str]]:
        """Inputs left out by ``--on-error skip``: ``[{"path", "reason"}]``."""
        return list(self.meta["skipped"])

    def __repr__(self) -> str:
        return f"LMDBSource({self.path!r}, {self._n} samples, {len(self.classes)} classes)"
