"""The command-line tools on bad arguments: one line naming the path and the cause, a non-zero
exit, never a traceback (#16 items 12, 14, 15, 16). Each runs as a real child process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.cache.build.writer import convert
from fastdata.cli.demo import usable_cores

from repo import ROOT as REPO


def _cli(*args: str, as_nobody: bool = False) -> subprocess.CompletedProcess:
    """``python -m fastdata.<tool> args``; ``as_nobody``: as user nobody when this is root (root
    writes anywhere), through util-linux's setpriv."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    prefix: List[str] = []
    if as_nobody and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a folder read-only for the child")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run([*prefix, sys.executable, "-m", *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=env)


def _one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode != 0, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, done.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])


@pytest.fixture()
def shared_tmp() -> Iterator[Path]:
    """A temporary folder any user can enter (pytest's are private to their owner)."""
    d = Path(tempfile.mkdtemp(prefix="fastdata-cli-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _src(root: Path, per_class: int = 3) -> Path:
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            arr = np.full((20, 24, 3), (40 * i, 90, 200 if c == "a" else 10), np.uint8)
            Image.fromarray(arr).save(root / c / f"{i}.jpg")
    return root


# ------------------------------------------------------------------ fastdata-convert
def test_convert_refuses_destination_inside_source(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    done = _cli("fastdata.cli.convert", str(src), str(src / "cache"), "--quiet")
    _one_line_error(done, str(src / "cache"), "inside the source")
    assert not (src / "cache").exists()
    assert fastdata.ImageFolder(str(src)).classes == ["a", "b"]  # SRC still a valid ImageFolder
    link = tmp_path / "link"
    link.symlink_to(src)
    _one_line_error(_cli("fastdata.cli.convert", str(link), str(src / "b" / "db"), "--quiet"), "inside the source")
    _one_line_error(_cli("fastdata.cli.convert", str(src), str(src), "--quiet"), "inside the source")
    assert _cli("fastdata.cli.convert", str(src), str(tmp_path / "src-cache"), "--quiet").returncode == 0  # a sibling is fine


def test_convert_workers_validated_and_capped(tmp_path: Path) -> None:
    from fastdata.cache.build.writer import worker_count

    assert worker_count(None) == usable_cores()
    assert worker_count(100_000) == usable_cores()
    assert worker_count(1) == 1
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="workers"):
            worker_count(bad)
    src = _src(tmp_path / "src")
    done = _cli("fastdata.cli.convert", str(src), str(tmp_path / "db"), "--workers", "100000")
    assert done.returncode == 0 and f"using {usable_cores()}" in done.stderr, done.stderr
    _one_line_error(_cli("fastdata.cli.convert", str(src), str(tmp_path / "db0"), "--workers", "0"), "workers")


def test_convert_workers_never_fork_more_than_the_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.context

    sizes: List[int] = []
    real_pool = multiprocessing.context.ForkContext.Pool

    def pool(self, processes=None, *a, **kw):
        sizes.append(processes)
        if processes is None or processes > usable_cores():
            raise AssertionError(f"asked for a pool of {processes} processes")  # before forking any
        return real_pool(self, processes, *a, **kw)

    monkeypatch.setattr(multiprocessing.context.ForkContext, "Pool", pool)
    convert(str(_src(tmp_path / "src")), str(tmp_path / "db"), workers=100_000)
    assert sizes and max(sizes) <= usable_cores()


def test_convert_into_read_only_dir(shared_tmp: Path) -> None:
    src = _src(shared_tmp / "src")
    ro = shared_tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    for dst in (ro, ro / "db"):
        done = _cli("fastdata.cli.convert", str(src), str(dst), "--quiet", as_nobody=True)
        _one_line_error(done, str(dst), "ermission denied")


def test_convert_resume_into_junk(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    for name, junk in (("short", b"junk\n"), ("noise", np.random.default_rng(0).bytes(20000))):
        dst = tmp_path / name
        dst.mkdir()
        (dst / "data.mdb").write_bytes(junk)
        _one_line_error(_cli("fastdata.cli.convert", str(src), str(dst), "--resume", "--quiet"), str(dst / "data.mdb"))


def test_convert_a_jpeg_file_as_source(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    jpeg = src / "a" / "0.jpg"
    _one_line_error(_cli("fastdata.cli.convert", str(jpeg), str(tmp_path / "db"), "--quiet"), str(jpeg),
                    "not a 'path,label' list file")


# ------------------------------------------------------------------ fastdata-bench
BENCH = ("fastdata.cli.bench", "--seconds", "0.2", "--compare", "fastdata", "--device", "cpu", "--quiet")


def test_bench_bad_data_arguments(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    jpeg = src / "a" / "0.jpg"
    _one_line_error(_cli(BENCH[0], str(jpeg), *BENCH[1:]), str(jpeg))
    empty = tmp_path / "empty"
    (empty / "cls").mkdir(parents=True)
    _one_line_error(_cli(BENCH[0], str(empty), *BENCH[1:]), str(empty), "no image files")


def test_bench_json_into_missing_folder_fails_before_running(tmp_path: Path) -> None:
    src = _src(tmp_path / "src", per_class=40)
    out = tmp_path / "nonexistent" / "dir" / "x.json"
    done = _cli(BENCH[0], str(src), *BENCH[1:], "--json", str(out))
    _one_line_error(done, str(out), "does not exist")
    assert not out.parent.exists()
    ok = tmp_path / "x.json"
    assert _cli(BENCH[0], str(src), *BENCH[1:], "--json", str(ok)).returncode == 0 and ok.stat().st_size > 0


# ------------------------------------------------------------------ fastdata-doctor
def test_doctor_missing_data_fails(tmp_path: Path) -> None:
    done = _cli("fastdata.cli.doctor", str(tmp_path / "nonexistent"), "--no-gpu")
    assert done.returncode == 1 and "FAIL  data" in done.stdout, done.stdout


@pytest.mark.parametrize("damage", ["truncated", "random_bytes"])
def test_doctor_fails_a_broken_cache(tmp_path: Path, damage: str) -> None:
    src = _src(tmp_path / "src")
    db = tmp_path / "db"
    convert(str(src), str(db), workers=1)
    data = (db / "data.mdb").read_bytes()
    broken = data[: len(data) // 2] if damage == "truncated" else np.random.default_rng(0).bytes(len(data))
    (db / "data.mdb").write_bytes(broken)
    done = _cli("fastdata.cli.doctor", str(db), "--no-gpu")
    assert done.returncode == 1, done.stdout
    line = next(ln for ln in done.stdout.splitlines() if "lmdb_cache" in ln)
    assert "FAIL" in line and "ok" not in line.split("lmdb_cache")[0], done.stdout
