"""One epoch of one rank's shard stream: reader threads fetch shards ahead of the Loader,
into a bounded pool of samples that ``take`` hands out batch by batch.

Memory: the pool holds at most ``max_pending`` samples' bytes while the consumer is
served (the shuffle buffer must fit: a batch may need a sample read ``shuffle_buffer``
positions earlier than its own), plus what the readers hold in flight (one range read of
``chunk_bytes`` each). When the consumer waits for a sample not yet read, readers go on
past the bound until it arrives, so the bound never deadlocks the stream.

Readers take the stream's segments (runs of samples in one shard) in order, ``readers`` of
them at once; a segment reads only the byte ranges of samples still needed (a resumed
epoch skips consumed samples, and whole shards whose samples were all consumed), in
range reads of at most ``chunk_bytes``, or the whole shard once when it goes to the disk
cache. Every sample's 512-byte tar header is checked (checksum, size) before its bytes
are used.
"""
from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np

from .shard_cache import ShardDiskCache
from .shard_index import ShardFormatError, ShardIndex
from .shard_io import RetryPolicy, ShardFile, ShardReadError
from .shard_order import ShardOrder

HEADER = 512  # a tar member's header block, just before its data
_MERGE_GAP = 1 << 20  # read across gaps smaller than this rather than issue another request


class ShardSampleError(ShardFormatError):
    """A sample that could not be read from its shard (damaged or cut-off member, or a shard
    that stayed unreadable after the retries). ``index`` is its global sample index."""

    def __init__(self, reason: str, index: int, url: str, member: str):
        super().__init__(f"{url}: sample {member!r} (index {index}): {reason}")
        self.reason = reason
        self.index = index
        self.name = f"{url} [{member}]"


@dataclass
class StreamCounters:
    """Shared by a source's streams (guarded by ``lock``)."""

    lock: threading.Lock
    retries: int = 0
    bytes_read: int = 0
    shards_read: int = 0
    peak_pending: int = 0


def check_header(block: Any, size: int) -> None:
    """Raise ValueError unless ``block`` (512 bytes) is a valid tar header of a regular file
    of ``size`` bytes: checksum (unsigned, or the signed variant some tars write), type, size.
    A few µs, where ``tarfile.TarInfo.frombuf`` parses every field."""
    block = bytes(block)
    if len(block) != HEADER:
        raise ValueError("damaged tar header (cut off)")
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ValueError("damaged tar header (unreadable checksum)") from None
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    if stored != unsigned:
        signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)
        if stored != signed:
            raise ValueError("damaged tar header (bad checksum)")
    if block[156:157] not in (b"0", b"\0", b"7"):
        raise ValueError(f"tar header is not a regular file (type {block[156:157]!r})")
    field = block[124:136]
    if field[0] & 0x80:  # GNU base-256 size
        n = int.from_bytes(field[1:], "big")
    else:
        n = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    if n != size:
        raise ValueError(f"tar header says a {n}-byte file, the index a {size}-byte file")


