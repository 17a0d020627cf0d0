"""examples/train.py trains on a tiny generated dataset with each input pipeline (CPU).

The two classes differ in colour (red vs blue, with noise), so a model that sees images
with their right labels reaches high held-out accuracy in a few dozen steps, and one fed
misaligned labels or garbage stays near chance: the accuracy checks the whole pipeline.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from imagegen import two_colour_classes
from repo import ROOT, load_example

train = load_example("train")


@pytest.fixture(autouse=True)
def one_torch_thread():
    # On 2 shared cores, torch's 2 spinning OpenMP threads run a tiny model ~10x slower
    # than one thread whenever another process holds a core.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return two_colour_classes(tmp_path_factory.mktemp("colours"), 40)


COMMON = ["--arch", "small_resnet", "--batch-size", "8", "--image-size", "32", "--steps", "24",
          "--log-every", "4", "--warmup-steps", "2", "--val-fraction", "0.25", "--device", "cpu"]


def _check_run(summary: dict, loader: str) -> None:
    assert summary["input"] == loader
    assert summary["steps"] == 24
    assert math.isfinite(summary["final_loss"])
    assert summary["val_images"] == 20  # 25% of 80, all held-out images evaluated
    assert summary["top1"] >= 0.9, summary  # colour decides the class: chance would be ~0.5
    assert summary["images_per_s"] > 0
    assert 0.0 <= summary["data_wait_fraction"] <= 1.0
    assert summary["verdict"] in ("input-bound", "compute-bound", "balanced")
    assert summary["timing"] == "host"
    assert summary["gil_wait_ms_p50"] >= 0 and 0.0 <= summary["gil_late_fraction"] <= 1.0  # the GIL probe ran
    assert summary["steps_measured"] >= 12 - 2 - 3  # warm-up and the last step of each log window


def test_dataloader_pipeline_trains(data, tmp_path):
    results = tmp_path / "runs.jsonl"
    s = train.main([str(data), "--loader", "dataloader", "--workers", "1", "--results", str(results), *COMMON])
    _check_run(s, "dataloader")
    (line,) = results.read_text().splitlines()
    assert json.loads(line)["top1"] == s["top1"]


def test_fastdata_pipeline_trains(data):
    s = train.main([str(data), "--loader", "fastdata", "--workers", "2", *COMMON])
    _check_run(s, "fastdata")
    assert s["backend"] == "auto"


def test_backend_reaches_the_loader(data, tmp_path, capsys):
    results = tmp_path / "runs.jsonl"
    s = train.main([str(data), "--loader", "fastdata", "--backend", "native", "--workers", "2",
                    "--results", str(results), *COMMON])
    _check_run(s, "fastdata")
    assert s["backend"] == "native"
    # the loader's side of the run: all rows native, no GPU decoder stages; the table shows it under the run
    assert s["loader"]["gpu_share"] == 0.0 and "gpu_stage_ms_per_batch" not in s["loader"]
    # the batches after the warm-up (mark); the meter closes a step when the next batch is asked
    # for, so the last one delivered is not among its measured steps
    assert s["loader"]["batches"] == 24 - 2 and s["steps_measured"] == 24 - 2 - 1
    assert 0 < s["loader"]["native_occupancy"] <= 1 and s["loader"]["failures"] == 0
    capsys.readouterr()
    train.main(["--table", str(results)])
    assert "- small_resnet fastdata native" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs device='cuda'"):  # the Loader got it: hybrid needs CUDA
        train.main([str(data), "--loader", "fastdata", "--backend", "hybrid", "--workers", "2", *COMMON])


def test_no_eval_makes_no_validation_loader(data, monkeypatch):
    # A Loader makes its decoder and threads when it is made (a hybrid one's nvImageCodec
    # instances took 16.5 s on an H100 before they were shared): under --no-eval nothing reads
    # a validation Loader.
    made = []

    class Counting(train.FastdataPipeline):
        def __init__(self, src, args, training, *rest):
            made.append(training)
            super().__init__(src, args, training, *rest)
    monkeypatch.setattr(train, "FastdataPipeline", Counting)
    s = train.main([str(data), "--loader", "fastdata", "--backend", "native", "--workers", "2", "--no-eval", *COMMON])
    assert made == [True] and "top1" not in s and s["steps"] == 24
    made.clear()
    s = train.main([str(data), "--loader", "fastdata", "--backend", "native", "--workers", "2", *COMMON])
    assert made == [True, False] and s["val_images"] == 20


def test_synthetic_and_table(data, tmp_path, capsys):
    results = tmp_path / "runs.jsonl"
    s = train.main(["--synthetic", "--num-classes", "5", "--results", str(results), "--no-gil-probe", *COMMON])
    assert s["input"] == "synthetic" and s["steps"] == 24 and "top1" not in s
    assert s.get("gil_late_fraction") is None  # no probe thread: nothing measured, and nothing made up
    train.main([str(data), "--loader", "dataloader", "--workers", "0", "--no-eval", "--results", str(results), *COMMON])
    capsys.readouterr()
    train.main(["--table", str(results)])
    table = capsys.readouterr().out.strip().splitlines()
    assert len(table) == 2 + 2
    assert "| small_resnet | synthetic |" in table[2] and "100.0%" in table[2]
    runs = [json.loads(x) for x in results.read_text().splitlines()]
    share = 100 * runs[1]["images_per_s"] / runs[0]["images_per_s"]
    assert f"{share:.1f}%" in table[3]


def test_split_is_disjoint_seeded_and_labels_follow_folders(data):
    tr, va = train.split_sources(str(data), 0.25, seed=3)
    names_tr = {tr.name(i) for i in range(len(tr))}
    names_va = {va.name(i) for i in range(len(va))}
    assert len(va) == 20 and len(tr) == 60 and not names_tr & names_va
    assert len(names_tr | names_va) == 80
    tr2, va2 = train.split_sources(str(data), 0.25, seed=3)
    assert [va2.name(i) for i in range(len(va2))] == [va.name(i) for i in range(len(va))]
    for i in range(len(tr)):
        assert Path(tr.name(i)).parent.name == tr.classes[int(tr.labels[i])]
    # DDP shards of the train split are disjoint and cover it.
    shards = [train.shard(tr, r, 3) for r in range(3)]
    assert sorted(s.name(i) for s in shards for i in range(len(s))) == sorted(names_tr)


def test_missing_data_is_an_argument_error():
    with pytest.raises(SystemExit):
        train.main(["--loader", "dataloader"])


@pytest.mark.parametrize("loader", ["fastdata", "dataloader"])
def test_ddp_two_processes_train(data, tmp_path, loader):
    """torchrun with 2 CPU processes (gloo): each rank trains on its shard, the held-out split is
    covered once over both ranks, and every rank runs the same number of steps."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a free port on loopback for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = tmp_path / "runs.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(ROOT / "examples" / "train.py"), str(data), "--loader", loader,
           "--arch", "small_resnet", "--batch-size", "8", "--image-size", "32", "--steps", "6", "--log-every", "3",
           "--warmup-steps", "1", "--val-fraction", "0.25", "--device", "cpu", "--workers", "1",
           "--results", str(results)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads(results.read_text().splitlines()[-1])  # written by rank 0
    assert summary["input"] == loader and summary["world_size"] == 2 and summary["steps"] == 6
    assert summary["val_images"] == 20  # 25% of 80, split over the two ranks
    assert math.isfinite(summary["final_loss"])


def test_profile_steps_without_cuda_says_so_and_checks_its_window(data, capsys):
    s = train.main([str(data), "--loader", "fastdata", "--workers", "2", "--profile-steps", "3", *COMMON])
    assert "--profile-steps: no CUDA device, nothing to profile" in capsys.readouterr().out
    assert s["loader"]["batches"] == 24 - 2  # nothing profiled, nothing more left out
