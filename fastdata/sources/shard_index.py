"""The shard index: which samples each tar shard holds, their labels and where their image
bytes sit, so a shard can be read by byte ranges and every sample has a global index.

Written by ``fastdata-convert --format tar`` next to the shards (``index.json``) or built by
one pass over the shards (``ShardIndex.scan``). JSON, no pickle::

    {"format": "fastdata-tar-shards", "version": 1, "classes": ["cat", ...],
     "shards": [{"url": "train-000000.tar", "size": 1048576000,
                 "names": ["n01440764_10026.jpg", ...],   # image member of each sample
                 "labels": [0, ...], "offsets": [512, ...], "sizes": [110735, ...]}]}

``url`` is relative to the index's own location unless it is absolute; ``offsets`` are the
byte offsets of the image members' data (their 512-byte tar header sits just before).
Global sample indices count through the shards in index order.
"""
from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .shard_io import RetryPolicy, SequentialReader, ShardFile, ShardReadError
from .shard_urls import is_local, join_url, local_path

FORMAT = "fastdata-tar-shards"
VERSION = 1
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "pgm", "tif", "tiff")

LabelFn = Callable[[str, Dict[str, bytes]], int]


class ShardFormatError(ValueError):
    """A shard or an index that does not follow the format (names the shard and sample)."""


def split_member_name(name: str) -> Tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the file name, the
    extension (lower-cased) the rest: ``a/b/n0144_1.seg.png`` -> (``a/b/n0144_1``, ``seg.png``)."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{folder}/{stem}" if folder else stem
    return key, ext.lower() if dot else ""


def label_from_members(key: str, files: Dict[str, bytes], where: str) -> int:
    """``.cls`` (an integer as text), else ``.json`` (an integer, or an object with
    ``label`` or ``cls``)."""
    try:
        if "cls" in files:
            return int(files["cls"].decode("utf-8").strip())
        if "json" in files:
            value = json.loads(files["json"].decode("utf-8"))
            if isinstance(value, dict):
                value = value["label"] if "label" in value else value["cls"]
            return int(value)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ShardFormatError(f"{where}: sample {key!r}: unreadable label: {e}") from e
    raise ShardFormatError(f"{where}: sample {key!r} has no .cls or .json member (pass label_fn= to name its label)")


@dataclass
class ShardEntry:
    """One shard's samples (arrays of equal length)."""

    url: str
    size: int
    names: List[str]
    labels: np.ndarray   # int64
    offsets: np.ndarray  # int64, image data offset in the shard
    sizes: np.ndarray    # int64, image data size

    def __len__(self) -> int:
        return len(self.names)