def read_members(shard: ShardFile, wanted: List[Tuple[int, int, int]], chunk_bytes: int, stop: threading.Event,
                 deliver: Any, tee: Any = None, shard_size: int = 0) -> None:
    """Read the members ``wanted`` ((key, data offset, size), ascending offsets) from
    ``shard`` and ``deliver(key, view_or_error)`` each, as a zero-copy ``memoryview`` into
    the range read that holds it. Range reads end at a member's end and hold whole members
    (at most ``chunk_bytes``, or one member if larger), so no member is copied twice; runs
    of members closer than 1 MiB are read through the gap. With ``tee`` (a file), the
    whole shard ``[0, shard_size)`` is read in order and written there."""
    if tee is not None:
        runs = [(0, wanted)]
    else:
        runs = []
        last_end = None
        for m in wanted:
            if runs and m[1] - HEADER - last_end < _MERGE_GAP:
                runs[-1][1].append(m)
            else:
                runs.append((m[1] - HEADER, [m]))
            last_end = m[1] + m[2]
    for lo, members in runs:
        pos, k = lo, 0
        while k < len(members) and not stop.is_set():
            end = members[k][1] + members[k][2]
            j = k + 1
            while j < len(members) and members[j][1] + members[j][2] - pos <= chunk_bytes:
                end = members[j][1] + members[j][2]
                j += 1
            if tee is not None and j == len(members) and shard_size - pos <= chunk_bytes:
                end = shard_size  # the cache copy's tail too, before the last members are handed out
            data = shard.read(pos, end)
            if tee is not None:
                tee.write(data)
            got = pos + len(data)
            view = memoryview(data)
            for key, off, size in members[k:j]:
                if off + size > got:
                    deliver(key, ValueError(f"the shard ends at byte {got} but this member needs bytes "
                                            f"{off}..{off + size} (cut off)"))
                    continue
                try:
                    check_header(view[off - HEADER - pos:off - pos], size)
                    deliver(key, view[off - pos:off - pos + size])
                except ValueError as e:
                    deliver(key, e)
            if got < end:  # the shard ends here: every later member is cut off too
                for key, off, size in members[j:]:
                    deliver(key, ValueError(f"the shard ends at byte {got} but this member needs bytes "
                                            f"{off}..{off + size} (cut off)"))
                return
            pos, k = end, j
        if tee is not None:
            while pos < shard_size and not stop.is_set():  # finish the copy for the cache
                data = shard.read(pos, min(shard_size, pos + chunk_bytes))
                if not data:
                    break
                tee.write(data)
                pos += len(data)


