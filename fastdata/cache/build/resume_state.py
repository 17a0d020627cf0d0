"""A conversion's progress so far, as committed in its ``fastdata:part:*`` records: kept up
while writing, and rebuilt from those records by ``--resume``."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Dict, List

from .. import format as cf
from ..errors import ConvertError


@dataclass
class State:
    """Progress of the conversion so far, rebuilt from the part records on resume."""

    next_pos: int = 0  # next input position to process
    batches: int = 0
    kept: List[int] = field(default_factory=list)  # input positions written, in index order
    sha256: List[str] = field(default_factory=list)
    stored_sha256: List[str] = field(default_factory=list)  # of the stored bytes, checked by readers
    reencoded: List[int] = field(default_factory=list)  # cf.STORED_* per kept record
    skipped: List[Dict[str, str]] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0
    transcoded_bytes_in: int = 0  # source bytes of the records transcoded to baseline
    transcoded_bytes_out: int = 0  # and their stored bytes

    def add_part(self, part: Dict[str, Any]) -> None:
        """Account for one committed batch (its progress record): when writing it and on resume."""
        self.batches += 1
        self.next_pos = part["end"]
        self.kept += part["kept"]
        self.sha256 += part["sha256"]
        self.stored_sha256 += part["stored_sha256"]
        self.reencoded += part["reencoded"]
        self.skipped += part["skipped"]
        self.bytes_in += part["bytes_in"]
        self.bytes_out += part["bytes_out"]
        self.transcoded_bytes_in += part["transcoded_bytes_in"]
        self.transcoded_bytes_out += part["transcoded_bytes_out"]

    def count(self, kind: int) -> int:
        return sum(1 for k in self.reencoded if k == kind)


def load_state(txn: Any, dst: str) -> State:
    st = State()
    cur = txn.cursor()
    if not cur.set_range(cf.PART_PREFIX):
        return st
    for key, value in cur:
        if not key.startswith(cf.PART_PREFIX):
            break
        part = _check_part(cf.loads(value, key.decode(), dst), key.decode(), dst)
        if "stored_sha256" not in part:  # written before the stored-bytes checksum existed
            first = len(st.kept)
            part["stored_sha256"] = [hashlib.sha256(txn.get(cf.sample_key(first + k)) or b"").hexdigest()
                                     for k in range(len(part["kept"]))]
        if part["batch"] != st.batches or part["start"] != st.next_pos:
            raise ConvertError(f"{dst}: progress records are not contiguous (batch {st.batches}); remove DST and start again")
        st.add_part(part)
    return st


def _check_part(part: Any, what: str, dst: str) -> Dict[str, Any]:
    """A progress record with every field ``State.add_part`` reads, of the right JSON type."""
    cf.check_fields(part, ("batch", "start", "end", "first_index", "bytes_in", "bytes_out", "transcoded_bytes_in",
                           "transcoded_bytes_out"), what, dst, lists=("kept", "sha256", "reencoded", "skipped"))
    n = len(part["kept"])
    if len(part["sha256"]) != n or len(part["reencoded"]) != n or len(part.get("stored_sha256", part["kept"])) != n:
        raise cf.CacheFormatError(f"{dst}: record {what}: its arrays do not all hold {n} entries")
    return part
