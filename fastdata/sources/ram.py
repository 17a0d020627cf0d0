"""RAMCache: every sample's encoded bytes in one buffer, shared by all processes of a node.

How one copy is shared without leaving anything behind (Linux only):

* The first process (the *owner*) binds a Linux abstract-namespace unix socket whose name
  is derived from the source's identity, fills an anonymous ``memfd`` with the samples
  (data, then an int64 offsets array), seals it read-only and maps it.
* Every later process with the same source connects to that socket, receives the memfd
  over ``SCM_RIGHTS`` and maps the same pages: N ranks, one copy (shmem pages counted once).
* Abstract sockets and memfds are not files: they vanish when the last process holding
  them exits, crashed or not, so nothing is ever left in /dev/shm or on disk.

The owner serves the fd from a daemon thread for as long as it holds the RAMCache; a
process that arrives after the owner exited builds its own copy. Processes forked from a
holder share its mapping (MAP_SHARED) at no cost.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import mmap
import os
import socket
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..errors import DecodeError

_MSG_MAX = 4096
_PREFIX = "fastdata-ram-"


class RAMBudgetError(MemoryError):
    """The source does not fit in the RAMCache's ``max_bytes`` budget."""


def _default_budget() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def source_identity(source: Any) -> str:
    """A string that is equal in every process opening the same dataset (and differs otherwise).

    LMDB caches are identified by their file (path, inode, size, mtime); other sources by
    their type, length, labels and every sample's name.
    """
    path = getattr(source, "path", None)
    if isinstance(path, str) and os.path.isfile(os.path.join(path, "data.mdb")):
        st = os.stat(os.path.join(path, "data.mdb"))
        return f"lmdb:{os.path.abspath(path)}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    h = hashlib.sha256()
    h.update(f"{type(source).__module__}.{type(source).__qualname__}:{len(source)}".encode())
    h.update(np.ascontiguousarray(source.labels, dtype=np.int64).tobytes())
    for i in range(len(source)):
        h.update(source.name(i).encode("utf-8", "surrogateescape") + b"\0")
    return "generic:" + h.hexdigest()


def _as_buffer(item: Any) -> Any:
    """A source item's encoded bytes; a path is read as the engine reads files
    (fastdata.io.engine.read_file: DecodeError naming it when it is not a regular file or too large)."""
    if isinstance(item, DecodeError):  # the source found the record bad (e.g. a failed checksum)
        raise item
    if isinstance(item, str):
        from ..io.engine import read_file
        return read_file(item)
    return item


