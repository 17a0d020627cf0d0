"""Writing WebDataset tar shards and their index (the logic behind
``fastdata-convert SRC DST --format tar``).

Each kept input becomes one sample ``{k:08d}.jpg`` (the bytes the LMDB cache would store:
``fastdata.cache.build.records.stored_bytes``, so progressive JPEGs are transcoded losslessly and
``--max-side`` shrinks), ``{k:08d}.cls`` (the label) and ``{k:08d}.json`` (source path,
label, class name). Samples are written in a seeded random order — a reader shuffles only
within a bounded buffer, so shards written class by class would give one-class batches —
and a new shard starts before one would pass ``shard_size`` bytes. Shards are written
under a temporary name and renamed when closed; ``index.json`` (fastdata.sources.shard_index)
is written last, so a reader never sees an index naming a half-written shard.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..io.encoded import JPEG_SIGNATURE
from ..sources.shard_index import ShardEntry, ShardIndex

_MAGIC_EXT = ((JPEG_SIGNATURE, "jpg"), (b"\x89PNG", "png"), (b"RIFF", "webp"), (b"BM", "bmp"), (b"GIF8", "gif"))
INDEX_NAME = "index.json"


def image_ext(data: bytes, path: str) -> str:
    """The member extension for stored bytes: by signature, else the source file's."""
    for magic, ext in _MAGIC_EXT:
        if data.startswith(magic):
            return ext
    return os.path.splitext(path)[1].lstrip(".").lower() or "img"


def _padded(n: int) -> int:
    return -(-n // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _closed_size(offset: int) -> int:
    """A tar's file size once closed after ``offset`` bytes of members: two zero blocks
    end it, then tarfile pads to a whole record (RECORDSIZE, 10 KiB)."""
    end = offset + 2 * tarfile.BLOCKSIZE
    return -(-end // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


@dataclass
class ShardWriterSummary:
    dst: str
    samples: int = 0
    shards: int = 0
    bytes_out: int = 0
    skipped: List[Dict[str, str]] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"fastdata-convert: {self.samples} images in {self.shards} shard(s), "
                 f"{self.bytes_out / 1e6:.1f} MB, index {os.path.join(self.dst, INDEX_NAME)}"]
        lines += [f"  skipped {s['path']}: {s['reason']}" for s in self.skipped[:20]]
        if len(self.skipped) > 20:
            lines.append(f"  ... {len(self.skipped) - 20} more (listed in the index)")
        return "\n".join(lines)


class ShardWriter:
    """Append samples; shards roll over at ``shard_size`` bytes; ``close()`` writes the index."""

    def __init__(self, dst: str, shard_size: int, classes: Sequence[str], prefix: str = "shard"):
        if shard_size < 10 * tarfile.BLOCKSIZE:
            raise ValueError(f"shard size {shard_size} is too small for a tar shard")
        if os.path.exists(os.path.join(dst, INDEX_NAME)):
            raise FileExistsError(f"{dst}: already holds tar shards ({INDEX_NAME}); remove it first")
        os.makedirs(dst, exist_ok=True)
        self.dst, self.shard_size, self.classes, self.prefix = dst, int(shard_size), list(classes), prefix
        self._tar: Optional[tarfile.TarFile] = None
        self._entries: List[ShardEntry] = []
        self._cur: Dict[str, List[Any]] = {}
        self.summary = ShardWriterSummary(dst)

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self._entries):06d}.tar"
        self._name = name
        self._tar = tarfile.open(os.path.join(self.dst, name + ".part"), "w", format=tarfile.USTAR_FORMAT)
        self._cur = {"names": [], "labels": [], "offsets": [], "sizes": []}

    def _close_shard(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        part = os.path.join(self.dst, self._name + ".part")
        final = os.path.join(self.dst, self._name)
        os.replace(part, final)
        size = os.path.getsize(final)
        c = self._cur
        self._entries.append(ShardEntry(final, size, c["names"], np.asarray(c["labels"], np.int64),
                                        np.asarray(c["offsets"], np.int64), np.asarray(c["sizes"], np.int64)))
        self.summary.shards += 1
        self.summary.bytes_out += size
        self._tar = None

    def _add(self, name: str, data: bytes) -> int:
        """Add one member; returns its data offset."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        self._tar.addfile(info, io.BytesIO(data))
        return self._tar.offset - _padded(len(data))

    def add(self, path: str, label: int, data: bytes) -> None:
        key = f"{self.summary.samples:08d}"
        meta = json.dumps({"path": path, "label": int(label), "class": self.classes[label]}).encode("utf-8")
        size = 3 * tarfile.BLOCKSIZE + _padded(len(data)) + _padded(len(meta)) + tarfile.BLOCKSIZE
        if self._tar is not None and self._cur["names"] and _closed_size(self._tar.offset + size) > self.shard_size:
            self._close_shard()
        if self._tar is None:
            self._open()
        name = f"{key}.{image_ext(data, path)}"
        offset = self._add(name, data)
        self._add(f"{key}.cls", str(int(label)).encode())
        self._add(f"{key}.json", meta)
        c = self._cur
        c["names"].append(name)
        c["labels"].append(int(label))
        c["offsets"].append(offset)
        c["sizes"].append(len(data))
        self.summary.samples += 1

    def abort(self) -> None:
        """Stop without an index: the shard being written is removed (closed ones stay)."""
        if self._tar is not None:
            self._tar.close()
            os.unlink(os.path.join(self.dst, self._name + ".part"))
            self._tar = None

    def close(self) -> ShardWriterSummary:
        self._close_shard()
        if not self._entries:
            raise ValueError(f"{self.dst}: no samples to write")
        index = ShardIndex(self._entries, self.classes)
        doc = index.to_json(relative_to=os.path.join(self.dst, INDEX_NAME))
        doc["skipped"] = self.summary.skipped
        tmp = os.path.join(self.dst, INDEX_NAME + ".part")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, os.path.join(self.dst, INDEX_NAME))
        return self.summary


def write_order(n: int, seed: int) -> np.ndarray:
    """The seeded order in which ``n`` inputs are written (positions into the input plan)."""
    return np.random.Generator(np.random.Philox(key=[seed, 0x5AAD])).permutation(n).astype(np.int64)


def write_shards(dst: str, results: Iterable[Tuple[int, Optional[bytes], Optional[str]]],
                 items: Sequence[Tuple[str, int]], classes: Sequence[str], shard_size: int,
                 on_error: str = "raise") -> ShardWriterSummary:
    """Write ``results`` ((input position, stored bytes or None, error reason), in write
    order) as shards; ``items[pos] = (path relative to SRC, label)``."""
    writer = ShardWriter(dst, shard_size, classes)
    try:
        for pos, data, reason in results:
            path, label = items[pos]
            if data is None:
                if on_error == "raise":
                    raise ValueError(f"{path}: {reason} (pass --on-error skip to leave such files out)")
                writer.summary.skipped.append({"path": path, "reason": str(reason)})
                continue
            writer.add(path, label, data)
    except BaseException:
        writer.abort()
        raise
    return writer.close()

