"""``fastdata-convert SRC DST``: pack an image dataset into a crash-safe LMDB cache.

SRC is an ImageFolder tree (torchvision semantics) or a ``path,label`` list file; DST is
an LMDB directory in the format defined by :mod:`fastdata.cache.format`.

What is stored for each input is decided in one place, :func:`stored_bytes`: the source
bytes, a lossy re-encode (``--max-side``), or, for progressive JPEGs, a lossless
transcode to baseline (same DCT coefficients, so identical pixels) that the Loader's
crop decode can serve without entropy-decoding the whole image.

Threads/processes: the parent process scans SRC, owns the LMDB write transactions and
writes records strictly in input order; ``--workers`` forked processes read, hash,
validate (decode once) and shrink or transcode each image as :func:`stored_bytes` decides. Batches of records are committed
together with a progress record, so a run killed at any moment leaves a cache that
``--resume`` continues and that readers refuse until the completion record (written last,
in the final transaction) exists.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import multiprocessing
import os
import re
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

from .. import __version__
from ..cache import format as cf
from ..io.encoded import is_jpeg
from ..io.host import usable_cores
from ..sources.folder import read_file_list, scan_image_folder

DEFAULT_QUALITY = 90
DEFAULT_BATCH = 512  # records per write transaction (also capped by DEFAULT_BATCH_BYTES)
DEFAULT_BATCH_BYTES = 64 << 20
DEFAULT_MAP_SIZE = 1 << 30  # LMDB files grow with use; the map only bounds them, and grows too


class ConvertError(RuntimeError):
    """The conversion stopped; the message names the file or the problem."""


# --------------------------------------------------------------------------- inputs
@dataclass
class Plan:
    """What to convert: ``items[k] = (path relative to root, label)`` in output order."""

    root: str
    kind: str  # "folder" | "list"
    classes: List[str]
    items: List[Tuple[str, int]]

    def abspath(self, k: int) -> str:
        return os.path.join(self.root, self.items[k][0])

    def fingerprint(self, options: Dict[str, Any]) -> str:
        h = hashlib.sha256(cf.dumps({"classes": self.classes, "kind": self.kind, "options": options}))
        for rel, label in self.items:
            h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + str(label).encode() + b"\n")
        return h.hexdigest()


def scan_folder(root: str) -> Plan:
    """ImageFolder order (fastdata.sources.folder.scan_image_folder), paths relative to root."""
    try:
        classes, samples = scan_image_folder(root)
    except FileNotFoundError as e:
        raise ConvertError(str(e)) from None
    items = [(os.path.relpath(path, root), label) for path, label in samples]
    return Plan(root=os.path.abspath(root), kind="folder", classes=classes, items=items)


def read_list(list_path: str) -> Plan:
    """A ``path,label`` list file (fastdata.sources.folder.read_file_list); classes "0".."max"."""
    root = os.path.dirname(os.path.abspath(list_path))
    try:
        entries = read_file_list(list_path)
    except ValueError as e:
        raise ConvertError(str(e)) from None
    items = [(os.path.relpath(p, root), lab) for p, lab in entries]
    classes = [str(k) for k in range(max(lab for _, lab in items) + 1)]
    return Plan(root=root, kind="list", classes=classes, items=items)


def scan(src: str) -> Plan:
    if os.path.isdir(src):
        return scan_folder(src)
    if os.path.isfile(src):
        return read_list(src)
    raise ConvertError(f"{src}: no such folder or list file")


# --------------------------------------------------------------------------- per image (worker side)
def _native_available() -> bool:
    return importlib.util.find_spec("fastdata._C") is not None


_NATIVE: Optional[bool] = None


def _use_native() -> bool:
    global _NATIVE
    if _NATIVE is None:
        _NATIVE = _native_available()
    return _NATIVE


def _target_size(w: int, h: int, max_side: int) -> Tuple[int, int]:
    scale = max_side / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def _encode_jpeg(img: Any, quality: int) -> bytes:
    """Baseline 4:2:0 JPEG of a Pillow RGB image, no metadata (orientation already applied)."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, subsampling="4:2:0", optimize=False, progressive=False)
    return buf.getvalue()