class EpochStream:
    """Rank ``order.rank``'s samples of ``epoch`` from batch ``start`` on."""

    def __init__(self, index: ShardIndex, order: ShardOrder, epoch: int, start: int, *, readers: int,
                 chunk_bytes: int, max_pending: int, policy: RetryPolicy, cache: Optional[ShardDiskCache],
                 counters: StreamCounters):
        self.index, self.order, self.epoch = index, order, epoch
        B = order.batch_size
        stream = order.stream_indices(epoch)
        emit = order.emit_order(epoch)
        used = min(order.num_batches * B, len(emit))
        self._stream = stream
        self._batches: Deque[np.ndarray] = collections.deque(
            emit[b * B:min((b + 1) * B, used)] for b in range(start, order.num_batches))
        needed = np.zeros(len(stream), dtype=bool)
        needed[emit[start * B:used]] = True
        # work: (url, [(stream position, data offset, size)]) per segment that still has samples to read
        self._work: List[Tuple[int, List[Tuple[int, int, int]]]] = []
        p = 0
        for shard, first, n in order.segments(epoch):
            entry = index.shards[shard]
            members = [(q, int(entry.offsets[first + q - p]), int(entry.sizes[first + q - p]))
                       for q in range(p, p + n) if needed[q]]
            if members:
                self._work.append((shard, members))
            p += n
        self._policy, self._cache, self._counters = policy, cache, counters
        self._chunk = int(chunk_bytes)
        self._limit = int(max_pending)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)   # readers wait here for room in the pool
        self._ready = threading.Condition(lock)  # the consumer waits here for its batch
        self._pending: Dict[int, Any] = {}
        self._missing: set = set()  # positions the consumer waits for (woken only when all came)
        self._waiting = False
        self._fatal: Optional[BaseException] = None
        self._next_work = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._reader, name=f"fastdata-shards-{i}", daemon=True)
                         for i in range(max(1, min(int(readers), len(self._work))))]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ consumer side
    def take(self, indices: np.ndarray) -> Optional[List[Any]]:
        """The next planned batch's samples (bytes, or a ShardSampleError per damaged one),
        or None when ``indices`` is not the next planned batch."""
        with self._cond:
            if not self._batches or not np.array_equal(self._stream[self._batches[0]], np.asarray(indices)):
                return None
            positions = self._batches.popleft().tolist()
            self._missing = {p for p in positions if p not in self._pending}
            if self._missing:
                self._waiting = True
                self._cond.notify_all()  # readers may go past the bound now
                try:
                    while self._missing:
                        if self._fatal is not None:
                            raise self._fatal
                        if not any(t.is_alive() for t in self._threads):
                            raise RuntimeError("fastdata shard readers ended before the batch was read")
                        self._ready.wait(0.5)
                finally:
                    self._waiting = False
                    self._missing = set()
            out = [self._pending.pop(p) for p in positions]
            self._cond.notify_all()
        return out

    def close(self, wait: bool = True) -> None:
        """Stop the readers; with ``wait``, also join them. Without it the readers end on their
        own once their current read returns (what a finalizer must do: it can run on any
        thread, fsspec's event-loop thread included, where joining a reader that waits on that
        loop would deadlock)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            self._ready.notify_all()
        if not wait:
            return
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    # ------------------------------------------------------------------ reader threads
    def _deliver(self, shard: int, pos: int, value: Any) -> None:
        with self._cond:
            # Past the bound only while the consumer waits (for a sample this read may bring).
            while len(self._pending) >= self._limit and not self._waiting and not self._stop.is_set():
                self._cond.wait(0.5)
            if isinstance(value, BaseException):
                gi = int(self._stream[pos])
                k = gi - int(self.index.starts[shard])
                url = self.index.shards[shard].url
                name = self.index.shards[shard].names[k]
                value = ShardSampleError(str(value), gi, url, name)
            self._pending[pos] = value
            c = self._counters
            if len(self._pending) > c.peak_pending:
                c.peak_pending = len(self._pending)
            if pos in self._missing:
                self._missing.discard(pos)
                if not self._missing:
                    self._ready.notify()

    def _reader(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    if self._next_work >= len(self._work):
                        return
                    shard, members = self._work[self._next_work]
                    self._next_work += 1
                self._read_segment(shard, members)
        except BaseException as e:  # a bug, not bad data: end the epoch with it
            with self._cond:
                self._fatal = e
                self._ready.notify_all()

    def _read_segment(self, shard: int, members: List[Tuple[int, int, int]]) -> None:
        entry = self.index.shards[shard]
        counted = _CountingFile(ShardFile(entry.url, self._policy, on_retry=self._count_retry), self._counters)
        source, tee, tmp = counted, None, None
        cache = self._cache
        if cache is not None:
            local = cache.lookup(entry.url, entry.size)
            if local is not None:
                source = ShardFile(local, self._policy)
            elif cache.fits(entry.size):
                tmp = cache.begin(entry.url)
                tee = open(tmp, "wb")

        def deliver(pos: int, value: Any) -> None:
            self._deliver(shard, pos, value)

        done = set()

        def deliver_once(pos: int, value: Any) -> None:
            done.add(pos)
            deliver(pos, value)

        try:
            read_members(source, members, self._chunk, self._stop, deliver_once, tee=tee, shard_size=entry.size)
        except ShardReadError as e:  # unreadable after the retries: every sample not yet read is lost
            for pos, _, _ in members:
                if pos not in done:
                    deliver(pos, e)
        finally:
            if tee is not None:
                tee.close()
                if os.path.getsize(tmp) == entry.size and len(done) == len(members):  # complete, even if stopped now
                    cache.commit(entry.url, tmp)
                else:
                    cache.abandon(tmp)
        with self._counters.lock:
            self._counters.shards_read += 1

    def _count_retry(self, url: str, error: BaseException) -> None:
        with self._counters.lock:
            self._counters.retries += 1


class _CountingFile:
    """A ShardFile that adds the bytes it reads to the counters."""

    def __init__(self, shard: ShardFile, counters: StreamCounters):
        self._shard, self._counters = shard, counters

    def read(self, start: int, end: int) -> bytes:
        data = self._shard.read(start, end)
        with self._counters.lock:
            self._counters.bytes_read += len(data)
        return data
