"""On a CUDA machine with nvImageCodec: the "gpu" decoder on the hardware JPEG engines and the
"hybrid" split, against the native path (issue #14's GPU tests).

Oracles: the native engine's plan (the boxes themselves, not only the pixels: a box one
pixel off still scores 31-50 dB), the native output (PSNR), the native Loader's failures and
labels; and each test asserts how many rows each decoder took, so a GPU decoder that hands
everything to the CPU fails.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import fastdata
from fastdata.cli.demo import build_demo
from fastdata.io.engine import Engine
from fastdata.loader.pipeline import make_backend
from gpu_params import needs_dali, needs_gpu_extra
from imagegen import hard_case_folder, psnr

from repo import ROOT

pytestmark = [pytest.mark.gpu, needs_gpu_extra]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The demo set's mix (baseline 4:2:0/4:2:2/4:4:4, gray, CMYK, progressive, EXIF 2..8, a
    restart marker per MCU row): 96 images. Returns (folder, ImageFolder)."""
    root = build_demo(tmp_path_factory.mktemp("mixed") / "demo", count=96, seed=3, classes=4)
    return str(root), fastdata.ImageFolder(str(root))


def test_gpu_decoder_uses_the_native_plans_boxes_and_matches_native_pixels(mixed, monkeypatch):
    from fastdata.decoders import nvimgcodec

    _, source = mixed
    paths = [source.fetch([i])[0] for i in range(len(source))]
    indices = np.arange(len(paths), dtype=np.int64)
    transform = fastdata.RandomResizedCrop(224)
    with make_backend("gpu", transform, device="cuda", dtype=None, seed=5, threads=4) as gpu, \
            make_backend("native", transform, device="cpu", dtype=None, seed=5, threads=4) as native:
        decoder = gpu.decoders[0]
        seen = []
        real_rows, real_resample = decoder._resample_rows, nvimgcodec.resample_batch

        def recording_rows(batch, decoded):  # the rows the engines got and what they refused
            seen.append([list(decoded.rows), [r for r, st in zip(decoded.rows, decoded.status) if st != 0]])
            return real_rows(batch, decoded)

        def recording_resample(flat, layout, boxes, flips, *args, **kwargs):  # what the kernels were given
            seen[-1] += [np.array(boxes), np.array(flips)]
            return real_resample(flat, layout, boxes, flips, *args, **kwargs)

        decoder._resample_rows = recording_rows
        monkeypatch.setattr(nvimgcodec, "resample_batch", recording_resample)
        a, fa, _ = gpu.run(paths, indices, 1)
        torch.cuda.current_stream().wait_stream(gpu.stream)
        a = a.cpu()
        b, fb, _ = native.run(paths, indices, 1)
        stats = dict(gpu.stats)
    assert not fa and not fb and len(seen) == 1
    rows, refused, boxes, flips = seen[0]
    engine = Engine(2)
    plan = engine.plan([np.fromfile(p, np.uint8) for p in paths], transform, seed=5, epoch=1, indices=indices)
    engine.close()
    # Every baseline 4:2:0, 4:2:2, 4:4:4 and gray JPEG went to the engines (CMYK and progressive
    # go native); they refused few, counted.
    names = fastdata._C.SUBSAMPLING_NAMES
    assert rows == [r for r in range(len(paths)) if plan.components[r] in (1, 3) and not plan.progressive[r]
                    and names[plan.subsamplings[r]] in nvimgcodec.ENGINE_SUBSAMPLINGS]
    assert {names[plan.subsamplings[r]] for r in rows} == {"4:2:0", "4:2:2", "4:4:4", "gray"}
    assert stats["gpu_rejected"] == len(refused) <= 0.1 * len(rows) and stats["gpu_rows"] == len(rows) - len(refused)
    # The boxes and flips the GPU used are the native plan's for (seed, epoch, index), bit for bit.
    kept = [r for r in rows if r not in set(refused)]
    assert np.array_equal(boxes, plan.boxes[kept]) and np.array_equal(flips, plan.flips[kept])
    # The set within 35 dB of native (IDCT and upsampling differ; identical boxes), no row far off.
    mse = ((a.double() - b.double()) ** 2).mean().item()
    assert 10 * np.log10(255 ** 2 / mse) >= 35
    scores = [psnr(a[r], b[r]) for r in range(len(paths))]
    assert min(scores) >= 30, sorted(scores)[:5]
    # The demo set's gray files have 2x2 sampling factors, which the engines decoded 9-12 dB off
    # until engine_bytes gave them 1x1 (docs/results.md, 2026-12-04).
    gray = [r for r in kept if names[plan.subsamplings[r]] == "gray"]
    assert gray and min(scores[r] for r in gray) >= 35, [scores[r] for r in gray]


