"""LMDBSource: metadata, random access, refusal of bad caches, concurrent readers."""
from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import threading
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from fastdata.cache import format as cf

lmdb = pytest.importorskip("lmdb")  # the GPU test box has no lmdb

from fastdata.cli.convert import convert
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
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


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
