"""RAMCache: equality with its source, budget errors, one copy across processes, crash cleanup."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from fastdata.cache.build.writer import convert
from fastdata.sources.lmdb import LMDBSource
from fastdata.sources.ram import RAMBudgetError, RAMCache
from repo import ROOT



class PathSource:
    """A minimal source returning file paths (like an ImageFolder); no size hint."""

    def __init__(self, paths: List[str]):
        self.paths = paths
        self.classes = ["only"]

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def labels(self) -> np.ndarray:
        return np.zeros(len(self.paths), dtype=np.int64)

    def name(self, i: int) -> str:
        return self.paths[i]

    def fetch(self, indices: Any) -> List[str]:
        return [self.paths[i] for i in indices]


def _files(root: Path, n: int, size: int) -> List[str]:
    rng = np.random.default_rng(n)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = root / f"{i:04d}.bin"
        p.write_bytes(rng.integers(0, 256, size + 131 * i, dtype=np.uint8).tobytes())
        paths.append(str(p))
    return paths


def test_matches_source(tmp_path: Path) -> None:
    paths = _files(tmp_path / "f", 30, 1000)
    src = PathSource(paths)
    ram = RAMCache(src, max_bytes=1 << 20, key=uuid.uuid4().hex)
    assert ram.owner and len(ram) == 30 and ram.classes == ["only"]
    order = [29, 0, 7, 7, np.int64(3)]
    assert [bytes(b) for b in ram.fetch(order)] == [Path(paths[int(i)]).read_bytes() for i in order]
    with pytest.raises(IndexError):
        ram.fetch([30])
    with pytest.raises(TypeError):
        ram.fetch([1])[0][0] = 1  # read-only
    ram.close()

    # over an LMDB cache of real images
    img = tmp_path / "img" / "c"
    img.mkdir(parents=True)
    from PIL import Image

    for i in range(6):
        Image.new("RGB", (64 + i, 48), (i * 40, 0, 0)).save(img / f"{i}.jpg")
    convert(str(tmp_path / "img"), str(tmp_path / "db"), workers=1)
    lm = LMDBSource(str(tmp_path / "db"))
    ram = RAMCache(lm)
    assert [bytes(b) for b in ram.fetch(range(6))] == lm.fetch(range(6))
    np.testing.assert_array_equal(ram.labels, lm.labels)
    ram2 = RAMCache(LMDBSource(str(tmp_path / "db")))  # same cache: joins the first buffer
    assert not ram2.owner and [bytes(b) for b in ram2.fetch([5, 1])] == lm.fetch([5, 1])
    ram.close()
    ram2.close()


def test_budget(tmp_path: Path) -> None:
    paths = _files(tmp_path / "f", 20, 4000)
    key = uuid.uuid4().hex
    with pytest.raises(RAMBudgetError, match=r"more than max_bytes=50000 .*exceeded at sample"):
        RAMCache(PathSource(paths), max_bytes=50_000, key=key)
    ram = RAMCache(PathSource(paths), max_bytes=1 << 20, key=key)  # the failed owner left nothing bound
    assert ram.owner
    ram.close()


_CHILD = textwrap.dedent(
    """
    import hashlib, json, os, sys
    sys.path[:0] = sys.argv[1].split(os.pathsep)  # this test's folder and tests/ (repo.py)
    from test_ram_cache import PathSource, mapping_stats
    from fastdata.sources.ram import RAMCache
    paths = json.loads(sys.argv[2])
    ram = RAMCache(PathSource(paths), max_bytes=1 << 30, key=sys.argv[3])
    for line in sys.stdin:  # each line: report, after touching every page
        digest = [hashlib.sha256(b).hexdigest() for b in ram.fetch(range(len(ram)))]
        print(json.dumps({"owner": ram.owner, "nbytes": ram.nbytes, "digest": digest, **mapping_stats()}), flush=True)
    """
)


def mapping_stats() -> Dict[str, int]:
    """Rss/Pss (bytes) and inode of this process's RAMCache memfd mapping, from /proc/self/smaps."""
    stats: Dict[str, int] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) >= 6 and head[5].startswith("/memfd:fastdata-ram")
                if inside:
                    stats["inode"] = int(head[4])
            elif inside and head[0] in ("Rss:", "Pss:"):
                stats[head[0][:-1].lower()] = stats.get(head[0][:-1].lower(), 0) + int(head[1]) * 1024
    return stats


def _ask(proc: subprocess.Popen) -> Dict[str, Any]:
    proc.stdin.write("report\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"child died: {proc.stderr.read()}")
    return json.loads(line)


def _shm() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_two_processes_share_one_copy_and_crash_leaves_nothing(tmp_path: Path) -> None:
    paths = _files(tmp_path / "f", 16, 256 * 1024)  # ~4 MiB
    expect = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]
    key = uuid.uuid4().hex
    shm_before = _shm()
    argv = [sys.executable, "-c", _CHILD, os.pathsep.join([str(Path(__file__).parent), str(ROOT / "tests")]),
            json.dumps(paths), key]
    opts: Dict[str, Any] = dict(cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    owner = subprocess.Popen(argv, **opts)
    joiner = None
    try:
        a = _ask(owner)
        joiner = subprocess.Popen(argv, **opts)
        b = _ask(joiner)
        a = _ask(owner)
        size = a["nbytes"]
        assert a["owner"] and not b["owner"] and a["digest"] == b["digest"] == expect
        assert a["inode"] == b["inode"]  # the same memory object
        for s in (a, b):
            # each maps every page (Rss = size) but pays half (Pss = size / 2): one copy, two users
            assert s["rss"] >= 0.98 * size, (s, size)
            assert abs(s["pss"] - size / 2) <= 0.05 * size, (s, size)

        os.killpg(owner.pid, signal.SIGKILL)  # the owner crashes
        owner.wait(timeout=10)
        c = _ask(joiner)  # the survivor keeps reading the same pages, now paying for all of them
        assert c["digest"] == expect and c["inode"] == a["inode"]
        assert abs(c["pss"] - size) <= 0.05 * size
        os.killpg(joiner.pid, signal.SIGKILL)
        joiner.wait(timeout=10)
    finally:
        for p in (owner, joiner):
            if p is not None:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                for stream in (p.stdin, p.stdout, p.stderr):
                    stream.close()
    # memfds are not files: nothing of ours may appear in /dev/shm (other users' entries may come and go)
    assert not [n for n in _shm() - shm_before if "fastdata" in n or n.startswith(("psm_", "torch_"))]
    # the abstract socket died with its processes: a newcomer becomes the owner of a fresh copy
    ram = RAMCache(PathSource(paths), key=key)
    assert ram.owner and [hashlib.sha256(b).hexdigest() for b in ram.fetch(range(16))] == expect
    ram.close()