@pytest.mark.parametrize("backend", ["gpu", "hybrid"])
def test_loader_over_mixed_and_damaged_files_skip_and_raise(tmp_path, backend):
    paths = hard_case_folder(tmp_path)
    source = fastdata.FileList(paths, list(range(len(paths))))

    def epoch(name, on_error):
        cfg = dict(batch_size=len(paths), transform=fastdata.RandomResizedCrop(64), shuffle=False, seed=3,
                   threads=4, device="cuda", dtype=torch.uint8, backend=name, on_error=on_error)
        with fastdata.Loader(source, **cfg) as loader, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            batches = [(x.cpu(), y.cpu()) for x, y in loader]
            return batches, loader.stats()

    (want,), native = epoch("native", "skip")
    (got,), st = epoch(backend, "skip")
    assert st.failures == native.failures >= 2 and torch.equal(got[1], want[1])
    assert st.gpu_rows >= 6 and st.native_rows >= 5, st  # both decoders took rows (CMYK, PNG, ... are native)
    for row in range(len(paths)):
        assert psnr(got[0][row], want[0][row]) >= 27, paths[row]
    with pytest.raises(fastdata.DecodeError, match="garbage.jpg|missing.jpg"):
        epoch(backend, "raise")


def test_hybrid_rebalances_and_three_epochs_do_not_grow_memory(mixed):
    import psutil

    cfg = dict(batch_size=32, transform=fastdata.RandomResizedCrop(224), shuffle=True, seed=1, threads=8,
               device="cuda", dtype=torch.float16, backend="hybrid")
    proc = psutil.Process()
    with fastdata.Loader(mixed[1], **cfg) as loader:
        marks = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for x, _ in loader:
                assert x.shape == (32, 3, 224, 224) and torch.isfinite(x).all()
            torch.cuda.synchronize()
            marks.append((torch.cuda.mem_get_info()[0], proc.memory_info().rss))
        st = loader.stats()
        stages = loader.gpu_stage_seconds()
        balancer = loader._pipeline.balancer
        engine = loader._pipeline.engine
        # the native threads give way to the GPU's feeders (SCHED_IDLE); read before the Loader closes
        assert engine.idle and engine.priority_lowered
    assert balancer is not None and balancer.gpu_rate and balancer.native_rate
    assert st.gpu_rows > 0 and st.native_rows > 0 and 0 < st.gpu_share < 1, st
    assert stages["decode"] > 0 and stages["resample"] > 0 and stages["gpu_wait"] >= 0, stages
    # after the first epoch (allocator pools and engine buffers warmed), nothing grows
    free_drop = marks[1][0] - marks[2][0]
    rss_growth = marks[2][1] - marks[1][1]
    assert free_drop < 64 * 2**20 and rss_growth < 64 * 2**20, marks


LEAVE_AND_EXIT = """
    import sys, torch, fastdata
    loader = fastdata.Loader(fastdata.ImageFolder(sys.argv[1]), batch_size=16, threads=4, device="cuda",
                             prefetch=3, backend=sys.argv[2], dtype=torch.float16)
    it = iter(loader)
    x, y = next(it)
    print("got", tuple(x.shape), flush=True)
"""


@pytest.mark.parametrize("backend", ["gpu", "hybrid"])
def test_break_after_one_batch_then_exit_is_clean(mixed, backend):
    folder = mixed[0]
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(LEAVE_AND_EXIT), folder, backend], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert "terminate called" not in proc.stderr, proc.stderr
        assert proc.returncode == 0, proc.stderr
        assert "got (16, 3, 224, 224)" in proc.stdout


