"""LMDBSource: metadata, random access, refusal of bad caches, concurrent readers."""
from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import threading
from pathlib import Path
from typing import List, Tuple

import lmdb
import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from fastdata.cache import format as cf
from fastdata.cache.build.records import stored_bytes
from fastdata.cache.build.writer import convert
from fastdata.sources.lmdb import LMDBSource


def _build(root: Path) -> Tuple[Path, ImageFolder]:
    for i in range(24):
        d = root / "src" / f"class{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        arr = np.full((40 + i, 64, 3), (i * 37 % 256, i * 11 % 256, 255 - i), dtype=np.uint8)
        Image.fromarray(arr).save(d / f"{i:03d}.jpg", quality=90)
    convert(str(root / "src"), str(root / "db"), workers=1)
    return root / "db", ImageFolder(str(root / "src"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, ImageFolder]:
    return _build(tmp_path_factory.mktemp("lmdb"))


def _hashes(paths: List[str]) -> List[str]:
    """SHA-256 of what the cache stores for each file: the writer's lossless restart-indexed
    rewrite of these JPEGs (tests/integration/test_convert.py checks that rewrite itself)."""
    return [hashlib.sha256(stored_bytes(Path(p).read_bytes(), None, 90, False)[0]).hexdigest() for p in paths]


def test_metadata_and_fetch(cache: Tuple[Path, ImageFolder]) -> None:
    db, ref = cache
    s = LMDBSource(str(db))
    assert len(s) == len(ref.samples) and s.classes == ref.classes
    np.testing.assert_array_equal(s.labels, ref.targets)
    with pytest.raises(ValueError):
        s.labels[0] = 5  # read-only view
    order = [5, np.int64(3), 5, 0, len(s) - 1]
    got = s.fetch(order)
    assert [hashlib.sha256(g).hexdigest() for g in got] == _hashes([ref.samples[int(i)][0] for i in order])
    assert s.fetch([]) == []
    with pytest.raises(IndexError, match="out of range"):
        s.fetch([0, len(s)])
    assert ref.samples[3][0].endswith(s.source_path(3)) and s.source_path(3) in s.name(3)
    # a second source on the same path in one process shares the environment
    t = LMDBSource(str(db))
    assert t.fetch([1]) == s.fetch([1])
    t.close()
    assert s.fetch([2]) == LMDBSource(str(db)).fetch([2])
    # picklable for spawn-started workers (the environment is reopened there, never pickled)
    u = pickle.loads(pickle.dumps(s))
    assert u.fetch([4]) == s.fetch([4])


def _edit(db: Path, fn) -> None:
    env = lmdb.open(str(db), subdir=True)
    with env.begin(write=True) as txn:
        fn(txn)
    env.close()


def test_refuses_incomplete_newer_and_missing(tmp_path: Path) -> None:
    db, _ = _build(tmp_path)
    _edit(db, lambda t: t.put(cf.COMPLETE_KEY, cf.dumps({"count": 24, "format_version": cf.FORMAT_VERSION + 1})))
    with pytest.raises(cf.CacheFormatError, match=r"newer than this fastdata supports"):
        LMDBSource(str(db))
    _edit(db, lambda t: t.delete(cf.COMPLETE_KEY))
    with pytest.raises(cf.CacheFormatError, match=r"incomplete.*fastdata-convert --resume"):
        LMDBSource(str(db))
    with pytest.raises(FileNotFoundError):
        LMDBSource(str(tmp_path / "nothing"))


def test_version_1_cache_still_loads(tmp_path: Path) -> None:
    # A cache as format version 1 wrote it: the source files' bytes (no restart index), no
    # value 3 in fastdata:reencoded, version 1 in the metadata and the completion record.
    db, ref = _build(tmp_path)
    sources = [Path(p).read_bytes() for p, _ in ref.samples]

    def to_v1(txn) -> None:
        meta = cf.loads(txn.get(cf.META_KEY), "meta", str(db))
        meta["format_version"] = 1
        del meta["options"]["restart_interval_mcus"]
        txn.put(cf.META_KEY, cf.dumps(meta))
        txn.put(cf.COMPLETE_KEY, cf.dumps({"count": len(sources), "format_version": 1}))
        txn.put(cf.REENCODED_KEY, bytes(len(sources)))
        txn.put(cf.STORED_SHA256_KEY, b"".join(hashlib.sha256(d).digest() for d in sources))
        for i, data in enumerate(sources):
            txn.put(cf.sample_key(i), data)

    _edit(db, to_v1)
    s = LMDBSource(str(db))
    assert s.meta["format_version"] == 1 and not s.restart_indexed.any()
    assert [bytes(b) for b in s.fetch(range(len(s)))] == sources
    # and the Loader decodes it on the plain path, as the same files from the folder
    import fastdata

    rrc = fastdata.RandomResizedCrop(32)
    with fastdata.Loader(s, 8, rrc, shuffle=False, threads=2, device="cpu") as cached, \
            fastdata.Loader(fastdata.ImageFolder(str(tmp_path / "src")), 8, rrc, shuffle=False, threads=2,
                            device="cpu") as folder:
        batches = 0
        for (a, la), (b, lb) in zip(cached, folder):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            np.testing.assert_array_equal(la.numpy(), lb.numpy())
            batches += 1
        assert batches == len(sources) // 8


_INHERITED: LMDBSource


def _read_all(seed: int) -> List[Tuple[int, str]]:
    s = _INHERITED  # created and used by the parent before the fork
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(10):
        idx = rng.permutation(len(s))[:16]
        out += [(int(i), hashlib.sha256(b).hexdigest()) for i, b in zip(idx, s.fetch(idx))]
    return out


def test_concurrent_processes_and_threads(cache: Tuple[Path, ImageFolder]) -> None:
    global _INHERITED
    db, ref = cache
    expect = _hashes([p for p, _ in ref.samples])
    _INHERITED = LMDBSource(str(db))
    _INHERITED.fetch([0])  # the parent holds an open environment across the fork
    with multiprocessing.get_context("fork").Pool(3) as pool:
        results = pool.map(_read_all, range(6))
    assert sum(len(r) for r in results) == 6 * 10 * 16
    for r in results:
        for i, h in r:
            assert h == expect[i]

    errors: List[BaseException] = []

    def reader(seed: int) -> None:
        try:
            for i, h in _read_all(seed):
                if h != expect[i]:
                    raise AssertionError(f"sample {i} differs")
        except BaseException as exc:  # re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---------------------------------------------------------------- views that outlive their fetch
# Each case runs in a child interpreter: on a view into unmapped memory the process dies with
# SIGSEGV, which must fail the test, not end the test run.
_VIEW_LIFETIME_CASES = {
    # the source is garbage-collected (its environment closed) while its view is still read
    "temporary_source": "v = LMDBSource(db).fetch([3])[0]\nout(3, v)",
    # close() while views are alive; the views of the next fetch and those of the one before
    "close_then_read": ("s = LMDBSource(db)\na = s.fetch([1, 2])\nb = s.fetch([5])\ns.close()\ndel s\n"
                        "out(1, a[0]); out(2, a[1]); out(5, b[0])"),
    # a slice and a numpy array over a view outlive the view and the source
    "derived_views": ("import numpy as np\ns = LMDBSource(db)\nv = s.fetch([7])[0]\npart = v[2:]\n"
                      "arr = np.frombuffer(v, np.uint8)\ndel v, s\nout(7, bytes(arr))\n"
                      "if bytes(part) != expected[7][2:]: raise SystemExit('slice differs')"),
    # a forked child reads a view its parent fetched, then fetches through its own copy
    "fork": ("s = LMDBSource(db)\nv = s.fetch([4])[0]\npid = os.fork()\n"
             "if pid == 0:\n    s.close(); out(4, v); out(6, LMDBSource(db).fetch([6])[0]); os._exit(0)\n"
             "_, status = os.waitpid(pid, 0)\nif status != 0: raise SystemExit(f'fork child: status {status}')\n"
             "del s\nout(4, v)"),
}


@pytest.mark.parametrize("case", sorted(_VIEW_LIFETIME_CASES))
def test_views_keep_the_cache_mapped(cache: Tuple[Path, ImageFolder], case: str) -> None:
    """Bad use never crashes: a view stays readable and holds its record's bytes for as long
    as it (or anything made from it) is alive, whatever happened to its source."""
    import json
    import subprocess
    import sys

    db, _ = cache
    source = LMDBSource(str(db))  # held while its views are copied (the test's own reads stay safe today)
    expected = [bytes(b) for b in source.fetch(range(8))]
    source.close()
    script = "\n".join([
        "import json, os, sys",
        "from fastdata.sources.lmdb import LMDBSource",
        "db, expected = sys.argv[1], [bytes.fromhex(h) for h in json.loads(sys.argv[2])]",
        "def out(i, view):",
        "    if bytes(view) != expected[i]: raise SystemExit(f'record {i} differs')",
        _VIEW_LIFETIME_CASES[case],
        "print('ok')",
    ])
    proc = subprocess.run([sys.executable, "-c", script, str(db), json.dumps([e.hex() for e in expected])],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr[-2000:]


def test_the_environment_closes_after_the_last_source_and_view(tmp_path: Path) -> None:
    """Views hold the cache open, and only they: once the last one goes, the file is closed."""
    import gc
    import os

    db, _ = _build(tmp_path)  # its own cache: no source of another test holds it open
    data = os.path.realpath(db / "data.mdb")

    def open_count() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == data)

    gc.collect()
    before = open_count()
    assert before == 0
    s = LMDBSource(str(db))
    views = s.fetch([0, 1])
    part = np.frombuffer(views[1], np.uint8)[4:]
    s.close()
    del s
    assert open_count() == 1
    del views
    assert open_count() == 1  # the array made from a view holds it too
    del part
    assert open_count() == 0
