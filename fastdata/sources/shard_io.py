"""Byte ranges of shards at any fsspec URL (plain paths through the OS), with retries.

Every read is a range request ``[start, end)``, so a retry after a dropped connection or a
5xx asks for exactly the same bytes again: nothing is lost or read twice. Object stores,
nginx and the test servers honour ``Range``; a server that ignores it is reported, not
silently mis-read.
"""
from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from .shard_urls import is_local, local_path


class ShardReadError(OSError):
    """A shard could not be read (after the retries), or it is shorter than its index says."""


# Not worth retrying: the object is not there or not ours to read.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` more tries after a failed read, sleeping ``backoff * 2**k`` (capped at
    ``max_backoff`` seconds) before try k + 1."""

    retries: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0:
            raise ValueError("retries and backoff must be non-negative")

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * (2 ** attempt))


def _filesystem(url: str) -> Tuple[Any, str]:
    """fsspec's filesystem for ``url`` (fsspec keeps one instance per protocol and options,
    and makes a fresh one after ``fork``) and the path within it."""
    import fsspec.core

    return fsspec.core.url_to_fs(url)


class ShardFile:
    """One shard: ``read(start, end)`` with retries (``on_retry(url, error)`` before each retry); ``size()``."""

    def __init__(self, url: str, policy: RetryPolicy, on_retry: Optional[Callable[[str, BaseException], None]] = None):
        self.url = url
        self.policy = policy
        self._on_retry = on_retry
        self._local = local_path(url) if is_local(url) else None
        self._fs: Any = None
        self._path = ""

    def _remote(self) -> Tuple[Any, str]:
        if self._fs is None:
            self._fs, self._path = _filesystem(self.url)
        return self._fs, self._path

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            try:
                return call()
            except _PERMANENT as e:
                raise ShardReadError(f"{self.url}: {what}: {e}") from e
            except Exception as e:
                status = getattr(e, "status", None)  # aiohttp's ClientResponseError, via fsspec
                if status == 416:  # range not satisfiable: the object ends before ``start``
                    return b""
                if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
                    raise ShardReadError(f"{self.url}: {what}: HTTP {status}: {e}") from e
                if attempt >= self.policy.retries:
                # network errors, 5xx, 408, 429: transient until the tries run out
                    raise ShardReadError(f"{self.url}: {what} failed after {attempt + 1} tries: "
                                         f"{type(e).__name__}: {e}") from e
                if self._on_retry is not None:
                    self._on_retry(self.url, e)
                time.sleep(self.policy.delay(attempt))
                attempt += 1

    def size(self) -> int:
        if self._local is not None:
            return self._retrying("size", lambda: os.path.getsize(self._local))
        fs, path = self._remote()
        return int(self._retrying("size", lambda: fs.size(path)))

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; shorter only where the shard itself ends (checked twice)."""
        if end <= start:
            return b""
        what = f"bytes {start}..{end}"
        if self._local is not None:
            def call() -> bytes:
                with open(self._local, "rb") as f:
                    f.seek(start)
                    return f.read(end - start)
            return self._retrying(what, call)
        fs, path = self._remote()
        data = self._retrying(what, lambda: fs.cat_file(path, start=start, end=end))
        if len(data) > end - start:
            raise ShardReadError(f"{self.url}: the server ignored a Range request ({what}, got {len(data)} bytes); "
                                 "shards need a server that honours Range")
        if len(data) < end - start:
            # A connection closed early without an error reads short: ask again before
            # believing that the shard ends here.
            again = self._retrying(what, lambda: fs.cat_file(path, start=start, end=end))
            if len(again) > len(data):
                data = again
        return data

    def read_all(self) -> bytes:
        if self._local is not None:
            def call() -> bytes:
                with open(self._local, "rb") as f:
                    return f.read()
            return self._retrying("read", call)
        fs, path = self._remote()
        return self._retrying("read", lambda: fs.cat_file(path))


class SequentialReader(io.RawIOBase):
    """A read-only stream over a shard made of retried range reads of ``chunk`` bytes
    (for ``tarfile``'s stream mode when an index is built)."""

    def __init__(self, shard: ShardFile, chunk: int = 8 << 20):
        super().__init__()
        self._shard = shard
        self._size = shard.size()
        self._pos = 0
        self._chunk = chunk
        self._buf = b""
        self._buf_pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._buf_pos >= len(self._buf):
            if self._pos >= self._size:
                return 0
            end = min(self._size, self._pos + self._chunk)
            self._buf = self._shard.read(self._pos, end)
            self._buf_pos = 0
            if not self._buf:
                return 0
            self._pos += len(self._buf)
        n = min(len(b), len(self._buf) - self._buf_pos)
        b[:n] = self._buf[self._buf_pos:self._buf_pos + n]
        self._buf_pos += n
        return n
