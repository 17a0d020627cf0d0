"""Checks on an LMDB ``data.mdb`` file made before LMDB maps it.

LMDB memory-maps the file and trusts its two meta pages: a file cut short (a copy that
stopped, a full disk) is mapped past its end, and the first read of a missing page kills
the process with SIGBUS, and a crafted page count makes LMDB ask for a map of petabytes.
Neither can be caught once mapped, so every fastdata opener of a cache (reader, converter,
``--resume``, bench, doctor) reads the meta pages with plain file IO first and refuses a
file that is shorter than the pages they say were written.

Layout of a meta page (liblmdb's ``MDB_page`` + ``MDB_meta``, 64-bit builds; pages 0 and
1, the one with the larger transaction id is current)::

    0   page number (u64)      8 pad (u16)   10 flags (u16, P_META = 0x08)   12 lower/upper
    16  magic 0xBEEFC0DE (u32) 20 version (u32)   24 address (u64)   32 map size (u64)
    40  free DB (48 bytes; its first u32 is the page size)   88 main DB (48 bytes)
    136 last page number (u64)   144 transaction id (u64)
"""
from __future__ import annotations

import os
import struct
from typing import NamedTuple

from .format import CacheFormatError

LMDB_MAGIC = 0xBEEFC0DE
LMDB_DATA_VERSION = 1
_P_META = 0x08
_P_INVALID = (1 << 64) - 1  # the root of an empty database
_DB = struct.Struct("<IHHQQQQQ")  # pad (page size in the free DB), flags, depth, branch, leaf, overflow, entries, root
_META_END = 152
_MIN_PAGE, _MAX_PAGE = 512, 1 << 16  # liblmdb: MIN_PAGESIZE .. MAX_PAGESIZE


class LMDBMeta(NamedTuple):
    """The current meta page of a ``data.mdb``."""

    page_size: int
    last_page: int  # highest page number written by a committed transaction
    txnid: int
    entries: int  # records in the main database
    map_size: int

    @property
    def min_file_size(self) -> int:
        """Bytes the file must hold for every committed page to be readable."""
        return (self.last_page + 1) * self.page_size


def _parse_meta(page: bytes, page_no: int, path: str) -> LMDBMeta:
    if len(page) < _META_END:
        raise CacheFormatError(f"{path}: LMDB meta page {page_no} is cut short ({len(page)} bytes)")
    pgno, _pad, flags = struct.unpack_from("<QHH", page, 0)
    magic, version, _address, map_size = struct.unpack_from("<IIQQ", page, 16)
    if magic != LMDB_MAGIC:
        raise CacheFormatError(f"{path}: not an LMDB file (meta page {page_no} has magic {magic:#010x}, "
                               f"expected {LMDB_MAGIC:#010x})")
    if version != LMDB_DATA_VERSION or pgno != page_no or not flags & _P_META:
        raise CacheFormatError(f"{path}: LMDB meta page {page_no} is damaged (version {version}, "
                               f"page number {pgno}, flags {flags:#x})")
    free_db = _DB.unpack_from(page, 40)
    main_db = _DB.unpack_from(page, 88)
    last_page, txnid = struct.unpack_from("<QQ", page, 136)
    page_size = free_db[0]
    if not _MIN_PAGE <= page_size <= _MAX_PAGE or page_size & (page_size - 1):
        raise CacheFormatError(f"{path}: LMDB meta page {page_no} gives an invalid page size {page_size}")
    for name, db in (("free", free_db), ("main", main_db)):
        root = db[7]
        if root != _P_INVALID and not 2 <= root <= last_page:
            raise CacheFormatError(f"{path}: LMDB meta page {page_no}: {name} database root page {root} "
                                   f"outside pages 2..{last_page}")
    return LMDBMeta(page_size, last_page, txnid, main_db[6], map_size)


def read_lmdb_meta(data_mdb: str) -> LMDBMeta:
    """Current meta page of the LMDB file ``data_mdb``, checked against the file's size.

    Raises CacheFormatError for a file that is not LMDB, has damaged meta pages, or is
    shorter than its last committed page (truncated); OSError when it cannot be read.
    """
    size = os.path.getsize(data_mdb)
    with open(data_mdb, "rb") as f:
        first = f.read(_META_END)
        if len(first) < _META_END:
            raise CacheFormatError(f"{data_mdb}: {size} bytes, too short for an LMDB file (truncated?)")
        meta0 = _parse_meta(first, 0, data_mdb)
        f.seek(meta0.page_size)
        meta1 = _parse_meta(f.read(_META_END), 1, data_mdb)
    if meta1.page_size != meta0.page_size:
        raise CacheFormatError(f"{data_mdb}: LMDB meta pages disagree on the page size "
                               f"({meta0.page_size} and {meta1.page_size})")
    meta = meta1 if meta1.txnid > meta0.txnid else meta0  # what liblmdb picks (mdb_env_pick_meta)
    if size < meta.min_file_size:
        raise CacheFormatError(
            f"{data_mdb}: truncated: {size} bytes, but LMDB's meta page says {meta.last_page + 1} pages of "
            f"{meta.page_size} bytes ({meta.min_file_size} bytes) were written; copy the cache again or "
            f"re-run fastdata-convert"
        )
    return meta


def check_lmdb_dir(path: str) -> LMDBMeta:
    """``read_lmdb_meta`` of ``path/data.mdb`` (FileNotFoundError when there is none)."""
    data_mdb = os.path.join(path, "data.mdb")
    if not os.path.isfile(data_mdb):
        raise FileNotFoundError(f"{path}: no LMDB cache here (expected {data_mdb})")
    return read_lmdb_meta(data_mdb)
