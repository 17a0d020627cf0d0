"""The on-disk format of a fastdata LMDB cache: keys, metadata schema, version checks.

This module is the one place that defines the format (docs/cache-format.md describes it
for humans); the writer (``fastdata.cache.build``, behind fastdata-convert) and the reader
(``fastdata.LMDBSource``) both go through it.

Layout (one LMDB environment, a directory holding ``data.mdb``, main database only):

* sample ``i`` (0-based, dense): key = ``i`` as 8-byte big-endian unsigned integer,
  value = the encoded image bytes (a JPEG, or the original file's bytes).
* ``fastdata:meta``: UTF-8 JSON object (see :func:`build_meta`).
* ``fastdata:labels``: int64 little-endian array [N].
* ``fastdata:paths``: UTF-8 source paths of the N samples, each terminated by NUL.
* ``fastdata:sha256``: [N, 32] bytes, SHA-256 of each sample's *source* file bytes.
* ``fastdata:stored_sha256``: [N, 32] bytes, SHA-256 of each sample's *stored* bytes (the
  record's value), which readers check on every fetch. Added within format version 1:
  caches without it are checked only for records stored as the source's bytes.
* ``fastdata:reencoded``: uint8 array [N], how the stored bytes relate to the source file:
  ``STORED_ORIGINAL`` (0), ``STORED_REENCODED`` (1), ``STORED_TRANSCODED`` (2) or
  ``STORED_RESTART_INDEXED`` (3, format version 2).
* Format version 2: every stored JPEG that fastdata can rewrite losslessly carries restart
  markers every ``RESTART_INTERVAL_MCUS`` MCUs and, inside it, an APP15 segment indexing
  where every 8th restart interval starts (csrc/core/restart_index.h), so crop decodes skip the
  entropy decoding outside the crop. Version 1 caches (no index) read as before.
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
FORMAT_VERSION = 2  # 2: restart-indexed JPEGs (STORED_RESTART_INDEXED); version 1 caches stay readable
# fastdata:meta fields of transcoded records: written by every writer that stores any; absent means none.
_TRANSCODE_FIELDS = ("transcoded", "transcoded_bytes_in", "transcoded_bytes_out")

# MCUs per restart interval in the JPEGs fastdata-convert writes. Chosen by measurement
# (docs/design.md): a crop skips whole intervals left and right of it as well as above,
# while each interval costs its marker, byte padding and a DC reset (the index has an entry
# for every 8th interval only). One MCU: a crop decodes no MCU outside it.
RESTART_INTERVAL_MCUS = 1

META_KEY = b"fastdata:meta"
LABELS_KEY = b"fastdata:labels"
PATHS_KEY = b"fastdata:paths"
SHA256_KEY = b"fastdata:sha256"
STORED_SHA256_KEY = b"fastdata:stored_sha256"
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
# Format version 2: a baseline JPEG rewritten with restart markers and the restart index,
# same DCT coefficients (lossless). Progressive ones that get the index too stay value 2.
STORED_RESTART_INDEXED = 3
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
        raise CacheFormatError(f"{path}: record {what} is not valid JSON ({exc})") from None
    except RecursionError:  # e.g. arrays nested 200,000 deep: valid JSON, but no record of ours
        raise CacheFormatError(f"{path}: record {what} is nested too deeply to be fastdata metadata") from None


def _is_count(value: Any) -> bool:
    """A JSON integer >= 0 (bool is an int in Python, and 1e400 parses as a float inf)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_fields(record: Any, ints: Sequence[str], what: str, path: str, *,
                 lists: Sequence[str] = (), dicts: Sequence[str] = (), strings: Sequence[str] = ()) -> Dict[str, Any]:
    """``record`` as a dict whose named fields exist with the named JSON types (counts: ints >= 0).

    Every reader of a record goes through this, so a crafted or damaged cache gives a
    CacheFormatError naming the field, never a KeyError/TypeError/OverflowError later.
    """
    if not isinstance(record, dict):
        raise CacheFormatError(f"{path}: record {what} is not a JSON object")
    for names, ok, kind in ((ints, _is_count, "an integer >= 0"), (lists, lambda v: isinstance(v, list), "a list"),
                            (dicts, lambda v: isinstance(v, dict), "an object"),
                            (strings, lambda v: isinstance(v, str), "a string")):
        for name in names:
            if name not in record:
                raise CacheFormatError(f"{path}: record {what} has no field {name!r}")
            if not ok(record[name]):
                raise CacheFormatError(f"{path}: record {what}: field {name!r} is not {kind} "
                                       f"(got {type(record[name]).__name__})")
    return record


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
            "stored_sha256": "fastdata:stored_sha256 bytes [count, 32] of the stored records",
            "reencoded": "fastdata:reencoded uint8 [count]: 0 source bytes, 1 re-encoded, 2 transcoded to baseline, "
                         "3 restart-indexed",
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
    check_fields(done, ("count",), "fastdata:complete", path)
    for key in _TRANSCODE_FIELDS:  # written by every writer that stores transcoded records; absent means none
        info.setdefault(key, 0)
    check_fields(info, ("count", "bytes_in", "bytes_out", "reencoded", *_TRANSCODE_FIELDS), "fastdata:meta", path,
                 lists=("classes", "skipped"), dicts=("options", "source"))
    if not all(isinstance(c, str) for c in info["classes"]):
        raise CacheFormatError(f"{path}: record fastdata:meta: classes are not all strings")
    for entry in info["skipped"]:
        check_fields(entry, (), "fastdata:meta skipped entry", path, strings=("path", "reason"))
    if info.get("format_version") != version or info["count"] != done["count"]:
        raise CacheFormatError(f"{path}: metadata and completion record disagree")
    return info

