"""LMDBSource: random access to a cache written by ``fastdata-convert``.

Opens read-only and lock-free, so any number of processes (DDP ranks, their workers)
read one cache at once without a lock file or reader table. The LMDB environment is
opened lazily per process: an environment must not be used across ``fork``, so a child
that inherits this object opens its own on first use.
"""
from __future__ import annotations

import hashlib
import os
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
# path shares one read-only environment: path -> [env, users, pid that opened it].
_ENVS: Dict[str, List[Any]] = {}
_ENVS_LOCK = threading.RLock()  # re-entrant: a GC-run __del__ may release while acquiring


def _acquire_env(path: str, readahead: bool, max_readers: int) -> Any:
    """The process's read-only, lock-free environment for ``path`` (first opener's options win)."""
    import lmdb

    with _ENVS_LOCK:
        entry = _ENVS.get(path)
        if entry is not None and entry[2] != os.getpid():
            # Inherited through fork: LMDB forbids using it here; closing the child's copy
            # only unmaps it in this process and lets this process open its own.
            entry[0].close()
            entry = None
        if entry is None:
            env = lmdb.open(path, subdir=True, readonly=True, lock=False, readahead=readahead,
                            max_readers=max_readers, max_dbs=0, meminit=False)
            entry = _ENVS[path] = [env, 0, os.getpid()]
        entry[1] += 1
        return entry[0]


def _release_env(path: str) -> None:
    with _ENVS_LOCK:
        entry = _ENVS.get(path)
        if entry is None or entry[2] != os.getpid():
            return
        entry[1] -= 1
        if entry[1] <= 0:
            entry[0].close()
            del _ENVS[path]


def _after_fork_in_child() -> None:
    global _ENVS_LOCK
    _ENVS_LOCK = threading.RLock()  # a parent thread may have held it at fork time


os.register_at_fork(after_in_child=_after_fork_in_child)


class LMDBSource:
    """Source over a complete fastdata LMDB cache.

    ``fetch`` checks each record against the SHA-256 of its stored bytes that the converter
    wrote (the first time it is read: ``verify="once"``, the default) and returns zero-copy
    ``memoryview``s into the memory-mapped cache (one C-level multi-get per call). They stay valid until the next ``fetch`` on the same thread or
    ``close()``: the read transaction that holds them stays open until then. The Loader
    decodes a batch right after fetching it, on the same thread; anyone who keeps samples
    longer copies them (``bytes(view)``). Copying cost 40-110 µs per 100 KB sample here
    (page faults on fresh allocations), which throttled a 16-thread engine; a view costs ~1 µs.

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
        self._env: Any = None
        self._pid = -1
        self._reader = threading.local()  # per thread: the read txn behind the last fetch's views
        try:
            env = _acquire_env(self.path, readahead, max_readers)
        except lmdb.Error as exc:
            raise cf.CacheFormatError(f"{self.path}: LMDB cannot open it: {exc}") from None
        try:
            with env.begin(buffers=False) as txn:
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
            _release_env(self.path)
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
        # verify="once": records whose bytes passed their check through the current memory map
        # (reset whenever the environment is opened anew: another process, another map).
        self._verified = np.zeros(n, dtype=bool)
        self.restart_indexed = stored_as == cf.STORED_RESTART_INDEXED
        self.total_bytes = int(self.meta["bytes_out"])
        self._paths: Optional[List[str]] = None
        if self._labels.size and (self._labels.min() < 0 or self._labels.max() >= len(self.classes)):
            raise cf.CacheFormatError(f"{self.path}: labels out of range for {len(self.classes)} classes")

    # ---------------------------------------------------------------- environment per process
    def _txn_env(self) -> Any:
        pid = os.getpid()
        if self._env is None or self._pid != pid:
            self._env = _acquire_env(self.path, self.readahead, self.max_readers)
            self._pid = pid
            self._reader = threading.local()  # transactions never cross a fork
            self._verified = np.zeros(self._n, dtype=bool)  # checks passed through another map do not count
        return self._env

    def close(self) -> None:
        """Release this source's hold on the environment (closed when no source uses it).
        Views returned by this thread's last ``fetch`` end here."""
        if self._env is not None and self._pid == os.getpid():
            self._end_read()
            _release_env(self.path)
        self._env = None

    def __del__(self) -> None:
        if getattr(self, "_env", None) is not None:
            self.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_env"] = None
        state["_pid"] = -1
        del state["_reader"]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reader = threading.local()
        self._verified = np.zeros(self._n, dtype=bool)  # unpickled elsewhere: another copy of the cache, maybe

    def _end_read(self) -> None:
        txn = getattr(self._reader, "txn", None)
        if txn is not None:
            self._reader.txn = None
            txn.abort()

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

    def name(self, index: int) -> str:
        return f"{self.path}[{index}] ({self.source_path(index)})"

    def _check(self, index: int) -> int:
        i = int(index)
        if not 0 <= i < self._n:
            raise IndexError(f"sample index {index} out of range for {self._n} samples in {self.path}")
        return i

    def fetch(self, indices: Sequence[int]) -> List[memoryview]:
        """Encoded bytes of each sample in ``indices``, in order, as zero-copy views valid
        until this thread's next ``fetch`` or ``close()`` (see the class docstring)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            bad = idx[(idx < 0) | (idx >= self._n)][0]
            raise IndexError(f"sample index {bad} out of range for {self._n} samples in {self.path}")
        order = idx.tolist()
        keys = list(map(cf.sample_key, order))
        env = self._txn_env()
        self._end_read()
        txn = env.begin(buffers=True)
        self._reader.txn = txn
        # getmulti loops in C; order and duplicates follow ``keys``
        pairs = txn.cursor().getmulti(keys)
        if len(pairs) != len(keys):
            got = {bytes(k) for k, _ in pairs}
            missing = [int.from_bytes(k, "big") for k in keys if k not in got]
            raise cf.CacheFormatError(f"{self.path}: record(s) {missing[:8]} missing from a complete cache")
        views: List[Any] = [v for _, v in pairs]
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
