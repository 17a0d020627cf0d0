"""Loader over TarShards under ``torchrun --nproc_per_node 2`` (gloo, CPU), shards served
over HTTP by the test on 127.0.0.1: ranks come from torch.distributed, each rank reads
disjoint shards, both yield the same number of batches (an all_reduce per batch would hang
otherwise), and together they see every sample exactly once per epoch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import fastdata

from shardserver import ShardServer, write_shards
from test_loader_ddp import free_port

N_SHARDS, PER_SHARD, BATCH = 8, 9, 3

CHILD = textwrap.dedent(r'''
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    import fastdata

    url, out_dir = sys.argv[1:3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    source = fastdata.TarShards(index=url, shuffle_buffer=5, backoff=0.05)
    loader = fastdata.Loader(source, batch_size=int(os.environ["BATCH"]), transform=fastdata.CenterCrop(16),
                             seed=5, threads=1, device="cpu", dtype=torch.uint8)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = []
        for images, y in loader:
            labels += y.tolist()
            dist.all_reduce(torch.ones(1))  # DDP's gradient all_reduce in miniature
        epochs.append(labels)
    result = {"rank": loader.order.rank, "world": loader.order.world_size, "len": len(loader), "epochs": epochs,
              "shards_read": source.stats()["shards_read"]}
    loader.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
''')


def test_torchrun_two_ranks_read_disjoint_shards_over_http(tmp_path: Path) -> None:
    folder, out = tmp_path / "shards", tmp_path / "out"
    write_shards(folder, [PER_SHARD] * N_SHARDS)
    fastdata.TarShards(str(folder) + "/train-{000000..000007}.tar").index.save(str(folder / "index.json"))
    out.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", "BATCH": str(BATCH)}
    with ShardServer(folder) as srv:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script),
               srv.url + "/index.json", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"torchrun hung (uneven batch counts would do this); stderr:\n{e.stderr}")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert results[0]["len"] == results[1]["len"] == N_SHARDS * PER_SHARD // 2 // BATCH
    for epoch in range(2):
        labels = [r["epochs"][epoch] for r in results]
        assert sorted(labels[0] + labels[1]) == list(range(N_SHARDS * PER_SHARD)), f"epoch {epoch}"
        shards = [{lab // PER_SHARD for lab in rank_labels} for rank_labels in labels]
        assert not shards[0] & shards[1] and len(shards[0]) == len(shards[1]) == N_SHARDS // 2
    # 4 shards per epoch each, and at most the 4 of epoch 2, which the producer may begin ahead before close
    assert all(N_SHARDS <= r["shards_read"] <= N_SHARDS + N_SHARDS // 2 for r in results), results