RAISE_AND_EXIT = """
    import sys, torch, fastdata
    from pathlib import Path
    sys.path.insert(0, "tests")
    from imagegen import hard_case_folder
    root = Path(sys.argv[1])
    root.mkdir(parents=True)
    paths = hard_case_folder(root) * 4
    loader = fastdata.Loader(fastdata.FileList(paths, list(range(len(paths)))), batch_size=8, threads=4,
                             device="cuda", backend=sys.argv[2], dtype=torch.float16, on_error="raise")
    try:
        for x, y in loader:
            pass
    except fastdata.DecodeError as e:
        print("raised", type(e).__name__, flush=True)
    sys.exit(0)  # the iterator is still held by the error's traceback: freed by whichever thread collects it
"""


@pytest.mark.parametrize("backend", ["gpu", "hybrid", "nvjpeg", pytest.param("dali", marks=needs_dali)])
def test_a_decode_error_then_exit_is_clean(tmp_path, backend):
    """The hang at exit found on the CPU stand-in (2026-12-02): the epoch iterator, in a cycle through
    the error's traceback, freed on the gpu decoder's resample thread, waited there for a producer that
    waited for that thread. Here on the real decoder: three processes, each must raise and exit 0."""
    for k in range(3):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RAISE_AND_EXIT), str(tmp_path / f"d{k}"), backend],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "terminate called" not in proc.stderr, proc.stderr
        assert proc.returncode == 0 and "raised DecodeError" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)


CTRL_C = """
    import os, signal, sys, threading, torch, fastdata
    delay = float(sys.argv[3])
    loader = fastdata.Loader(fastdata.ImageFolder(sys.argv[1]), batch_size=16, threads=4, device="cuda",
                             prefetch=3, backend=sys.argv[2], dtype=torch.float16)
    if delay < 0:  # before the first batch: while the decoders are made and the first batches decode
        threading.Timer(-delay, os.kill, (os.getpid(), signal.SIGINT)).start()
    first = True
    while True:  # epochs repeat until the signal lands, so it never lands in the interpreter's shutdown
        for x, y in loader:
            if first and delay >= 0:
                first = False
                threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
"""


@pytest.mark.parametrize("delay", [-0.5, 1.0], ids=["before-first-batch", "mid-epoch"])
@pytest.mark.parametrize("backend", ["gpu", "hybrid", "nvjpeg", pytest.param("dali", marks=needs_dali)])
def test_ctrl_c_exits_with_a_keyboard_interrupt(mixed, backend, delay):
    """Ctrl-C into a training loop on a GPU backend ends it like any Python program: a
    KeyboardInterrupt and the SIGINT exit status, nothing from std::terminate, no abort or hang."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CTRL_C), mixed[0], backend, str(delay)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "terminate called" not in proc.stderr, proc.stderr
    # -SIGINT: after an uncaught KeyboardInterrupt Python re-raises the signal on itself. Or 1:
    # CPython clears its "uncaught KeyboardInterrupt" flag whenever any thread compiles a string
    # (exec(), eval(), a dataclass or namedtuple being made) after the KeyboardInterrupt left the
    # main code and before the process ends (`raise KeyboardInterrupt` beside a thread that runs
    # `exec("x = 1")` 0.3 s later exits 1: Python 3.11 on the 2-core box). The likely exec here, not
    # traced: a Triton kernel's first launch builds its argument binder with exec()
    # (triton/runtime/jit.py) on the decoder's resample thread. On the H200 (2026-12-03)
    # gpu, hybrid and nvjpeg exited 1 with the KeyboardInterrupt printed when the signal came
    # before the first batch, nvjpeg once mid-epoch too; dali and the later mid-epoch runs, -2.
    # Any other status (an abort, a segfault, another exception) fails.
    assert proc.returncode in (-2, 1), (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt", proc.stderr[-2000:]
    assert "Exception in thread" not in proc.stderr, proc.stderr[-2000:]
