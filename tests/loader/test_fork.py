"""fastdata after fork() (#16 item 7): fork copies only the calling thread, so in a child (a
DataLoader worker, a multiprocessing pool) the native threads of engines made before the fork
do not exist. decode_batch starts fresh ones there; a Loader or Engine made before the fork
says so ("created before fork") instead of waiting forever or reporting a dead thread.

Every child is watched with a timeout (the old code hung), and reports through its exit
status and a pipe.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import fastdata
from imagegen import photo_folder

RRC = fastdata.RandomResizedCrop(64)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("fork_folder"), classes=2, per_class=8, width=96, height=128, seed=3)


def in_child(fn: Callable[[], dict], timeout: float = 60.0) -> dict:
    """Run ``fn`` in a forked child; its JSON-able result, or a failure if it hangs or dies."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        code = 0
        try:
            out = json.dumps(fn()).encode()
        except BaseException as e:  # reported to the parent, which fails the test
            out = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
            code = 1
        os.write(w, out)
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail(f"the forked child hung for {timeout:.0f} s")
        time.sleep(0.05)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    assert os.WIFEXITED(status), f"child died: status {status}"
    return json.loads(data)


def test_decode_batch_in_a_forked_child_after_the_parent_used_it(folder):
    paths = sorted(str(p) for p in folder.glob("*/*.jpg"))
    want = fastdata.decode_batch(paths, RRC, threads=2, seed=4)  # the parent's shared engine has threads now

    def child() -> dict:
        got = fastdata.decode_batch(paths, RRC, threads=2, seed=4)
        return {"equal": bool(np.array_equal(got, want))}

    assert in_child(child) == {"equal": True}
    # and the parent's engine still works after the fork
    np.testing.assert_array_equal(fastdata.decode_batch(paths, RRC, threads=2, seed=4), want)


def _decode_one(path: str) -> bytes:
    # Two rows: a single row runs on the calling thread alone and never meets the pool.
    return fastdata.decode_batch([path, path], RRC, threads=2, seed=1).tobytes()


def test_decode_batch_in_multiprocessing_fork_workers(folder):
    paths = sorted(str(p) for p in folder.glob("*/*.jpg"))[:4]
    want = [_decode_one(p) for p in paths]  # the parent used its shared engine before the pool forks
    with multiprocessing.get_context("fork").Pool(2) as pool:
        result = pool.map_async(_decode_one, paths)
        got = result.get(timeout=60)  # the old code never returned
    assert got == want


def test_a_loader_iterator_after_fork_says_created_before_fork(folder):
    loader = fastdata.Loader(fastdata.ImageFolder(str(folder)), batch_size=4, threads=2, device="cpu", seed=2)
    it = iter(loader)
    next(it)

    def child() -> dict:
        said = {}
        engine = loader._pipeline.engine
        for name, call in (("next", lambda: next(it)), ("iter", lambda: iter(loader)),
                           ("engine", lambda: engine.run([], RRC, np.empty((0, 64, 64, 3), np.uint8)))):
            try:
                call()
                said[name] = "no error"
            except RuntimeError as e:
                said[name] = str(e)
        loader.close()  # must return: there are no threads to join here
        said["closed"] = True
        return said

    said = in_child(child)
    for name in ("next", "iter"):
        assert "fastdata Loader was created before fork" in said[name], said
    assert "fastdata Engine was created before fork" in said["engine"], said
    assert said["closed"] is True
    # the parent's loader is untouched by the child
    assert len(list(it)) == len(loader) - 1
    loader.close()


def test_an_engine_pool_is_refused_in_a_child_even_past_the_python_check():
    """The native pool's own guard: its parent's workers are not waited for in a child."""
    engine = fastdata.Engine(2)

    def child() -> dict:
        engine._pid = os.getpid()  # pretend the Python-side check passed
        try:
            engine.read_files([os.devnull, os.devnull])
            return {"said": "no error"}
        except RuntimeError as e:
            return {"said": str(e)}

    said = in_child(child)["said"]
    assert "before a fork" in said and "threads do not exist" in said, said
    engine.close()
