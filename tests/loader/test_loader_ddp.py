"""Loader under ``torchrun`` (2 processes, gloo on CPU): rank and world size come from
torch.distributed with no extra code; shards are disjoint (drop_last) or cover the dataset
with wrap-around padding only; every rank yields the same number of batches, proven by an
all_reduce per batch that would hang (and time out) if one rank had fewer.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

N = 23  # odd, not a multiple of 2 x batch: padding and dropping both matter
BATCH = 3

CHILD = textwrap.dedent(r'''
    import datetime, json, os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from PIL import Image
    import fastdata

    folder, out_dir, backend, device = sys.argv[1:5]
    torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    source = fastdata.FileList(paths, list(range(len(paths))))  # label = dataset index
    result = {"rank": rank, "world": dist.get_world_size()}
    for drop_last in (False, True):
        loader = fastdata.Loader(source, batch_size=int(os.environ["BATCH"]), transform=fastdata.CenterCrop(16),
                                 shuffle=True, seed=1, drop_last=drop_last, threads=1, device=device, backend="native",
                                 dtype=torch.float16 if device == "cuda" else torch.uint8)
        labels, batches = [], 0
        comm_device = "cuda" if backend == "nccl" else "cpu"
        for epoch in range(2):
            loader.set_epoch(epoch)
            for images, y in loader:
                if images.device.type != device:
                    raise SystemExit(f"images on {images.device}, expected {device}")
                batches += 1
                labels.append(y.cpu().tolist())
                # DDP's gradient all_reduce, in miniature: hangs if a rank runs out of batches first.
                dist.all_reduce(torch.ones(1, device=comm_device))
        result[f"drop_last={drop_last}"] = {"len": len(loader), "batches": batches, "labels": labels,
                                            "rank": loader.order.rank, "world": loader.order.world_size}
        loader.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_images(folder: Path, n: int) -> None:
    from PIL import Image

    folder.mkdir()
    for i in range(n):
        Image.new("RGB", (32 + i, 24), (8 * i, 255 - 8 * i, 64)).save(folder / f"{i:03d}.jpg", quality=90)


def run_torchrun(tmp_path: Path, backend: str, device: str, nproc: int = 2) -> dict:
    """Run CHILD under torchrun; returns {rank: result}."""
    images, out = tmp_path / "images", tmp_path / "out"
    write_images(images, N)
    out.mkdir()
    script = tmp_path / "ddp_child.py"
    script.write_text(CHILD)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", "BATCH": str(BATCH)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), str(images), str(out),
           backend, device]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun hung (uneven batch counts would do this); stderr:\n{e.stderr}")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)}


def check_shards(results: dict, nproc: int) -> None:
    for drop_last in (False, True):
        key = f"drop_last={drop_last}"
        per_rank = {r: results[r][key] for r in range(nproc)}
        assert {p["rank"] for p in per_rank.values()} == set(range(nproc)), "rank not taken from torch.distributed"
        assert {p["world"] for p in per_rank.values()} == {nproc}
        assert len({(p["len"], p["batches"]) for p in per_rank.values()}) == 1, "ranks differ in batch count"
        assert per_rank[0]["batches"] == 2 * per_rank[0]["len"]
        for epoch in range(2):
            nb = per_rank[0]["len"]
            shards = [np.concatenate(p["labels"][epoch * nb:(epoch + 1) * nb]) for p in per_rank.values()]
            union = np.concatenate(shards)
            if drop_last:
                assert len(set(union.tolist())) == len(union), f"epoch {epoch}: shards overlap"
                assert len(union) == nproc * ((N // nproc) // BATCH) * BATCH
            else:
                assert set(union.tolist()) == set(range(N)), f"epoch {epoch}: shards do not cover"
                per = -(-N // nproc)
                assert len(union) == per * nproc
                assert len(union) - len(set(union.tolist())) == per * nproc - N  # only the padding repeats


def test_torchrun_gloo_two_ranks_disjoint_equal(tmp_path: Path) -> None:
    check_shards(run_torchrun(tmp_path, "gloo", "cpu"), 2)


@pytest.mark.gpu(2)  # NCCL with two ranks needs two GPUs
def test_torchrun_nccl_two_gpus_disjoint_equal(tmp_path: Path) -> None:
    """The same run with NCCL and CUDA outputs (float16 on each rank's own GPU)."""
    check_shards(run_torchrun(tmp_path, "nccl", "cuda"), 2)
