"""The on-disk format of a fastdata LMDB cache: keys, metadata schema, version checks.

This module is the one place that defines the format (docs/cache-format.md describes it
for humans); the writer (``fastdata.cli.convert``) and the reader (``fastdata.LMDBSource``)
both go through it.

Layout (one LMDB environment, a directory holding ``data.mdb``, main database only):

* sample ``i`` (0-based, dense): key = ``i`` as 8-byte big-endian unsigned integer,
  value = the encoded image bytes (a JPEG, or the original file's bytes).
* ``fastdata:meta``: UTF-8 JSON object (see :func:`build_meta`).
* ``fastdata:labels``: int64 little-endian array [N].
* ``fastdata:paths``: UTF-8 source paths of the N samples, each terminated by NUL.
* ``fastdata:sha256``: [N, 32] bytes, SHA-256 of each sample's *source* file bytes.
* ``fastdata:reencoded``: uint8 array [N], how the stored bytes relate to the source file:
  ``STORED_ORIGINAL`` (0), ``STORED_REENCODED`` (1) or ``STORED_TRANSCODED`` (2).
* ``fastdata:part:<8 hex digits>``: writer progress, one JSON record per committed batch;
  present only while a conversion is running or was interrupted.
* ``fastdata:plan``: JSON describing the inputs of an unfinished conversion (for ``--resume``).
* ``fastdata:complete``: JSON ``{"count": N, "format_version": V}``, written last, in the
  final transaction. A cache without it is incomplete and is refused by readers.

Sample keys are exactly 8 bytes long and every metadata key starts with ``fastdata:``
(longer than 8 bytes), so the two can never collide. Nothing is pickled: opening someone
else's cache never executes code.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

FORMAT_NAME = "fastdata-lmdb"
FORMAT_VERSION = 1

META_KEY = b"fastdata:meta"
LABELS_KEY = b"fastdata:labels"
PATHS_KEY = b"fastdata:paths"
SHA256_KEY = b"fastdata:sha256"
REENCODED_KEY = b"fastdata:reencoded"
PLAN_KEY = b"fastdata:plan"
COMPLETE_KEY = b"fastdata:complete"
PART_PREFIX = b"fastdata:part:"

SHA256_SIZE = 32

# Values of the fastdata:reencoded array. 2 was added within format version 1: readers
# that treat the array as "stored bytes differ from the source" (non-zero) stay correct.
STORED_ORIGINAL = 0  # the source file's bytes
STORED_REENCODED = 1  # decoded, resized and re-encoded (lossy; --max-side, non-JPEG inputs)
STORED_TRANSCODED = 2  # progressive JPEG rewritten as baseline, same DCT coefficients (lossless)
_KEY = struct.Struct(">Q")


class CacheFormatError(ValueError):
    """The cache at ``path`` is not a complete, readable fastdata cache."""


def sample_key(index: int) -> bytes:
    """LMDB key of sample ``index``: 8-byte big-endian, so LMDB order = index order."""
    return _KEY.pack(index)


def part_key(batch: int) -> bytes:
    """Key of the writer's progress record for committed batch number ``batch``."""
    return PART_PREFIX + b"%08x" % batch


def dumps(obj: Any) -> bytes:
    """Canonical JSON (sorted keys, no spaces) so identical content gives identical bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loads(data: bytes, what: str, path: str) -> Any:
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CacheFormatError(f"{path}: record {what} is not valid JSON ({exc})") from exc


def pack_labels(labels: Sequence[int]) -> bytes:
    return np.asarray(labels, dtype="<i8").tobytes()


def unpack_labels(data: bytes, count: int, path: str) -> np.ndarray:
    """int64 array [count] (native byte order, a copy owned by the caller)."""
    if len(data) != 8 * count:
        raise CacheFormatError(f"{path}: labels record has {len(data)} bytes, expected {8 * count}")
    return np.frombuffer(data, dtype="<i8").astype(np.int64)


def pack_paths(paths: Sequence[str]) -> bytes:
    for p in paths:
        if "\0" in p:
            raise ValueError(f"source path contains a NUL byte: {p!r}")
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


def unpack_paths(data: bytes, count: int, path: str) -> List[str]:
    parts = bytes(data).split(b"\0")
    if len(parts) != count + 1 or parts[-1] != b"":
        raise CacheFormatError(f"{path}: paths record does not hold {count} paths")
    return [p.decode("utf-8", "surrogateescape") for p in parts[:-1]]


def build_meta(
    *,
    fastdata_version: str,
    classes: Sequence[str],
    count: int,
    options: Dict[str, Any],
    source: Dict[str, Any],
    skipped: Sequence[Dict[str, Any]],
    bytes_in: int,
    bytes_out: int,
    reencoded: int,
    transcoded: int,
    transcoded_bytes_in: int,
    transcoded_bytes_out: int,
) -> Dict[str, Any]:
    """The ``fastdata:meta`` JSON object. No timestamps: a resumed run must equal a clean one."""
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "fastdata_version": fastdata_version,
        "key_format": "uint64 big-endian sample index",
        "count": int(count),
        "classes": list(classes),
        "options": dict(options),
        "source": dict(source),
        "skipped": list(skipped),
        "bytes_in": int(bytes_in),
        "bytes_out": int(bytes_out),
        "reencoded": int(reencoded),
        "transcoded": int(transcoded),
        "transcoded_bytes_in": int(transcoded_bytes_in),
        "transcoded_bytes_out": int(transcoded_bytes_out),
        "arrays": {
            "labels": "fastdata:labels int64 little-endian [count]",
            "paths": "fastdata:paths UTF-8, NUL-terminated [count]",
            "sha256": "fastdata:sha256 bytes [count, 32] of the source files",
            "reencoded": "fastdata:reencoded uint8 [count]: 0 source bytes, 1 re-encoded, 2 transcoded to baseline",
        },
    }


def check_complete(complete: Optional[bytes], meta: Optional[bytes], path: str) -> Dict[str, Any]:
    """Validate the completion record and metadata; return the metadata dict.

    Raises CacheFormatError for an incomplete cache, a newer format or a mismatch.
    """
    if complete is None:
        raise CacheFormatError(
            f"{path}: incomplete fastdata cache (the conversion did not finish): "
            f"run fastdata-convert --resume with the same SRC and DST"
        )
    done = loads(complete, "fastdata:complete", path)
    version = done.get("format_version") if isinstance(done, dict) else None
    if not isinstance(version, int):
        raise CacheFormatError(f"{path}: completion record has no integer format_version")
    if version > FORMAT_VERSION:
        raise CacheFormatError(
            f"{path}: cache format version {version} is newer than this fastdata supports "
            f"({FORMAT_VERSION}); upgrade fastdata to read it"
        )
    if meta is None:
        raise CacheFormatError(f"{path}: complete cache without a fastdata:meta record")
    info = loads(meta, "fastdata:meta", path)
    if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
        raise CacheFormatError(f"{path}: not a {FORMAT_NAME} cache")
    if info.get("format_version") != version or info.get("count") != done.get("count"):
        raise CacheFormatError(f"{path}: metadata and completion record disagree")
    return info
