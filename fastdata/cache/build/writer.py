"""Convert SRC into a crash-safe LMDB cache (the library behind ``fastdata-convert``).

The parent process scans SRC (fastdata.cache.build.scan), owns the LMDB write transactions and
writes records strictly in input order; ``workers`` forked processes read, hash, validate
(decode once) and shrink or transcode each image as fastdata.cache.build.records decides.
Batches of records are committed together with a progress record
(fastdata.cache.build.resume_state), so a run killed at any moment leaves a cache that
``resume=True`` continues and that readers refuse until the completion record (written
last, in the final transaction) exists. The format is fastdata.cache.format's.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, TextIO

import numpy as np

from ... import __version__
from ...io.host import usable_cores
from .. import format as cf
from ..errors import ConvertError
from ..lmdb_file import check_lmdb_dir
from .progress_line import ProgressLine
from .ordered_pool import processed_in_order
from .records import DEFAULT_QUALITY, Result
from .resume_state import State, load_state
from .scan import Plan, check_destination, scan
from .verify import verify as verify_cache

DEFAULT_BATCH = 512  # records per write transaction (also capped by DEFAULT_BATCH_BYTES)
DEFAULT_BATCH_BYTES = 64 << 20
DEFAULT_MAP_SIZE = 1 << 30  # LMDB files grow with use; the map only bounds them, and grows too


def _write(env: Any, fn: Any) -> None:
    """Run ``fn(txn)`` in one write transaction, doubling the map size until it fits."""
    import lmdb

    while True:
        try:
            with env.begin(write=True) as txn:
                fn(txn)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


@dataclass
class ConvertSummary:
    dst: str
    written: int
    skipped: List[Dict[str, str]]
    bytes_in: int  # this run's bytes read (resumed: only what this run processed)
    bytes_out: int  # total stored image bytes in the cache
    reencoded: int
    seconds: float
    processed: int  # inputs handled by this run
    already_complete: bool = False
    transcoded: int = 0  # progressive JPEGs stored as lossless baseline (whole cache)
    transcoded_bytes_in: int = 0  # their source bytes
    transcoded_bytes_out: int = 0  # their stored bytes

    def text(self) -> str:
        lines = [
            f"fastdata-convert: {self.dst}: {self.written} images written, {len(self.skipped)} skipped, "
            f"{self.reencoded} re-encoded, {self.transcoded} progressive transcoded to baseline"
            + (f" ({self.transcoded_bytes_in / 1e6:.2f} -> {self.transcoded_bytes_out / 1e6:.2f} MB)"
               if self.transcoded else "") + "; "
            f"{self.bytes_in / 1e6:.1f} MB read, {self.bytes_out / 1e6:.1f} MB stored; "
            f"{self.seconds:.1f} s ({self.processed / max(self.seconds, 1e-9):.0f} img/s this run)"
        ]
        for s in self.skipped[:20]:
            lines.append(f"  skipped {s['path']}: {s['reason']}")
        if len(self.skipped) > 20:
            lines.append(f"  ... {len(self.skipped) - 20} more (listed in the cache metadata)")
        return "\n".join(lines)


def convert(
    src: str,
    dst: str,
    *,
    max_side: Optional[int] = None,
    quality: int = DEFAULT_QUALITY,
    keep_progressive: bool = False,
    workers: Optional[int] = None,
    resume: bool = False,
    on_error: str = "raise",
    verify: bool = False,
    batch_size: int = DEFAULT_BATCH,
    map_size: int = DEFAULT_MAP_SIZE,
    progress: Optional[TextIO] = None,
) -> ConvertSummary:
    """Convert SRC into the LMDB cache DST; see the module docstring and docs/cache-format.md.

    Raises ConvertError naming the file (``on_error="raise"``) or the problem.
    """
    import lmdb

    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be in 1..100, got {quality}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    workers = worker_count(workers)
    t0 = time.monotonic()

    check_destination(src, dst)
    plan = scan(src)
    options = {"max_side": max_side, "quality": quality if max_side is not None else None,
               "keep_progressive": bool(keep_progressive), "restart_interval_mcus": cf.RESTART_INTERVAL_MCUS}
    fingerprint = plan.fingerprint(options)

    exists = os.path.exists(os.path.join(dst, "data.mdb"))
    if exists and not resume:
        raise ConvertError(f"{dst}: already holds an LMDB cache; pass --resume to continue it, or remove it")
    if exists:
        check_lmdb_dir(dst)  # before LMDB maps it: a truncated file would end this process with SIGBUS
    try:
        os.makedirs(dst, exist_ok=True)
        env = lmdb.open(dst, map_size=map_size, subdir=True, readonly=False, lock=True, max_dbs=0, sync=True)
    except (OSError, lmdb.Error) as exc:
        from ...sources.lmdb import held_open_here

        raise ConvertError(f"{dst}: cannot create or open the cache there: {exc}{held_open_here(dst)}") from None
    try:
        with env.begin() as txn:
            complete = txn.get(cf.COMPLETE_KEY)
            plan_rec = txn.get(cf.PLAN_KEY)
            nonempty = txn.stat()["entries"] > 0
            if complete is not None:
                meta = cf.check_complete(complete, txn.get(cf.META_KEY), dst)
                if meta["options"] != options or meta["source"].get("fingerprint") != fingerprint:
                    raise ConvertError(f"{dst}: a complete cache from different inputs or options already exists")
                return ConvertSummary(dst, meta["count"], meta["skipped"], 0, meta["bytes_out"], meta["reencoded"],
                                      time.monotonic() - t0, 0, already_complete=True,
                                      transcoded=meta["transcoded"], transcoded_bytes_in=meta["transcoded_bytes_in"],
                                      transcoded_bytes_out=meta["transcoded_bytes_out"])
            if plan_rec is not None:
                stored = cf.loads(plan_rec, "fastdata:plan", dst)
                if stored.get("fingerprint") != fingerprint:
                    raise ConvertError(
                        f"{dst}: SRC or --max-side/--quality/--keep-progressive differ from the interrupted run; "
                        f"use the same arguments, or remove DST and start again"
                    )
                state = load_state(txn, dst)
            elif nonempty:
                raise ConvertError(f"{dst}: not a fastdata cache in progress; remove it")
            else:
                state = State()
        if plan_rec is None:
            _write(env, lambda t: t.put(cf.PLAN_KEY, cf.dumps({"fingerprint": fingerprint, "inputs": len(plan.items),
                                                                "options": options, "root": plan.root})))

        processed = _run(env, plan, state, dst, max_side, quality, keep_progressive, workers, on_error, batch_size,
                         progress)
        _finalize(env, plan, state, dst, options, fingerprint, on_error)
    finally:
        env.close()
    summary = ConvertSummary(dst, len(state.kept), state.skipped, state.bytes_in, state.bytes_out,
                             state.count(cf.STORED_REENCODED), time.monotonic() - t0, processed,
                             transcoded=state.count(cf.STORED_TRANSCODED),
                             transcoded_bytes_in=state.transcoded_bytes_in,
                             transcoded_bytes_out=state.transcoded_bytes_out)
    if verify:
        verify_cache(dst, max_side, workers)
    return summary


def worker_count(workers: Optional[int]) -> int:
    """``--workers``: default and upper bound are the usable cores (more processes than cores
    only add memory and scheduling; 100,000 would fork until the machine stops)."""
    usable = usable_cores()
    if workers is None:
        return usable
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return min(workers, usable)


def _run(env: Any, plan: Plan, st: State, dst: str, max_side: Optional[int], quality: int, keep_progressive: bool,
         workers: int, on_error: str, batch_size: int, stream: Optional[TextIO]) -> int:
    """Process inputs ``st.next_pos..`` in order, committing batches; returns inputs processed."""
    total = len(plan.items)
    todo = [(pos, plan.abspath(pos)) for pos in range(st.next_pos, total)]
    prog = ProgressLine(total, st.next_pos, stream)
    run_bytes_in = 0
    pending: List[Result] = []
    pending_bytes = 0
    pending_skipped = 0  # inputs in ``pending`` that failed (the progress line counts them)

    def commit(end: int) -> None:
        nonlocal pending, pending_bytes, pending_skipped
        first_index = len(st.kept)
        kept = [r for r in pending if r[1] is not None]
        transcoded = [r for r in kept if r[5] == cf.STORED_TRANSCODED]
        part = {
            "batch": st.batches, "start": st.next_pos, "end": end, "first_index": first_index,
            "kept": [r[0] for r in kept], "sha256": [r[4].hex() for r in kept],
            "stored_sha256": [r[6].hex() for r in kept],
            "reencoded": [int(r[5]) for r in kept],
            "transcoded_bytes_in": sum(r[3] for r in transcoded),
            "transcoded_bytes_out": sum(len(r[1]) for r in transcoded),
            "skipped": [{"path": plan.items[r[0]][0], "reason": r[2]} for r in pending if r[1] is None],
            "bytes_in": sum(r[3] for r in pending), "bytes_out": sum(len(r[1]) for r in kept),
        }

        def fn(txn: Any) -> None:
            for i, r in enumerate(kept):
                txn.put(cf.sample_key(first_index + i), r[1])
            txn.put(cf.part_key(st.batches), cf.dumps(part))

        _write(env, fn)
        st.add_part(part)
        pending, pending_bytes, pending_skipped = [], 0, 0

    def consume(r: Result) -> None:
        nonlocal pending_bytes, pending_skipped, run_bytes_in
        if r[1] is None and on_error == "raise":
            commit(r[0])  # keep the good work before the bad file, so --resume starts at it
            raise ConvertError(f"{plan.abspath(r[0])}: {r[2]} (pass --on-error skip to leave such files out)")
        pending.append(r)
        pending_bytes += len(r[1] or b"")
        pending_skipped += r[1] is None
        run_bytes_in += r[3]
        if len(pending) >= batch_size or pending_bytes >= DEFAULT_BATCH_BYTES:
            commit(r[0] + 1)
        prog.update(r[0] + 1, run_bytes_in, len(st.skipped) + pending_skipped)

    try:
        for r in processed_in_order(todo, workers, max_side, quality, keep_progressive):
            consume(r)
        if pending or st.next_pos < total:
            commit(total)
    finally:
        prog.update(st.next_pos, run_bytes_in, len(st.skipped), force=True)
        prog.close()
    return total - todo[0][0] if todo else 0


def _finalize(env: Any, plan: Plan, st: State, dst: str, options: Dict[str, Any], fingerprint: str,
              on_error: str) -> None:
    """Write metadata and arrays, drop progress records, then the completion record: one transaction."""
    if len(set(st.kept)) != len(st.kept) or st.next_pos != len(plan.items):
        raise ConvertError(f"{dst}: internal error: progress does not cover every input exactly once")
    count = len(st.kept)
    if count == 0:
        raise ConvertError(f"{dst}: every input was skipped; nothing to write")
    meta = cf.build_meta(
        fastdata_version=__version__, classes=plan.classes, count=count, options=options,
        source={"kind": plan.kind, "root": plan.root, "inputs": len(plan.items), "fingerprint": fingerprint},
        skipped=st.skipped, bytes_in=st.bytes_in, bytes_out=st.bytes_out, reencoded=st.count(cf.STORED_REENCODED),
        transcoded=st.count(cf.STORED_TRANSCODED), transcoded_bytes_in=st.transcoded_bytes_in,
        transcoded_bytes_out=st.transcoded_bytes_out,
    )
    labels = cf.pack_labels([plan.items[p][1] for p in st.kept])
    paths = cf.pack_paths([plan.items[p][0] for p in st.kept])
    sha = b"".join(bytes.fromhex(h) for h in st.sha256)
    stored_sha = b"".join(bytes.fromhex(h) for h in st.stored_sha256)
    reenc = np.asarray(st.reencoded, dtype=np.uint8).tobytes()

    def fn(txn: Any) -> None:
        for b in range(st.batches):
            txn.delete(cf.part_key(b))
        txn.delete(cf.PLAN_KEY)
        txn.put(cf.META_KEY, cf.dumps(meta))
        txn.put(cf.LABELS_KEY, labels)
        txn.put(cf.PATHS_KEY, paths)
        txn.put(cf.SHA256_KEY, sha)
        txn.put(cf.STORED_SHA256_KEY, stored_sha)
        txn.put(cf.REENCODED_KEY, reenc)
        txn.put(cf.COMPLETE_KEY, cf.dumps({"count": count, "format_version": cf.FORMAT_VERSION}))

    _write(env, fn)
    env.sync(True)
