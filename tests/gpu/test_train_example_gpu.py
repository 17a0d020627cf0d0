"""On a CUDA machine: the stall meter's CUDA-event timing, and examples/train.py on the GPU.

Run: python -m pytest tests/gpu/test_train_example_gpu.py -q   (add -m "gpu" to select; slow adds torch.compile)
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from imagegen import two_colour_classes
from repo import load_example

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def train():
    return load_example("train")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return two_colour_classes(tmp_path_factory.mktemp("colours_gpu"), 96, size=(80, 96))


def _kernel_seconds(work, reps: int = 5) -> float:
    work()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        work()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


@pytest.mark.parametrize("loader_ms,kernel_factor", [(30, 0.25), (5, 4.0)])
def test_cuda_events_measure_gpu_idle_time(loader_ms, kernel_factor):
    from fastdata.diagnostics.stall import StallMeter

    a = torch.randn(4096, 4096, device="cuda")
    one = _kernel_seconds(lambda: a @ a)
    n = max(1, round(kernel_factor * loader_ms / 1e3 / one))  # matmuls per step: ~factor x the loader time
    k = _kernel_seconds(lambda: [a @ a for _ in range(n)])

    def batches():
        for _ in range(30):
            time.sleep(loader_ms / 1e3)
            yield a

    meter = StallMeter(warmup=3, gpu_util=True)
    for x in meter.wrap(batches()):
        for _ in range(n):
            x @ x  # queued asynchronously: host clocks would not see it
    rep = meter.report()
    meter.close()
    assert rep.timing == "cuda-events"
    x_s = loader_ms / 1e3
    truth = max(0.0, x_s - k) / max(x_s, k)  # GPU idle share per step
    assert abs(rep.data_wait_fraction - truth) < 0.08, (rep.data_wait_fraction, truth, k)
    assert rep.verdict == ("input-bound" if kernel_factor < 1 else "compute-bound")
    print(f"\nloader {loader_ms} ms, kernels {1e3 * k:.1f} ms: {rep.summary()}")


COMMON = ["--arch", "resnet18", "--batch-size", "32", "--image-size", "64", "--steps", "20",
          "--log-every", "10", "--warmup-steps", "3", "--val-fraction", "0.25", "--workers", "4"]


def _check(s: dict, inp: str) -> None:
    assert s["input"] == inp and s["steps"] == 20
    assert math.isfinite(s["final_loss"])
    assert s["timing"] == "cuda-events"
    assert s["images_per_s"] > 0 and 0 <= s["data_wait_fraction"] <= 1
    if inp != "synthetic":
        # Colour decides the class, so wrong labels or pixels score ~0.5; 39 of 48 by chance has
        # p < 1e-5. Not 0.9: after 20 steps the eval-mode BatchNorm statistics are rough, and
        # fp16 with GradScaler can skip early steps (43 of 48 once on an H100, fortieth session)
        assert s["val_images"] == 48 and s["top1"] >= 0.8, s


def test_dataloader_bf16(train, data):
    _check(train.main([str(data), "--loader", "dataloader", "--amp", "bf16", *COMMON]), "dataloader")


def test_fastdata_bf16(train, data):
    _check(train.main([str(data), "--loader", "fastdata", "--amp", "bf16", *COMMON]), "fastdata")


def test_fastdata_fp16_gradscaler(train, data):
    _check(train.main([str(data), "--loader", "fastdata", "--amp", "fp16", *COMMON]), "fastdata")


def test_synthetic(train):
    s = train.main(["--synthetic", "--num-classes", "10", *COMMON])
    _check(s, "synthetic")
    assert s["data_wait_fraction"] < 0.05  # nothing to wait for


def test_profile_steps_print_each_streams_gpu_time(train, data, capsys):
    # The profiled steps come after the warm-up, then the step in whose wake the profile is
    # written, then the measured ones; the model's stream and at least one of the input's
    # (the loader's copy and normalize, nvImageCodec's) show.
    s = train.main([str(data), "--loader", "fastdata", "--amp", "bf16", "--profile-steps", "3", *COMMON])
    _check(s, "fastdata")
    out = capsys.readouterr().out
    assert "profile of 3 steps: the GPU ran something" in out, out
    streams = [line for line in out.splitlines() if line.startswith("  stream ")]
    assert len(streams) >= 2, out
    assert s["loader"]["batches"] == 20 - 3 - 3 - 1 and s["steps_measured"] <= s["loader"]["batches"], s
    with pytest.raises(SystemExit, match="needs --warmup-steps >= 1"):
        train.main([str(data), "--loader", "fastdata", "--profile-steps", "17", *COMMON])


@pytest.mark.slow
def test_compile(train, data):
    _check(train.main([str(data), "--loader", "dataloader", "--compile", *COMMON]), "dataloader")


def test_doctor_measures_the_gpu(capsys):
    import json

    from fastdata.cli import doctor

    rc = doctor.main(["--json"])
    out = json.loads(capsys.readouterr().out)
    f = {x["name"]: x for x in out["findings"]}
    assert f["cuda"]["value"]["available"] is True
    assert f["gpu0"]["value"]["name"] == torch.cuda.get_device_name(0)
    assert f["pinned_memory"]["status"] == "ok"
    bw = f["h2d_bandwidth"]["value"]
    assert bw["pinned_GBps"] > bw["pageable_GBps"] > 0
    assert rc == out["exit_status"]
    print("\n" + json.dumps({k: f[k]["value"] for k in ("cuda", "h2d_bandwidth", "decode_rate")}))