def _pillow_rgb(data: bytes, max_side: Optional[int]) -> Any:
    """Decode with Pillow to an oriented RGB image; when ``max_side`` is set, let libjpeg
    DCT-scale (draft) to no less than the target size, which is what makes shrinking cheap."""
    from PIL import Image, ImageOps

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(data))
        if max_side is not None and img.format == "JPEG" and max(img.size) > max_side:
            img.draft("RGB", _target_size(img.width, img.height, max_side))
        img.load()
    img = ImageOps.exif_transpose(img)
    return img.convert("RGB") if img.mode != "RGB" else img


def _oriented_size(data: bytes) -> Tuple[int, int]:
    if _use_native():
        import fastdata

        info = fastdata.probe(data)
        return info.oriented_width, info.oriented_height
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if img.getexif().get(0x0112, 1) in (5, 6, 7, 8):
            w, h = h, w
    return w, h


def _validate(data: bytes) -> Optional[np.ndarray]:
    """Decode once; raise on any problem. Returns the native decode's pixels (None via Pillow)."""
    if _use_native():
        import fastdata

        return fastdata.decode(data, strict=True)
    _pillow_rgb(data, None)
    return None


def _shrink(data: bytes, max_side: int, quality: int) -> bytes:
    """Decoded (oriented RGB), antialiased resize to ``max_side`` when larger, JPEG re-encode."""
    from PIL import Image

    if _use_native():
        import fastdata

        img = Image.fromarray(fastdata.decode(data, strict=True))
    else:
        img = _pillow_rgb(data, max_side)
    if max(img.size) > max_side:
        # reducing_gap: box-reduce first, then LANCZOS; antialiased and fast for big shrinks
        img = img.resize(_target_size(img.width, img.height, max_side), Image.LANCZOS, reducing_gap=3.0)
    return _encode_jpeg(img, quality)


class TranscodeError(ValueError):
    """A progressive JPEG that decodes could not be rewritten losslessly (reported per file)."""


def _transcodable(data: bytes) -> bool:
    """Progressive grayscale/YCbCr/RGB JPEGs: those whose decode pays for entropy-decoding every
    scan of the whole image. CMYK/YCCK stay as they are (rare, and an Adobe marker would
    have to be reproduced exactly); without the native extension nothing is transcoded."""
    if not _use_native() or not is_jpeg(data):
        return False
    import fastdata

    info = fastdata.probe(data)
    return info.progressive and info.color_space in ("gray", "ycbcr", "rgb")


def _transcode(data: bytes, pixels: Optional[np.ndarray]) -> bytes:
    """Lossless progressive -> baseline rewrite, checked against the source's decoded pixels.

    The rewrite keeps the DCT coefficients, so any difference would be a bug, not rounding:
    checking costs one fast (baseline) decode per progressive file, once, at write time.
    """
    import fastdata
    from fastdata import _C
    from fastdata.io.engine import DEFAULT_MAX_PIXELS

    try:
        out = _C.transcode_to_baseline(data, DEFAULT_MAX_PIXELS)
    except ValueError as exc:  # NativeDecodeError (corrupt data) is a ValueError too
        raise TranscodeError(f"lossless transcode to baseline failed: {exc}") from None
    if fastdata.probe(out).progressive:
        raise TranscodeError("lossless transcode to baseline produced a progressive file")
    if pixels is None or not np.array_equal(fastdata.decode(out, strict=True), pixels):
        raise TranscodeError("lossless transcode to baseline changed the decoded pixels")
    return out


def stored_bytes(data: bytes, max_side: Optional[int], quality: int, keep_progressive: bool) -> Tuple[bytes, int]:
    """What the cache stores for one input's bytes, and how it relates to them (cf.STORED_*).

    Raises for data that does not decode (strictly) or cannot be re-encoded as ``max_side`` asks.
    A progressive file that decodes but cannot be transcoded exactly (e.g. one whose decode
    uses libjpeg's block smoothing, which a sequential rewrite does not get) is stored as it
    is: the transcode is only a speed-up, and a good image is never dropped for it.
    """
    if max_side is not None and not (is_jpeg(data) and max(_oriented_size(data)) <= max_side):
        return _shrink(data, max_side, quality), cf.STORED_REENCODED  # too large, or not a JPEG
    pixels = _validate(data)
    if not keep_progressive and _transcodable(data):
        try:
            return _transcode(data, pixels), cf.STORED_TRANSCODED
        except TranscodeError:
            pass
    return data, cf.STORED_ORIGINAL


