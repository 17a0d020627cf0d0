"""TarShards: WebDataset-style tar shards from local paths or any fsspec URL, streamed.

Unlike the random-access sources, a shard is read front to back, so the epoch order comes
from the shards (``make_order``: ``fastdata.sources.shard_order.ShardOrder``) and the
Loader's producer takes an epoch's batches from ``stream_batches``, which reads ahead in
that order (``fastdata.sources.shard_stream``) while ``fetch`` hands out each planned batch.
Any other ``fetch`` (a replacement for a sample that failed to decode) reads the sample's
byte range directly. Design and guarantees: docs/shards.md.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from .shard_cache import ShardDiskCache
from .shard_index import IMAGE_EXTS, LabelFn, ShardIndex
from .shard_io import RetryPolicy, ShardFile
from .shard_order import ShardOrder
from .shard_stream import HEADER, EpochStream, ShardSampleError, StreamCounters, check_header
from .shard_urls import expand_urls

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: Union[str, int]) -> int:
    """Bytes from ``1GB``, ``500MiB``, ``1e9`` or an int (decimal units as on disks: 1GB = 10**9)."""
    if isinstance(text, int):
        value = text
    else:
        s = str(text).strip().upper().replace(" ", "")
        num = s.rstrip("KMGTIB")
        try:
            value = int(float(num) * _UNITS[s[len(num):]])
        except (KeyError, ValueError):
            raise ValueError(f"not a size: {text!r} (e.g. 1GB, 500MB, 2GiB)") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


class TarShards:
    """Samples of WebDataset tar shards (``key.jpg`` + ``key.cls``/``key.json``, ...).

    Args:
        urls: shard paths or fsspec URLs (``https://``, ``s3://`` with s3fs, ...), a list or a
            WebDataset brace pattern (``.../train-{000000..000146}.tar``; ``::`` joins patterns).
            Read once at construction to build the index, unless ``index`` is given.
        index: the shard index (``index.json`` written by ``fastdata-convert --format tar``; a
            path or URL, shards relative to it), or a ``ShardIndex``.
        label_fn: ``label_fn(key, members) -> int`` with ``members`` the sample's non-image
            members (extension -> bytes); default: ``.cls``, else ``.json`` (``label``/``cls``).
        classes: class names (default: "0".."C-1", or the index's).
        shuffle_buffer: samples in the shuffle buffer (the Loader's ``shuffle`` turns it on).
        readahead: samples read ahead beyond the shuffle buffer (default 4 batches' worth,
            at least 256).
        readers: shards read at once.
        chunk_bytes: largest single range read.
        cache_dir, cache_size: keep whole shards on local disk (``cache_size`` bytes, e.g.
            ``"50GB"``; least recently used shards are evicted first).
        retries, backoff: network errors are retried ``retries`` times, sleeping
            ``backoff * 2**k`` seconds before try k + 1.

    One Loader reads a TarShards at a time (the source holds that Loader's read-ahead).
    """

    def __init__(self, urls: Any = None, *, index: Union[None, str, ShardIndex] = None,
                 label_fn: Optional[LabelFn] = None, classes: Optional[Sequence[str]] = None,
                 image_exts: Sequence[str] = IMAGE_EXTS, shuffle_buffer: int = 1000, readahead: Optional[int] = None,
                 readers: int = 2, chunk_bytes: int = 8 << 20, cache_dir: Optional[str] = None,
                 cache_size: Union[None, str, int] = None, retries: int = 5, backoff: float = 0.2):
        self.policy = RetryPolicy(retries=int(retries), backoff=float(backoff))
        if int(shuffle_buffer) < 1 or int(readers) < 1 or int(chunk_bytes) < HEADER:
            raise ValueError("shuffle_buffer and readers must be >= 1, chunk_bytes >= 512")
        if index is not None:
            if urls is not None or label_fn is not None:
                raise ValueError("with an index, shard URLs and labels come from it: pass urls/label_fn or index")
            self.index = index if isinstance(index, ShardIndex) else ShardIndex.load(str(index), self.policy)
            if classes is not None:
                self.index.classes = list(classes)
        elif urls is not None:
            self.index = ShardIndex.scan(expand_urls(urls), label_fn=label_fn, image_exts=image_exts,
                                         classes=classes, policy=self.policy)
        else:
            raise ValueError("TarShards needs shard urls or an index")
        if len(self.index) == 0:
            raise ValueError("the shards hold no samples")
        self.classes: List[str] = self.index.classes
        self.shuffle_buffer = int(shuffle_buffer)
        self.readahead = None if readahead is None else int(readahead)
        self.readers = int(readers)
        self.chunk_bytes = int(chunk_bytes)
        self.cache: Optional[ShardDiskCache] = None
        if cache_dir is not None:
            self.cache = ShardDiskCache(cache_dir, parse_size(cache_size) if cache_size is not None else 10**11)
        elif cache_size is not None:
            raise ValueError("cache_size needs cache_dir")
        self.counters = StreamCounters(threading.Lock())
        self._lock = threading.Lock()  # guards _stream: the producer thread and the GC may swap it
        self._stream: Optional[EpochStream] = None
        self._unjoined: List[EpochStream] = []  # ended without waiting (a finalizer); joined by the next end_stream()
        self._on_error = "raise"
        self._damaged: Dict[int, str] = {}
        self._random_reads = 0  # samples read on their own (outside a planned batch): replacements

    # ------------------------------------------------------------------ Source protocol
    def __len__(self) -> int:
        return len(self.index)

    @property
    def labels(self) -> np.ndarray:
        view = self.index.labels.view()
        view.flags.writeable = False
        return view

    @property
    def urls(self) -> List[str]:
        return [s.url for s in self.index.shards]

    def name(self, index: int) -> str:
        name = self.index.name(index)
        reason = self._damaged.get(int(index))
        return f"{name} (unreadable in its shard: {reason})" if reason else name

    def fetch(self, indices: Sequence[int]) -> List[Any]:
        """Encoded images for ``indices``: the planned batch from the read-ahead, else byte
        ranges read directly. A damaged sample raises ``ShardSampleError``, or (Loader
        ``on_error="skip"``) comes back empty so the Loader counts and replaces it."""
        stream = self._stream
        got = stream.take(np.asarray(indices, dtype=np.int64)) if stream is not None else None
        if got is None:
            got = [self._read_one(int(i)) for i in indices]
        for k, item in enumerate(got):
            if isinstance(item, ShardSampleError):
                if self._on_error != "skip":
                    raise item
                self._damaged[item.index] = item.reason
                got[k] = b""
        return got

    def _read_one(self, index: int) -> Any:
        self._random_reads += 1
        shard, k = self.index.locate(index)
        entry = self.index.shards[shard]
        off, size = int(entry.offsets[k]), int(entry.sizes[k])
        local = self.cache.lookup(entry.url, entry.size) if self.cache is not None else None
        try:
            data = ShardFile(local or entry.url, self.policy).read(off - HEADER, off + size)
            if len(data) < size + HEADER:
                raise ValueError(f"the shard ends at byte {off - HEADER + len(data)} but this member needs bytes "
                                 f"{off}..{off + size} (cut off)")
            check_header(data[:HEADER], size)
            return memoryview(data)[HEADER:]
        except (ValueError, OSError) as e:
            return ShardSampleError(str(e), index, entry.url, entry.names[k])

    # ------------------------------------------------------------------ streaming hooks (the Loader)
    def make_order(self, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool, rank: int,
                   world_size: int) -> ShardOrder:
        return ShardOrder(tuple(int(c) for c in self.index.counts), int(batch_size), shuffle=shuffle, seed=seed,
                          drop_last=drop_last, rank=rank, world_size=world_size, shuffle_buffer=self.shuffle_buffer)

    def stream_batches(self, order: ShardOrder, epoch: int, start: int = 0,
                       on_error: str = "raise") -> Iterator[np.ndarray]:
        """``order.batches(epoch, start)``, read ahead: the first ``next`` starts reader
        threads on this epoch's shards (ending any earlier stream), so each batch's ``fetch``
        finds its samples read; the stream ends with the iteration (or when it is dropped)."""
        stream = self.begin_epoch(order, epoch, start, on_error)
        try:
            yield from order.batches(epoch, start)
        finally:
            # Also runs when an abandoned generator is garbage collected, on whatever thread
            # the collector ran (once fsspec's event-loop thread, which the readers' reads
            # need): signal the readers, never join them here.
            self.end_stream(stream, wait=False)

    def begin_epoch(self, order: ShardOrder, epoch: int, start: int, on_error: str = "raise") -> EpochStream:
        """Start reading ahead for ``epoch`` from batch ``start`` (ends the previous stream)."""
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.end_stream()
        ahead = self.readahead if self.readahead is not None else max(256, 4 * order.batch_size)
        stream = EpochStream(self.index, order, epoch, start, readers=self.readers, chunk_bytes=self.chunk_bytes,
                             max_pending=self.shuffle_buffer + order.batch_size + ahead, policy=self.policy,
                             cache=self.cache, counters=self.counters)
        with self._lock:
            old, self._stream, self._on_error = self._stream, stream, on_error
        if old is not None:
            old.close()
        return stream

    @property
    def stream(self) -> Optional[EpochStream]:
        """The epoch stream reading ahead now (None when none): what a later ``end_stream``
        may name so as to end that stream only."""
        with self._lock:
            return self._stream

    def end_stream(self, stream: Optional[EpochStream] = None, wait: bool = True) -> None:
        """Stop reading ahead (only ``stream``, when given and still current); ``wait``: join
        the reader threads too (see EpochStream.close)."""
        with self._lock:
            if stream is not None and self._stream is not stream:
                ending = [stream]  # already replaced: make sure its readers are gone
            else:
                ending = [self._stream] if self._stream is not None else []
                self._stream = None
            if wait:  # and the readers of streams ended earlier without waiting
                ending += self._unjoined
                self._unjoined = []
            else:
                self._unjoined += ending
        for old in ending:
            old.close(wait)

    close = end_stream

    # ------------------------------------------------------------------ reporting
    @property
    def skipped(self) -> List[Dict[str, str]]:
        """Samples found damaged in their shard and skipped (``on_error="skip"``): [{"name", "reason"}]."""
        return [{"name": self.index.name(i), "reason": r} for i, r in sorted(self._damaged.items())]

    def stats(self) -> Dict[str, int]:
        c = self.counters
        with c.lock:
            out = {"retries": c.retries, "bytes_read": c.bytes_read, "shards_read": c.shards_read,
                   "peak_pending_samples": c.peak_pending, "damaged": len(self._damaged),
                   "random_reads": self._random_reads}
        if self.cache is not None:
            out.update(cache_hits=self.cache.hits, cache_misses=self.cache.misses, cache_evicted=self.cache.evicted)
        return out

    def __del__(self) -> None:
        try:
            self.end_stream()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"TarShards({len(self.index.shards)} shards, {len(self)} samples, {len(self.classes)} classes)"
