"""Ending a program mid-epoch: Ctrl-C exits like any Python program (status 130, a clean
KeyboardInterrupt), and leaving an epoch early then exiting exits 0 — nothing from
std::terminate, no SIGABRT (#16 item 3).

The cause was a daemon thread (the Loader's producer, or any thread in decode_batch) still in
native code with the GIL released when the interpreter finalized: CPython ends such a thread
with pthread_exit when it takes the GIL back, and the forced unwind through pybind11's noexcept
gil_scoped_release destructor called std::terminate. Each case runs in a child interpreter
(the abort kills the whole process) under a timeout; the producer is kept busy (a consumer
faster than it, big prefetch) so that it is inside the engine when the program ends.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_params import needs_dali
from imagegen import photo_folder

from repo import ROOT


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """2 classes x 24 photo-like 480x640 JPEGs: a 16-image batch keeps 2 threads busy ~0.1 s."""
    return photo_folder(tmp_path_factory.mktemp("exit_folder"), classes=2, per_class=24, width=480, height=640, seed=7)


def run_child(code: str, folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(folder), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def assert_no_abort(proc: subprocess.CompletedProcess) -> None:
    assert "terminate called" not in proc.stderr, proc.stderr
    assert proc.returncode != -signal.SIGABRT, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr  # e.g. an exit hook failing


SIGINT_MID_EPOCH = """
    import os, signal, sys, threading
    import fastdata
    loader = fastdata.Loader(fastdata.ImageFolder(sys.argv[1]), batch_size=16, threads=2, device="cpu",
                             prefetch=8, backend=sys.argv[2])
    # Ctrl-C arrives while the training loop runs and the producer decodes; epochs repeat
    # until it does, so it never lands in the interpreter's shutdown (a 3-batch epoch could
    # end before a timer fired, which made this test flaky on a loaded box).
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
    while True:
        for x, y in loader:
            pass
"""


@pytest.mark.parametrize("backend", ["native", pytest.param("dali", marks=needs_dali)])
def test_ctrl_c_mid_epoch_exits_130_with_a_keyboard_interrupt(folder, backend):
    for _ in range(3):  # the old code aborted 5 of 5 times; each try must exit cleanly
        proc = run_child(SIGINT_MID_EPOCH, folder, backend)
        assert_no_abort(proc)
        # Python re-raises SIGINT on itself after an uncaught KeyboardInterrupt: a shell sees 130.
        assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
        assert proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr


LEAVE_EPOCH_AND_EXIT = """
    import sys
    import torch
    import fastdata
    batch_size, prefetch = int(sys.argv[3]), int(sys.argv[4])
    loader = fastdata.Loader(fastdata.ImageFolder(sys.argv[1]), batch_size=batch_size, threads=2, device="cpu",
                             prefetch=prefetch, backend=sys.argv[2], dtype=torch.uint8)
    it = iter(loader)  # still referenced at exit, as in a loop left by break at function scope
    x, y = next(it)
    print("got", tuple(x.shape), flush=True)
"""


# native: a busy producer (inside the engine at exit); DALI: many batches left, some in flight
# in the pipeline (DALI's own exit hook shut the pipeline down under the producer).
@pytest.mark.parametrize("backend,batch_size,prefetch", [("native", 16, 8), pytest.param("dali", 4, 2, marks=needs_dali)])
def test_leaving_an_epoch_after_one_batch_then_exiting_exits_0(folder, backend, batch_size, prefetch):
    for _ in range(2):
        proc = run_child(LEAVE_EPOCH_AND_EXIT, folder, backend, str(batch_size), str(prefetch))
        assert_no_abort(proc)
        assert proc.returncode == 0, proc.stderr
        assert f"got ({batch_size}, 224, 224, 3)" in proc.stdout
        assert "Traceback" not in proc.stderr, proc.stderr


DAEMON_THREAD_IN_DECODE_BATCH = """
    import glob, sys, threading
    import fastdata
    paths = sorted(glob.glob(sys.argv[1] + "/*/*.jpg"))
    busy = threading.Event()
    def work():
        while True:
            fastdata.decode_batch(paths[:16], fastdata.RandomResizedCrop(224), threads=2)
            busy.set()
    threading.Thread(target=work, daemon=True).start()
    busy.wait()
    print("exiting", flush=True)
"""


def test_a_daemon_thread_inside_decode_batch_at_exit_does_not_abort(folder):
    """No Loader to close here: the native side itself must survive CPython ending the thread."""
    for _ in range(3):
        proc = run_child(DAEMON_THREAD_IN_DECODE_BATCH, folder)
        assert_no_abort(proc)
        assert proc.returncode == 0, proc.stderr
        assert "exiting" in proc.stdout