# (input position, stored bytes or None, error reason or None, bytes read, sha256, cf.STORED_*)
Result = Tuple[int, Optional[bytes], Optional[str], int, bytes, int]


def _read_input(path: str) -> bytes:
    """The file's bytes, read by the engine's reader (fastdata.io.engine.read_file: regular files
    only, never blocking on a named pipe, DEFAULT_MAX_FILE_BYTES at most)."""
    if _use_native():
        from ..io.engine import read_file
        return read_file(path).tobytes()
    with open(path, "rb") as f:  # without the extension (a source checkout before the build)
        return f.read()


def process_one(pos: int, path: str, max_side: Optional[int], quality: int, keep_progressive: bool = False) -> Result:
    """Read, hash, validate and store (:func:`stored_bytes`) one input. Never raises for bad data."""
    try:
        data = _read_input(path)
    except OSError as exc:
        return pos, None, f"cannot read: {exc.strerror or exc}", 0, b"", cf.STORED_ORIGINAL
    except ValueError as exc:  # fastdata.DecodeError from the native reader: not a regular file, too large
        return pos, None, f"cannot read: {getattr(exc, 'reason', exc)}", 0, b"", cf.STORED_ORIGINAL
    digest = hashlib.sha256(data).digest()
    try:
        stored, kind = stored_bytes(data, max_side, quality, keep_progressive)
        return pos, stored, None, len(data), digest, kind
    except Exception as exc:  # any decoder failure is this file's problem, reported by name
        return pos, None, f"invalid image: {_reason(exc)}", len(data), digest, cf.STORED_ORIGINAL


def _reason(exc: Exception) -> str:
    """A deterministic message (stored in the cache, so a resumed run equals a clean one)."""
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):
        return "not a recognized image format"
    reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
    return re.sub(r" at 0x[0-9a-f]+", "", str(reason))



_WORKER_ARGS: Tuple[Optional[int], int, bool] = (None, DEFAULT_QUALITY, False)


def _worker_init(max_side: Optional[int], quality: int, keep_progressive: bool) -> None:
    global _WORKER_ARGS
    _WORKER_ARGS = (max_side, quality, keep_progressive)


def _worker_chunk(chunk: Sequence[Tuple[int, str]]) -> List[Result]:
    return [process_one(pos, path, *_WORKER_ARGS) for pos, path in chunk]


# --------------------------------------------------------------------------- LMDB writing
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
class _State:
    """Progress of the conversion so far, rebuilt from the part records on resume."""

    next_pos: int = 0  # next input position to process
    batches: int = 0
    kept: List[int] = field(default_factory=list)  # input positions written, in index order
    sha256: List[str] = field(default_factory=list)
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
        self.reencoded += part["reencoded"]
        self.skipped += part["skipped"]
        self.bytes_in += part["bytes_in"]
        self.bytes_out += part["bytes_out"]
        self.transcoded_bytes_in += part["transcoded_bytes_in"]
        self.transcoded_bytes_out += part["transcoded_bytes_out"]

    def count(self, kind: int) -> int:
        return sum(1 for k in self.reencoded if k == kind)


def _load_state(txn: Any, dst: str) -> _State:
    st = _State()
    cur = txn.cursor()
    if not cur.set_range(cf.PART_PREFIX):
        return st
    for key, value in cur:
        if not key.startswith(cf.PART_PREFIX):
            break
        part = cf.loads(value, key.decode(), dst)
        if part["batch"] != st.batches or part["start"] != st.next_pos:
            raise ConvertError(f"{dst}: progress records are not contiguous (batch {st.batches}); remove DST and start again")
        st.add_part(part)
    return st


