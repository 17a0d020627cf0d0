"""Damaged and crafted caches: bit flips found on read, truncated files refused before LMDB maps
them (a SIGBUS would end the process), crafted metadata refused with CacheFormatError (#16)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import lmdb
import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.cache import format as cf
from fastdata.cache.build.writer import convert
from fastdata.cache.lmdb_file import read_lmdb_meta
from fastdata.sources.lmdb import LMDBSource

from repo import ROOT as REPO
N = 12


def _make_src(root: Path) -> Path:
    """12 noisy JPEGs (big enough that a flipped bit lands in entropy-coded data), 2 classes."""
    rng = np.random.default_rng(3)
    for i in range(N):
        d = root / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
        Image.fromarray(arr).save(d / f"{i:02d}.jpg", quality=92)
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cache_damage")
    src = _make_src(root / "src")
    convert(str(src), str(root / "db"), workers=1)
    return src, root / "db"


def _copy(db: Path, to: Path) -> Path:
    to.mkdir()
    (to / "data.mdb").write_bytes((db / "data.mdb").read_bytes())
    return to


def _flip_in_record(db: Path, index: int) -> None:
    """Flip one bit in the middle of sample ``index``'s stored bytes, inside data.mdb."""
    data = bytearray((db / "data.mdb").read_bytes())
    reader = LMDBSource(str(db), verify=False)  # kept while its view is read (views end with the source)
    record = bytes(reader.fetch([index])[0])
    reader.close()
    at = data.find(record)
    assert at >= 0 and data.find(record, at + 1) < 0, "record bytes must occur once in the file"
    data[at + len(record) // 2] ^= 0x10
    (db / "data.mdb").write_bytes(bytes(data))


def _loader(db: Path, on_error: str) -> fastdata.Loader:
    return fastdata.Loader(LMDBSource(str(db)), batch_size=4, transform=fastdata.CenterCrop(32), shuffle=False,
                           device="cpu", dtype=torch.uint8, threads=1, on_error=on_error, drop_last=False)


# ------------------------------------------------------------------ item 2: bit flips
def test_flipped_bit_is_found_on_read_and_named(built: Tuple[Path, Path], tmp_path: Path) -> None:
    _, db = built
    bad = _copy(db, tmp_path / "bad")
    _flip_in_record(bad, 5)
    src = LMDBSource(str(bad))
    got = src.fetch([4, 5, 6])
    assert isinstance(got[1], fastdata.DecodeError) and not isinstance(got[0], fastdata.DecodeError)
    assert got[1].index == 5 and "SHA-256" in got[1].reason and src.source_path(5) in got[1].name
    # the flipped record still decodes (the damage is silent without the check)
    unchecked = LMDBSource(str(bad), verify=False)
    assert fastdata.decode(bytes(unchecked.fetch([5])[0]), strict=False).shape == (96, 128, 3)
    unchecked.close()

    with pytest.raises(fastdata.DecodeError, match=r"sample 5 .*SHA-256"):
        for _ in _loader(bad, "raise"):
            pass
    loader = _loader(bad, "skip")
    with pytest.warns(RuntimeWarning, match="SHA-256"):
        labels = [lab for _, batch_labels in loader for lab in batch_labels.tolist()]
    assert loader.stats().failures == 1 and len(labels) == N  # replaced and counted, never lost


def _record_offset(db: Path, index: int) -> int:
    """Where sample ``index``'s stored bytes start inside data.mdb (they occur there once)."""
    data = (db / "data.mdb").read_bytes()
    reader = LMDBSource(str(db), verify=False)
    record = bytes(reader.fetch([index])[0])
    reader.close()
    at = data.find(record)
    assert at >= 0 and data.find(record, at + 1) < 0, "record bytes must occur once in the file"
    return at + len(record) // 2


def _flip_in_place(db: Path, at: int) -> None:
    """Flip one bit at ``at`` without truncating the file: a reader's memory map sees it."""
    with open(db / "data.mdb", "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def test_verify_modes_are_named_and_checked(built: Tuple[Path, Path]) -> None:
    _, db = built
    assert [LMDBSource(str(db), verify=v).verify for v in (True, False, "once", "always", "off")] == \
        ["once", "off", "once", "always", "off"]
    assert LMDBSource(str(db)).verify == "once"
    for bad in ("sometimes", 1, None):
        with pytest.raises(ValueError, match="verify must be"):
            LMDBSource(str(db), verify=bad)


def test_verify_once_hashes_a_record_at_its_first_read_through_a_map(built: Tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    """"once": a record that passed is not hashed again while the map is open (a bit flipped
    under a reader afterwards goes unseen there); "always", another map (a reopened source) and
    a record that never passed are hashed on every fetch."""
    _, db = built
    bad = _copy(db, tmp_path / "bad")
    at = _record_offset(bad, 5)
    once, always = LMDBSource(str(bad)), LMDBSource(str(bad), verify="always")
    clean = bytes(once.fetch([5])[0])
    assert not isinstance(always.fetch([5])[0], fastdata.DecodeError)
    _flip_in_place(bad, at)
    seen = once.fetch([4, 5])[1]
    assert not isinstance(seen, fastdata.DecodeError) and bytes(seen) != clean  # the flip, unchecked: passed before
    assert isinstance(always.fetch([5])[0], fastdata.DecodeError)
    once.close()  # a new map: nothing counts as checked
    for _ in range(2):  # a record that failed fails on every fetch
        got = once.fetch([4, 5])
        assert not isinstance(got[0], fastdata.DecodeError)
        assert isinstance(got[1], fastdata.DecodeError) and got[1].index == 5 and "SHA-256" in got[1].reason
    fresh = LMDBSource(str(bad))
    assert isinstance(fresh.fetch([5])[0], fastdata.DecodeError)
    for s in (once, always, fresh):
        s.close()


def test_loader_over_a_damaged_record_fails_it_every_epoch(built: Tuple[Path, Path], tmp_path: Path) -> None:
    """verify="once" remembers passes only: the damaged record is replaced (and counted) in
    every epoch, and the clean ones are not hashed again after the first."""
    _, db = built
    bad = _copy(db, tmp_path / "bad")
    _flip_in_record(bad, 7)
    source = LMDBSource(str(bad))
    loader = fastdata.Loader(source, batch_size=4, transform=fastdata.CenterCrop(32), shuffle=True, device="cpu",
                             dtype=torch.uint8, threads=1, on_error="skip", drop_last=False)
    with pytest.warns(RuntimeWarning, match="SHA-256"):
        for epoch in range(3):
            loader.set_epoch(epoch)
            assert sum(len(labels) for _, labels in loader) == N
            assert loader.stats().failures == epoch + 1
    loader.close()
    assert source._verified.sum() == N - 1 and not source._verified[7]


def test_gpu_routing_reads_a_failed_record_as_its_failure(built: Tuple[Path, Path], tmp_path: Path) -> None:
    """The GPU backends' reader (decoders.routing) takes a checksum failure as an unreadable
    row with its reason; the native decoder then names it (it gets the rows GPUs cannot take)."""
    from fastdata.decoders.routing import plan_batch, read_items

    _, db = built
    bad = _copy(db, tmp_path / "bad")
    _flip_in_record(bad, 3)
    source = LMDBSource(str(bad))  # kept: its views end with it
    items = source.fetch([2, 3])
    with fastdata.Engine(1) as engine:
        datas, reasons = read_items(items, engine)
        assert reasons[0] is None and datas[0].size > 0 and "SHA-256" in reasons[1]
        planned = plan_batch(items, np.array([2, 3]), 0, [None, None], engine, fastdata.CenterCrop(32), seed=0)
        assert planned.unplanned == {1}
        report = engine.run(items, fastdata.CenterCrop(32), np.zeros((2, 32, 32, 3), np.uint8), indices=[2, 3])
    assert [(f.index, "SHA-256" in f.reason) for f in report.failures] == [(3, True)]


def test_ram_cache_over_a_damaged_cache_names_the_record(built: Tuple[Path, Path], tmp_path: Path) -> None:
    """Copying a cache into RAM reads every record once: a failing one stops it, named."""
    import uuid

    from fastdata.sources.ram import RAMCache

    _, db = built
    bad = _copy(db, tmp_path / "bad")
    _flip_in_record(bad, 9)
    with pytest.raises(fastdata.DecodeError, match=r"sample 9 .*SHA-256"):
        RAMCache(LMDBSource(str(bad)), key=uuid.uuid4().hex)


def test_flip_in_a_reencoded_record_is_found(built: Tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = built
    db = tmp_path / "small"
    convert(str(src), str(db), workers=1, max_side=48)  # every record re-encoded: source sha does not apply
    assert LMDBSource(str(db)).reencoded.all()
    _flip_in_record(db, 2)
    source = LMDBSource(str(db))
    got = source.fetch(range(N))
    assert [i for i, g in enumerate(got) if isinstance(g, fastdata.DecodeError)] == [2]


def test_cache_without_stored_checksums_checks_original_records(built: Tuple[Path, Path], tmp_path: Path) -> None:
    """Caches written before fastdata:stored_sha256 existed: the source checksum covers records
    stored as the source's bytes."""
    src_root, db = built
    old = _copy(db, tmp_path / "old")
    reader = LMDBSource(str(old), verify=False)
    sources = [(src_root / reader.source_path(i)).read_bytes() for i in range(len(reader))]
    reader.close()
    env = lmdb.open(str(old), subdir=True)
    with env.begin(write=True) as txn:  # as the format-1 writer left it: the source files' bytes
        txn.delete(cf.STORED_SHA256_KEY)
        txn.put(cf.REENCODED_KEY, bytes(len(sources)))
        for i, data in enumerate(sources):
            txn.put(cf.sample_key(i), data)
        meta = cf.loads(txn.get(cf.META_KEY), "meta", str(old))
        meta["format_version"] = 1
        meta["options"].pop("restart_interval_mcus", None)
        txn.put(cf.META_KEY, cf.dumps(meta))
        txn.put(cf.COMPLETE_KEY, cf.dumps({"count": len(sources), "format_version": 1}))
    env.close()
    _flip_in_record(old, 7)
    src = LMDBSource(str(old))
    assert src.checked.all()
    got = src.fetch(range(N))
    assert [i for i, g in enumerate(got) if isinstance(g, fastdata.DecodeError)] == [7]


def test_clean_cache_passes_the_check(built: Tuple[Path, Path]) -> None:
    src, db = built
    s = LMDBSource(str(db))
    views = s.fetch(range(N))
    assert not any(isinstance(v, fastdata.DecodeError) for v in views)
    # Stored as lossless restart-indexed rewrites (format 2): the same pixels as the sources.
    for i, v in enumerate(views):
        np.testing.assert_array_equal(fastdata.decode(bytes(v)), fastdata.decode((src / s.source_path(i)).read_bytes()))


# ------------------------------------------------------------------ item 4: truncation
_OPEN = "import sys, fastdata; fastdata.LMDBSource(sys.argv[1])"


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a child: a SIGBUS there shows as a negative return code, not a dead pytest."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def _truncation_points(size: int, page: int) -> List[int]:
    return sorted({0, 100, page, 2 * page + 10, size // 3, size // 2, size - page, size - 1})


def test_truncated_data_mdb_is_refused_not_sigbus(built: Tuple[Path, Path], tmp_path: Path) -> None:
    _, db = built
    full = (db / "data.mdb").read_bytes()
    meta = read_lmdb_meta(str(db / "data.mdb"))
    assert meta.min_file_size <= len(full)
    for k, cut in enumerate(_truncation_points(len(full), meta.page_size)):
        d = tmp_path / f"cut{k}"
        d.mkdir()
        (d / "data.mdb").write_bytes(full[:cut])
        done = _child(_OPEN, str(d))
        assert done.returncode == 1, (cut, done.returncode, done.stderr[-2000:])
        assert "CacheFormatError" in done.stderr and str(d / "data.mdb") in done.stderr, done.stderr[-2000:]


def test_truncated_data_mdb_refused_by_resume_and_bench(built: Tuple[Path, Path], tmp_path: Path) -> None:
    src, db = built
    full = (db / "data.mdb").read_bytes()
    d = tmp_path / "cut"
    d.mkdir()
    (d / "data.mdb").write_bytes(full[: len(full) // 2])
    for cmd in (["-m", "fastdata.cli.convert", str(src), str(d), "--resume", "--quiet"],
                ["-m", "fastdata.cli.bench", str(d), "--seconds", "0.2", "--compare", "fastdata", "--quiet",
                 "--device", "cpu"]):
        done = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 1, (cmd, done.returncode, done.stderr[-2000:])
        assert "truncated" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_random_bytes_data_mdb_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(np.random.default_rng(1).integers(0, 256, 1 << 16, np.uint8).tobytes())
    with pytest.raises(cf.CacheFormatError, match="not an LMDB file"):
        LMDBSource(str(tmp_path))


# ------------------------------------------------------------------ item 13: crafted metadata
def _with_meta(db: Path, to: Path, edit) -> Path:
    out = _copy(db, to)
    env = lmdb.open(str(out), subdir=True)
    with env.begin(write=True) as txn:
        edit(txn)
    env.close()
    return out


def _set_meta(field: str, value: object):
    def edit(txn) -> None:
        meta = json.loads(txn.get(cf.META_KEY))
        if value is _DELETE:
            del meta[field]
        else:
            meta[field] = value
        txn.put(cf.META_KEY, cf.dumps(meta))
    return edit


_DELETE = object()


def _raw(key: bytes, value: bytes):
    return lambda txn: txn.put(key, value)


CRAFTED = {
    "count_1e400_meta": _set_meta("count", 1e400),  # json.dumps writes Infinity; loads gives inf
    "count_1e400_both": lambda t: (_raw(cf.META_KEY, t.get(cf.META_KEY).replace(b'"count":12', b'"count":1e400'))(t),
                                   _raw(cf.COMPLETE_KEY, b'{"count":1e400,"format_version":1}')(t)),
    "count_bool": _set_meta("count", True),
    "classes_int": _set_meta("classes", 3),
    "classes_null": _set_meta("classes", None),
    "classes_not_strings": _set_meta("classes", [1, 2]),
    "no_bytes_out": _set_meta("bytes_out", _DELETE),
    "bytes_out_string": _set_meta("bytes_out", "12"),
    "skipped_not_list": _set_meta("skipped", {"a": 1}),
    "source_null": _set_meta("source", None),
    "meta_nested_200000": _raw(cf.META_KEY, b"[" * 200_000 + b"]" * 200_000),
    "complete_nested_200000": _raw(cf.COMPLETE_KEY, b"{\"a\":" * 200_000 + b"1" + b"}" * 200_000),
    "meta_not_object": _raw(cf.META_KEY, b"[1,2,3]"),
    "complete_count_string": _raw(cf.COMPLETE_KEY, b'{"count":"12","format_version":1}'),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_metadata_gives_cache_format_error(built: Tuple[Path, Path], tmp_path: Path, case: str) -> None:
    _, db = built
    bad = _with_meta(db, tmp_path / "bad", CRAFTED[case])
    with pytest.raises(cf.CacheFormatError):
        LMDBSource(str(bad))


def _patch_meta_pages(path: Path, offset: int, fmt: str, value: int) -> None:
    """Write ``value`` at ``offset`` of both LMDB meta pages (pages 0 and 1)."""
    data = bytearray(path.read_bytes())
    page = struct.unpack_from("<I", data, 40)[0]
    for base in (0, page):
        struct.pack_into(fmt, data, base + offset, value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("what,offset,fmt,value", [
    ("last_page_2_40", 136, "<Q", 1 << 40),
    ("page_size_3", 40, "<I", 3),
    ("magic", 16, "<I", 0x12345678),
    ("main_root_past_end", 128, "<Q", 1 << 50),
])
def test_crafted_lmdb_meta_pages_refused_in_a_child(built: Tuple[Path, Path], tmp_path: Path, what: str,
                                                    offset: int, fmt: str, value: int) -> None:
    _, db = built
    bad = _copy(db, tmp_path / what)
    _patch_meta_pages(bad / "data.mdb", offset, fmt, value)
    done = _child(_OPEN, str(bad))
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "CacheFormatError" in done.stderr and "MemoryError" not in done.stderr, done.stderr[-2000:]


def test_crafted_progress_record_on_resume(built: Tuple[Path, Path], tmp_path: Path) -> None:
    """An interrupted cache whose progress record lacks fields: CacheFormatError, not KeyError."""
    src, _ = built
    dst = tmp_path / "partial"
    env = lmdb.open(str(dst), subdir=True)
    from fastdata.cache.build.scan import scan

    options = {"max_side": None, "quality": None, "keep_progressive": False,
               "restart_interval_mcus": cf.RESTART_INTERVAL_MCUS}  # as the writer fingerprints them
    with env.begin(write=True) as txn:
        txn.put(cf.PLAN_KEY, cf.dumps({"fingerprint": scan(str(src)).fingerprint(options)}))
        txn.put(cf.part_key(0), cf.dumps({"batch": 0, "start": 0}))
    env.close()
    code = textwrap.dedent("""
        import sys
        from fastdata.cache.build.writer import convert
        convert(sys.argv[1], sys.argv[2], workers=1, resume=True)
    """)
    done = _child(code, str(src), str(dst))
    assert done.returncode == 1 and "CacheFormatError" in done.stderr and "has no field" in done.stderr, \
        done.stderr[-2000:]


def test_sigbus_would_show_as_a_negative_return_code(tmp_path: Path) -> None:
    """The harness itself: reading a mapped page past the end of a file really is a SIGBUS in a
    child, so the tests above would see one as a return code (not as a crashed pytest)."""
    f = tmp_path / "short"
    f.write_bytes(b"x" * (1 << 16))
    code = ("import mmap, os, sys; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 1 << 16, "
            "prot=mmap.PROT_READ); os.truncate(sys.argv[1], 1); print(m[1 << 15])")
    done = _child(code, str(f))
    assert done.returncode == -signal.SIGBUS


def test_convert_verify_names_a_damaged_record(built: Tuple[Path, Path], tmp_path: Path) -> None:
    # --verify hashes each record once (its fetch's check) and compares checksums for the rest
    from fastdata.cache.build.verify import verify
    from fastdata.cache.errors import ConvertError

    _, db = built
    good = _copy(db, tmp_path / "good")
    verify(str(good), None, workers=1)  # a clean copy passes
    bad = _copy(db, tmp_path / "bad")
    _flip_in_record(bad, 2)
    with pytest.raises(ConvertError, match=r"verification failed for 1 record\(s\):.*SHA-256"):
        verify(str(bad), None, workers=1)
    source = LMDBSource(str(good))
    assert all(source.stored_sha256(i) == source.sha256(i) or source.restart_indexed[i] or source.reencoded[i]
               or source.transcoded[i] for i in range(len(source)))
