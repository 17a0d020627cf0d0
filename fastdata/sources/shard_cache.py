"""A local disk cache of whole shards, bounded in bytes, least recently used out first.

One file per shard (named by a hash of its URL), written to a temporary name and renamed
when complete, so a reader (or another rank on the node) never sees half a shard. A
shard's modification time is its last use; when a new shard would pass ``max_bytes``, the
least recently used shards are deleted first. A file deleted while another process reads
it stays readable there (POSIX), so processes can share one cache folder.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import List, Optional, Tuple


class ShardDiskCache:
    def __init__(self, folder: str, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"cache size must be positive, got {max_bytes}")
        self.folder = os.path.abspath(folder)
        self.max_bytes = int(max_bytes)
        os.makedirs(self.folder, exist_ok=True)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evicted = 0

    def path_for(self, url: str) -> str:
        digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]
        return os.path.join(self.folder, f"{digest}.tar")

    def lookup(self, url: str, size: int) -> Optional[str]:
        """The cached copy of ``url`` when it is complete (``size`` bytes), marked as used."""
        path = self.path_for(url)
        try:
            if os.path.getsize(path) == size:
                os.utime(path)
                with self._lock:
                    self.hits += 1
                return path
        except OSError:
            pass
        with self._lock:
            self.misses += 1
        return None

    def fits(self, size: int) -> bool:
        return size <= self.max_bytes

    def begin(self, url: str) -> str:
        """A temporary file to write ``url``'s bytes into; ``commit`` or ``abandon`` it."""
        return f"{self.path_for(url)}.part-{os.getpid()}-{threading.get_ident()}"

    def commit(self, url: str, tmp: str) -> str:
        size = os.path.getsize(tmp)
        with self._lock:
            self._evict(self.max_bytes - size)
            final = self.path_for(url)
            os.replace(tmp, final)
        return final

    @staticmethod
    def abandon(tmp: str) -> None:
        try:
            os.unlink(tmp)
        except OSError:
            pass

    def _entries(self) -> List[Tuple[float, int, str]]:
        out = []
        for e in os.scandir(self.folder):
            if e.name.endswith(".tar"):
                try:
                    st = e.stat()
                except OSError:
                    continue
                out.append((st.st_mtime, st.st_size, e.path))
        return sorted(out)

    def _evict(self, budget: int) -> None:
        """Delete least recently used shards until the cache holds at most ``budget`` bytes."""
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= budget:
                break
            try:
                os.unlink(path)
                self.evicted += 1
            except OSError:
                pass
            total -= size

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._entries())