# --------------------------------------------------------------------------- progress
class _Progress:
    """One status line on stderr: images/s, MB/s (read), ETA. Redrawn in place on a TTY."""

    def __init__(self, total: int, done: int, stream: Optional[TextIO]):
        self.total, self.start_done, self.stream = total, done, stream
        self.t0 = self.last = time.monotonic()
        self.tty = bool(stream is not None and stream.isatty())

    def update(self, done: int, bytes_in: int, skipped: int, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        rate = (done - self.start_done) / dt
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "?"
        line = (
            f"fastdata-convert: {done}/{self.total} ({100.0 * done / max(self.total, 1):.1f}%) "
            f"{rate:.0f} img/s {bytes_in / dt / 1e6:.1f} MB/s ETA {eta_s} skipped {skipped}"
        )
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")


# --------------------------------------------------------------------------- driver
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
    workers = workers or usable_cores()
    t0 = time.monotonic()

    plan = scan(src)
    options = {"max_side": max_side, "quality": quality if max_side is not None else None,
               "keep_progressive": bool(keep_progressive)}
    fingerprint = plan.fingerprint(options)

    exists = os.path.exists(os.path.join(dst, "data.mdb"))
    if exists and not resume:
        raise ConvertError(f"{dst}: already holds an LMDB cache; pass --resume to continue it, or remove it")
    os.makedirs(dst, exist_ok=True)
    env = lmdb.open(dst, map_size=map_size, subdir=True, readonly=False, lock=True, max_dbs=0, sync=True)
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
                state = _load_state(txn, dst)
            elif nonempty:
                raise ConvertError(f"{dst}: not a fastdata cache in progress; remove it")
            else:
                state = _State()
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
        _verify(dst, max_side, workers)
    return summary


def _run(env: Any, plan: Plan, st: _State, dst: str, max_side: Optional[int], quality: int, keep_progressive: bool,
         workers: int, on_error: str, batch_size: int, stream: Optional[TextIO]) -> int:
    """Process inputs ``st.next_pos..`` in order, committing batches; returns inputs processed."""
    total = len(plan.items)
    todo = [(pos, plan.abspath(pos)) for pos in range(st.next_pos, total)]
    prog = _Progress(total, st.next_pos, stream)
    run_bytes_in = 0
    pending: List[Result] = []
    pending_bytes = 0

    def commit(end: int) -> None:
        nonlocal pending, pending_bytes
        first_index = len(st.kept)
        kept = [r for r in pending if r[1] is not None]
        transcoded = [r for r in kept if r[5] == cf.STORED_TRANSCODED]
        part = {
            "batch": st.batches, "start": st.next_pos, "end": end, "first_index": first_index,
            "kept": [r[0] for r in kept], "sha256": [r[4].hex() for r in kept],
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
        pending, pending_bytes = [], 0

    def consume(r: Result) -> None:
        nonlocal pending_bytes, run_bytes_in
        if r[1] is None and on_error == "raise":
            commit(r[0])  # keep the good work before the bad file, so --resume starts at it
            raise ConvertError(f"{plan.abspath(r[0])}: {r[2]} (pass --on-error skip to leave such files out)")
        pending.append(r)
        pending_bytes += len(r[1] or b"")
        run_bytes_in += r[3]
        if len(pending) >= batch_size or pending_bytes >= DEFAULT_BATCH_BYTES:
            commit(r[0] + 1)
        prog.update(r[0] + 1, run_bytes_in, len(st.skipped) + sum(1 for p in pending if p[1] is None))

    try:
        if workers <= 1:
            for pos, path in todo:
                consume(process_one(pos, path, max_side, quality, keep_progressive))
        else:
            chunk = max(1, min(32, len(todo) // (workers * 8) or 1))
            chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
            # fork: workers need only this module; forking is ~ms where spawn re-imports numpy.
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(workers, initializer=_worker_init, initargs=(max_side, quality, keep_progressive)) as pool:
                inflight: deque = deque()
                it = iter(chunks)
                # bounded look-ahead keeps memory flat while results are consumed in order
                for c in it:
                    inflight.append(pool.apply_async(_worker_chunk, (c,)))
                    if len(inflight) >= workers * 4:
                        break
                while inflight:
                    results = inflight.popleft().get()
                    nxt = next(it, None)
                    if nxt is not None:
                        inflight.append(pool.apply_async(_worker_chunk, (nxt,)))
                    for r in results:
                        consume(r)
        if pending or st.next_pos < total:
            commit(total)
    finally:
        prog.update(st.next_pos, run_bytes_in, len(st.skipped), force=True)
        prog.close()
    return total - todo[0][0] if todo else 0


def _finalize(env: Any, plan: Plan, st: _State, dst: str, options: Dict[str, Any], fingerprint: str,
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
    reenc = np.asarray(st.reencoded, dtype=np.uint8).tobytes()

    def fn(txn: Any) -> None:
        for b in range(st.batches):
            txn.delete(cf.part_key(b))
        txn.delete(cf.PLAN_KEY)
        txn.put(cf.META_KEY, cf.dumps(meta))
        txn.put(cf.LABELS_KEY, labels)
        txn.put(cf.PATHS_KEY, paths)
        txn.put(cf.SHA256_KEY, sha)
        txn.put(cf.REENCODED_KEY, reenc)
        txn.put(cf.COMPLETE_KEY, cf.dumps({"count": count, "format_version": cf.FORMAT_VERSION}))

    _write(env, fn)
    env.sync(True)


# --------------------------------------------------------------------------- --verify
_VERIFY_SRC: Any = None


def _verify_chunk(args: Tuple[str, Optional[int], int, int]) -> List[str]:
    """Re-read records [lo, hi) of a finished cache; return problems found."""
    global _VERIFY_SRC
    from ..sources.lmdb import LMDBSource

    dst, max_side, lo, hi = args
    if _VERIFY_SRC is None or _VERIFY_SRC.path != os.path.abspath(dst):
        _VERIFY_SRC = LMDBSource(dst)
    src = _VERIFY_SRC
    problems = []
    for i, data in zip(range(lo, hi), src.fetch(range(lo, hi))):
        data = bytes(data)
        try:
            if src.transcoded[i]:
                # the source is not at hand to compare pixels with: check the kind, then decode
                if _use_native():
                    import fastdata

                    if fastdata.probe(data).progressive:
                        problems.append(f"sample {i} ({src.source_path(i)}): transcoded record is still progressive")
                        continue
                _validate(data)
            elif not src.reencoded[i]:
                if hashlib.sha256(data).digest() != src.sha256(i):
                    problems.append(f"sample {i} ({src.source_path(i)}): stored bytes differ from the source checksum")
                    continue
                _validate(data)
            else:
                w, h = _oriented_size(data)
                if max_side is not None and max(w, h) > max_side:
                    problems.append(f"sample {i}: {w}x{h} exceeds --max-side {max_side}")
                _validate(data)
        except Exception as exc:  # report every undecodable record rather than stop at the first
            problems.append(f"sample {i} ({src.source_path(i)}): {type(exc).__name__}: {exc}")
    return problems


def _verify(dst: str, max_side: Optional[int], workers: int) -> None:
    from ..sources.lmdb import LMDBSource

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


# --------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastdata-convert",
        description="Pack an ImageFolder tree or a 'path,label' list file into a crash-safe LMDB cache.",
    )
    p.add_argument("src", metavar="SRC", help="ImageFolder root, or a text file of 'path,label' lines")
    p.add_argument("dst", metavar="DST", help="LMDB directory to create")
    p.add_argument("--max-side", type=int, default=None, metavar="N",
                   help="shrink images whose longer side exceeds N (re-encoded as baseline 4:2:0 JPEG); "
                        "non-JPEG inputs are re-encoded too")
    p.add_argument("--quality", type=int, default=DEFAULT_QUALITY, metavar="Q", help="JPEG quality for re-encoded images")
    p.add_argument("--keep-progressive", action="store_true",
                   help="store progressive JPEGs as they are; by default they are transcoded losslessly to baseline "
                        "(same DCT coefficients, identical decoded pixels, EXIF/ICC kept) so crops decode only "
                        "the rows they need")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="processes (default: all usable cores)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted conversion into DST")
    p.add_argument("--on-error", choices=("skip", "raise"), default="raise",
                   help="bad input files: stop naming the file (raise, default) or leave them out and list them (skip)")
    p.add_argument("--verify", action="store_true", help="re-read and check every record after writing")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, metavar="N", help="records per write transaction")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        summary = convert(
            args.src, args.dst, max_side=args.max_side, quality=args.quality,
            keep_progressive=args.keep_progressive, workers=args.workers,
            resume=args.resume, on_error=args.on_error, verify=args.verify, batch_size=args.batch_size,
            progress=None if args.quiet else sys.stderr,
        )
    except (ConvertError, cf.CacheFormatError, ValueError, OSError) as exc:
        print(f"fastdata-convert: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fastdata-convert: interrupted; continue with --resume", file=sys.stderr)
        return 130
    if summary.already_complete:
        print(f"fastdata-convert: {args.dst} is already complete ({summary.written} images)", file=sys.stderr)
    else:
        print(summary.text(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
