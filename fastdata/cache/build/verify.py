"""``fastdata-convert --verify``: re-read every record of a finished cache and check it."""
from __future__ import annotations

import multiprocessing
import os
from typing import Any, List, Optional, Tuple

from ...errors import DecodeError
from ...io.decoding import probe
from ..errors import ConvertError
from .records import oriented_size, validate

# Each (forked) verifying process keeps one source open across its chunks.
_VERIFY_SRC: Any = None


def _verify_chunk(args: Tuple[str, Optional[int], int, int]) -> List[str]:
    """Re-read records [lo, hi) of a finished cache; return problems found."""
    global _VERIFY_SRC
    from ...sources.lmdb import LMDBSource

    dst, max_side, lo, hi = args
    if _VERIFY_SRC is None or _VERIFY_SRC.path != os.path.abspath(dst):
        _VERIFY_SRC = LMDBSource(dst, verify="once")  # every record hashed at its one fetch here
    src = _VERIFY_SRC
    problems = []
    for i, data in zip(range(lo, hi), src.fetch(range(lo, hi))):
        if isinstance(data, DecodeError):  # the record fails its stored-bytes checksum
            problems.append(str(data))
            continue
        data = bytes(data)
        try:
            if src.transcoded[i] or src.restart_indexed[i]:
                # the source is not at hand to compare pixels with: check the kind, then decode
                info = probe(data)
                if info.progressive or not info.restart_indexed:
                    problems.append(f"sample {i} ({src.source_path(i)}): rewritten record is progressive or "
                                    f"has no restart index")
                    continue
            elif not src.reencoded[i]:
                # fetch checked the bytes against the stored checksum (verify="once" hashes each
                # record at its first fetch): stored bytes are the source's iff the checksums agree
                if src.stored_sha256(i) != src.sha256(i):
                    problems.append(f"sample {i} ({src.source_path(i)}): stored bytes differ from the source checksum")
                    continue
            else:
                w, h = oriented_size(data)
                if max_side is not None and max(w, h) > max_side:
                    problems.append(f"sample {i}: {w}x{h} exceeds --max-side {max_side}")
            validate(data)
        except Exception as exc:  # report every undecodable record rather than stop at the first
            problems.append(f"sample {i} ({src.source_path(i)}): {type(exc).__name__}: {exc}")
    return problems


def verify(dst: str, max_side: Optional[int], workers: int) -> None:
    """Re-read every record of the finished cache DST; ConvertError listing the problems found."""
    from ...sources.lmdb import LMDBSource

    n = len(LMDBSource(dst))
    step = 256
    jobs = [(dst, max_side, lo, min(lo + step, n)) for lo in range(0, n, step)]
    if workers <= 1:
        found = [p for j in jobs for p in _verify_chunk(j)]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            found = [p for ps in pool.map(_verify_chunk, jobs) for p in ps]
    if found:
        raise ConvertError(f"{dst}: verification failed for {len(found)} record(s): " + "; ".join(found[:10]))