class ShardIndex:
    """Shards in order, with global sample indices ``starts[s] .. starts[s] + len(shard s)``."""

    def __init__(self, shards: Sequence[ShardEntry], classes: Optional[Sequence[str]] = None):
        if not shards:
            raise ValueError("no shards")
        self.shards: List[ShardEntry] = list(shards)
        counts = np.array([len(s) for s in self.shards], dtype=np.int64)
        self.counts = counts
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.labels = (np.concatenate([s.labels for s in self.shards]).astype(np.int64)
                       if counts.sum() else np.zeros(0, np.int64))
        n_classes = int(self.labels.max()) + 1 if len(self.labels) else 0
        if len(self.labels) and self.labels.min() < 0:
            raise ShardFormatError("negative label in the shard index")
        self.classes: List[str] = list(classes) if classes is not None else [str(k) for k in range(n_classes)]
        if len(self.classes) < n_classes:
            raise ShardFormatError(f"{len(self.classes)} class names for labels up to {n_classes - 1}")

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> Tuple[int, int]:
        """(shard number, position in the shard) of global sample ``index``."""
        i = int(index)
        if not 0 <= i < len(self):
            raise IndexError(f"sample index {index} out of range for {len(self)} samples")
        s = int(np.searchsorted(self.starts, i, side="right")) - 1
        return s, i - int(self.starts[s])

    def name(self, index: int) -> str:
        s, k = self.locate(index)
        return f"{self.shards[s].url} [{self.shards[s].names[k]}]"

    # ------------------------------------------------------------------ JSON
    def to_json(self, relative_to: Optional[str] = None) -> Dict[str, Any]:
        base = os.path.dirname(os.path.abspath(relative_to)) if relative_to else None

        def rel(url: str) -> str:
            if base is not None and is_local(url):
                path = os.path.abspath(local_path(url))
                if os.path.dirname(path) == base:
                    return os.path.basename(path)
            return url
        return {"format": FORMAT, "version": VERSION, "classes": self.classes,
                "shards": [{"url": rel(s.url), "size": int(s.size), "names": s.names,
                            "labels": s.labels.tolist(), "offsets": s.offsets.tolist(), "sizes": s.sizes.tolist()}
                           for s in self.shards]}

    def save(self, path: str) -> None:
        """Write atomically (a reader never sees half an index)."""
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(relative_to=path), f, separators=(",", ":"))
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, doc: Dict[str, Any], where: str) -> "ShardIndex":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ShardFormatError(f"{where}: not a fastdata shard index (format {FORMAT!r})")
        if doc.get("version") != VERSION:
            raise ShardFormatError(f"{where}: shard index version {doc.get('version')!r}, this fastdata reads {VERSION}")
        shards = []
        try:
            for s in doc["shards"]:
                n = len(s["names"])
                arrays = [np.asarray(s[k], dtype=np.int64) for k in ("labels", "offsets", "sizes")]
                if any(a.shape != (n,) for a in arrays):
                    raise ShardFormatError(f"{where}: shard {s['url']!r}: names, labels, offsets, sizes differ in length")
                shards.append(ShardEntry(join_url(where, s["url"]), int(s["size"]), list(s["names"]), *arrays))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ShardFormatError):
                raise
            raise ShardFormatError(f"{where}: damaged shard index: {type(e).__name__}: {e}") from e
        return cls(shards, doc.get("classes"))

    @classmethod
    def load(cls, url: str, policy: RetryPolicy = RetryPolicy()) -> "ShardIndex":
        raw = ShardFile(url, policy).read_all()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ShardFormatError(f"{url}: damaged shard index: {e}") from e
        return cls.from_json(doc, url)

    # ------------------------------------------------------------------ scan
    @classmethod
    def scan(cls, urls: Sequence[str], *, label_fn: Optional[LabelFn] = None,
             image_exts: Sequence[str] = IMAGE_EXTS, classes: Optional[Sequence[str]] = None,
             policy: RetryPolicy = RetryPolicy()) -> "ShardIndex":
        """Read every shard once (tar headers and the small label members)."""
        return cls([scan_shard(u, label_fn=label_fn, image_exts=image_exts, policy=policy) for u in urls], classes)


def scan_shard(url: str, *, label_fn: Optional[LabelFn] = None, image_exts: Sequence[str] = IMAGE_EXTS,
               policy: RetryPolicy = RetryPolicy()) -> ShardEntry:
    """One shard's entry, from its tar headers (WebDataset grouping: consecutive members
    sharing a key form a sample; the first of ``image_exts`` present is its image)."""
    shard = ShardFile(url, policy)
    reader = SequentialReader(shard)
    size = reader._size
    names: List[str] = []
    labels: List[int] = []
    offsets: List[int] = []
    sizes: List[int] = []
    current: Optional[str] = None
    members: Dict[str, Tuple[str, int, int]] = {}
    small: Dict[str, bytes] = {}
    rank = {e: i for i, e in enumerate(image_exts)}

    def finish() -> None:
        if current is None:
            return
        images = sorted((rank[e], e) for e in members if e in rank)
        if not images:
            raise ShardFormatError(f"{url}: sample {current!r} has no image member ({', '.join(image_exts)})")
        name, off, n = members[images[0][1]]
        labels.append(int(label_fn(current, small)) if label_fn is not None else label_from_members(current, small, url))
        names.append(name)
        offsets.append(off)
        sizes.append(n)

    try:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                key, ext = split_member_name(m.name)
                if key != current:
                    finish()
                    current, members, small = key, {}, {}
                members[ext] = (m.name, m.offset_data, m.size)
                if ext not in rank:
                    f = tar.extractfile(m)
                    small[ext] = f.read() if f is not None else b""
            finish()
    except tarfile.TarError as e:
        last = f" after sample {current!r}" if current is not None else ""
        raise ShardFormatError(f"{url}: damaged tar{last}: {e}") from e
    except ShardReadError:
        raise
    return ShardEntry(url, size, names, np.asarray(labels, np.int64), np.asarray(offsets, np.int64),
                      np.asarray(sizes, np.int64))