def _write_all(fd: int, buf: Any) -> None:
    view = memoryview(buf).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Server:
    """Owner side: hands the sealed memfd to every process that connects (daemon thread)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.ready = threading.Event()
        self.fd = -1
        self.header = b""
        self.thread = threading.Thread(target=self._serve, name="fastdata-ram-server", daemon=True)
        self.thread.start()
        # A forked child must not keep the listening socket: joiners would wait on it forever.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _close_in_child(ref))

    def publish(self, fd: int, header: Dict[str, Any]) -> None:
        self.fd, self.header = fd, json.dumps(header).encode()
        self.ready.set()

    def fail(self, message: str, budget: bool) -> None:
        self.header = json.dumps({"error": message, "budget": budget}).encode()
        self.ready.set()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # socket shut down: the cache was closed
            with conn:
                self.ready.wait()
                try:
                    if self.fd >= 0:
                        socket.send_fds(conn, [self.header], [self.fd])
                    else:
                        conn.sendall(self.header)
                except OSError:
                    pass  # the joiner went away; nothing to hand over
            if self.fd < 0:
                return

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept() in the server thread
        except OSError:
            pass
        self.sock.close()
        self.ready.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _close_in_child(ref: "weakref.ref[_Server]") -> None:
    server = ref()
    if server is not None:
        server.sock.close()
        if server.fd >= 0:
            os.close(server.fd)
            server.fd = -1


class RAMCache:
    """Source wrapper that serves every sample from one node-wide shared memory buffer.

    Args:
        source: any fastdata source (LMDBSource, ImageFolder, ...). Its ``fetch`` is called
            once per sample, in chunks, by the first process only.
        max_bytes: budget for the buffer (data + offsets). Default: half the physical RAM.
        key: overrides the source identity that names the shared buffer (processes with the
            same key share one buffer; give different datasets different keys).
        chunk: samples per ``source.fetch`` call while loading.

    ``fetch`` returns zero-copy read-only ``memoryview`` slices of the shared buffer; they
    keep the mapping alive. Thread-safe.

    Raises:
        RAMBudgetError: the samples need more than ``max_bytes``.
        OSError: not Linux (memfd/abstract sockets unavailable).
    """

    def __init__(self, source: Any, max_bytes: Optional[int] = None, *, key: Optional[str] = None,
                 chunk: int = 256):
        if not hasattr(os, "memfd_create"):
            raise OSError("RAMCache needs Linux (os.memfd_create)")
        self.source = source
        self.classes: List[str] = list(source.classes)
        self._labels = np.ascontiguousarray(source.labels, dtype=np.int64)
        self._n = len(source)
        if self._n == 0:
            raise ValueError("RAMCache: the source is empty")
        self.max_bytes = int(max_bytes) if max_bytes is not None else _default_budget()
        ident = key if key is not None else source_identity(source)
        digest = hashlib.sha256(f"{os.getuid()}\0{ident}".encode("utf-8", "surrogateescape")).hexdigest()[:40]
        self.socket_name = "\0" + _PREFIX + digest
        self._server: Optional[_Server] = None
        self.owner = False
        hint = getattr(source, "total_bytes", None)
        if isinstance(hint, int) and hint + 8 * (self._n + 1) > self.max_bytes:
            raise RAMBudgetError(self._budget_message(hint + 8 * (self._n + 1), self._n))
        fd, header = self._attach_or_build(chunk)
        try:
            size = header["size"]
            if size > self.max_bytes:
                raise RAMBudgetError(self._budget_message(size, self._n))
            if header["count"] != self._n:
                raise ValueError(f"RAMCache: shared buffer holds {header['count']} samples, the source {self._n}")
            self._mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            if not self.owner:
                os.close(fd)  # the mapping keeps the pages; the owner keeps its fd to serve it
        self.nbytes = size
        self._view = memoryview(self._mm)
        off_at = header["offsets_at"]
        # int64 [N+1] view of the shared buffer: offsets cost no per-process memory either
        self._offsets = np.frombuffer(self._mm, dtype="<i8", count=self._n + 1, offset=off_at)

    def _budget_message(self, need: int, count: int) -> str:
        return (f"RAMCache: {count} samples need {need / 2**20:.1f} MiB, more than max_bytes="
                f"{self.max_bytes} ({self.max_bytes / 2**20:.1f} MiB); raise max_bytes or read from the source directly")

    # ---------------------------------------------------------------- sharing
    def _attach_or_build(self, chunk: int) -> Any:
        while True:
            joined = self._try_join()
            if joined is not None:
                return joined
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind(self.socket_name)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE:
                    raise
                time.sleep(0.01)  # another process just became the owner; join it
                continue
            sock.listen(128)
            self.owner = True
            self._server = _Server(sock)
            try:
                fd, header = self._build(chunk)
            except BaseException as exc:
                self._server.fail(str(exc), isinstance(exc, RAMBudgetError))
                self._server.close()
                self._server = None
                raise
            self._server.publish(fd, header)
            return fd, header

    def _try_join(self) -> Optional[Any]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        with sock:
            try:
                sock.connect(self.socket_name)
            except (ConnectionRefusedError, FileNotFoundError):
                return None
            try:
                # Blocks while the owner loads: waiting is what avoids a second copy.
                msg, fds, _, _ = socket.recv_fds(sock, _MSG_MAX, 1)
            except ConnectionResetError:
                return None
        if not msg:
            for fd in fds:
                os.close(fd)
            return None  # the owner died before publishing; try to become the owner
        header = json.loads(msg)
        if "error" in header:
            for fd in fds:
                os.close(fd)
            raise (RAMBudgetError if header.get("budget") else RuntimeError)(header["error"])
        if len(fds) != 1:
            raise RuntimeError("RAMCache: the owner sent no memory handle")
        return fds[0], header

    def _build(self, chunk: int) -> Any:
        """Fill a sealed memfd: sample bytes back to back, then int64 offsets [N+1] (8-aligned)."""
        fd = os.memfd_create("fastdata-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            offsets = np.empty(self._n + 1, dtype="<i8")
            pos = 0
            for lo in range(0, self._n, chunk):
                idx = list(range(lo, min(lo + chunk, self._n)))
                for i, item in zip(idx, self.source.fetch(idx)):
                    buf = _as_buffer(item)
                    size = memoryview(buf).nbytes
                    offsets[i] = pos
                    if pos + size + 8 * (self._n + 2) > self.max_bytes:
                        raise RAMBudgetError(self._budget_message(pos + size + 8 * (self._n + 2), i + 1)
                                             + f" (exceeded at sample {i} of {self._n})")
                    _write_all(fd, buf)
                    pos += size
            offsets[self._n] = pos
            off_at = (pos + 7) // 8 * 8
            if off_at > pos:
                _write_all(fd, b"\0" * (off_at - pos))
            _write_all(fd, offsets.tobytes())
            size = off_at + offsets.nbytes
            # Sealed: no process, owner included, can change or resize what others map.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        except BaseException:
            os.close(fd)
            raise
        return fd, {"size": size, "count": self._n, "offsets_at": off_at}

    # ---------------------------------------------------------------- Source protocol
    def __len__(self) -> int:
        return self._n

    @property
    def labels(self) -> np.ndarray:
        view = self._labels.view()
        view.flags.writeable = False
        return view

    def name(self, index: int) -> str:
        return self.source.name(index)

    def fetch(self, indices: Sequence[int]) -> List[memoryview]:
        """Zero-copy read-only views of the encoded samples, in order."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            bad = idx[(idx < 0) | (idx >= self._n)][0]
            raise IndexError(f"sample index {bad} out of range for {self._n} samples")
        view = self._view
        return [view[a:b] for a, b in zip(self._offsets[idx].tolist(), self._offsets[idx + 1].tolist())]

    def close(self) -> None:
        """Stop serving the buffer to new processes (views already handed out stay valid)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def __del__(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.close()

    def __repr__(self) -> str:
        role = "owner" if self.owner else "joined"
        return f"RAMCache({self._n} samples, {self.nbytes / 2**20:.1f} MiB, {role}, over {self.source!r})"
