"""`fastdata-bench` end to end on a tiny generated ImageFolder, with short windows."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastdata.cli import bench, bench_contenders, bench_report
from fastdata.io.host import thread_runqueue_seconds

ABLATION_ORDER = ["baseline", "pin_memory", "workers", "native_decode", "roi_decode", "lmdb", "ram",
                  "cuda_prefetch"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 16 JPEGs, 96-200 px, each encoding its class and index in its colours."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir()
        for i in range(16):
            h, w = int(rng.integers(96, 160)), int(rng.integers(120, 200))
            arr = rng.integers(0, 40, (h, w, 3), dtype=np.uint8)
            arr[..., 0] += np.uint8(70 * c)
            arr[..., 1] += np.uint8(10 * i)
            Image.fromarray(arr).save(root / f"c{c}" / f"{i:03d}.jpg", quality=90)
    return root


def _check_measured(r: dict) -> None:
    assert r["status"] == "ok", r
    for key in ("images_per_s", "mean_images_per_s", "cpu_cores_busy", "cpu_percent", "peak_rss_mb"):
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r[key])
    s = r["spread"]
    assert s["min"] <= s["q1"] <= s["q3"] <= s["max"]
    # images/s is the time-weighted mean of the window rates (tests/cli/test_bench_runner.py)
    assert s["min"] <= r["images_per_s"] <= s["max"]
    assert r["images_per_s"] == pytest.approx(r["timed_images"] / r["timed_seconds"])
    assert r["timed_batches"] >= 2 and r["timed_images"] == 8 * r["timed_batches"]
    assert r["output"].startswith("float32[8x3x224x224] cpu"), r["output"]
    # per thread kind: CPU seconds and seconds waiting for a core, over the timed window (the
    # latter None only where the kernel keeps no run-queue figures)
    assert isinstance(r["thread_cpu_seconds"], dict)
    assert (r["thread_runqueue_seconds"] is None) == (not thread_runqueue_seconds()), r["thread_runqueue_seconds"]
    # and minor page faults per thread kind over the same window (kinds that faulted none left out)
    assert isinstance(r["thread_minor_faults"], dict)


def test_compare_json_table_and_plot(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = bench.main([str(tiny_folder), "--seconds", "3", "--batch-size", "8", "--device", "cpu",
                     "--json", str(out_json), "--plot", str(out_png), "--quiet"])
    assert rc == 0
    report = json.loads(out_json.read_text())
    names = [r["name"] for r in report["results"]]
    assert names == list(bench_contenders.CONTENDERS)
    for r in report["results"]:
        if r["status"] == "skipped":
            assert isinstance(r["reason"], str) and r["reason"].strip(), r
        else:
            _check_measured(r)
    by = {r["name"]: r for r in report["results"]}
    # decoding into fresh batches touches fresh pages somewhere: some contender counted faults
    assert any(r.get("thread_minor_faults") for r in report["results"]), report["results"]
    assert by["dataloader"]["status"] == "ok" or by["simd"]["status"] == "ok"
    assert by["dali"]["status"] == "skipped" and "cuda" in by["dali"]["reason"].lower()
    assert report["dataset"]["images"] == 48 and report["config"]["batch_size"] == 8
    assert report["machine"]["cores_usable"] >= 1 and report["machine"]["versions"]["torch"]
    # SMT shown beside the cores (the sysfs answer, parsed apart here) where the kernel reports it
    siblings_list = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    siblings = bench_report.cpu_list_count(siblings_list.read_text()) if siblings_list.exists() else None
    assert report["machine"]["threads_per_core"] == siblings
    # That --seconds bounds each measurement is checked on a fake clock
    # (tests/unit/test_bench_runner.py), not against this machine's wall clock.

    table = capsys.readouterr().out
    for r in report["results"]:
        assert r["label"] in table

    data = out_png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out_png) as im:
        im.verify()
    with Image.open(out_png) as im:
        assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200


def test_ablation_steps_in_order_with_speedups(tiny_folder: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "a.json"
    rc = bench.main([str(tiny_folder), "--ablation", "--seconds", "3", "--batch-size", "8", "--threads", "1",
                     "--device", "cpu", "--json", str(out_json), "--quiet"])
    assert rc == 0
    report = json.loads(out_json.read_text())
    assert report["ablation"] is True
    steps = report["results"]
    assert [r["name"] for r in steps] == ABLATION_ORDER
    by = {r["name"]: r for r in steps}
    assert by["pin_memory"]["status"] == "skipped" and "cuda" in by["pin_memory"]["reason"]
    assert by["cuda_prefetch"]["status"] == "skipped"
    measured = [r for r in steps if r["status"] == "ok"]
    assert measured[0]["name"] == "baseline"
    base = measured[0]["images_per_s"]
    prev = None
    for r in measured:
        _check_measured(r)
        assert r["speedup_vs_baseline"] == pytest.approx(r["images_per_s"] / base)
        assert r["speedup_vs_previous"] == pytest.approx(r["images_per_s"] / prev if prev else 1.0)
        prev = r["images_per_s"]
    for r in steps:
        if r["status"] != "ok":
            assert r["reason"].strip()
    # The tuned worker count never reports worse than the count it started from.
    if by["workers"]["status"] == "ok":
        assert by["workers"]["images_per_s"] >= by["baseline"]["images_per_s"]


def test_windows_median_spread_and_list_file(tmp_path: Path) -> None:
    # 10 batches of 4 images arriving every 0.1 s, then one slow batch.
    times = [0.1 * (k + 1) for k in range(10)] + [2.0]
    rates = bench.windows(times, [4] * 11, 0.0)
    assert len(rates) == bench.MAX_WINDOWS
    # Groups of 2, 2, 3, 2, 2 batches; each window starts where the previous one ended.
    assert rates[:4] == pytest.approx([40.0] * 4)
    assert rates[4] == pytest.approx(8 / 1.1)  # the slow batch shows in the spread, not hidden

    lst = tmp_path / "list.csv"
    (tmp_path / "a.jpg").write_bytes(b"")
    lst.write_text("# comment\na.jpg,1\n/abs/b.jpg,0\n\n")
    paths, labels, classes = bench.read_list_file(lst)
    assert paths == [str(tmp_path / "a.jpg"), "/abs/b.jpg"] and labels == [1, 0] and classes == ["0", "1"]
    lst.write_text("a.jpg;1\n")
    with pytest.raises(ValueError, match="list.csv:1"):
        bench.read_list_file(lst)


def test_shard_url_as_data(tiny_folder: Path, tmp_path: Path) -> None:
    """DATA may be tar shards over HTTP: the shards row runs fastdata.TarShards, the webdataset
    row DataLoader + WebDataset (skipped, with why, where webdataset is not installed)."""
    from shardserver import ShardServer

    from fastdata.cli.convert import main as convert_main

    assert convert_main([str(tiny_folder), str(tmp_path / "shards"), "--format", "tar", "--shard-size", "60KB",
                         "--workers", "1", "--quiet"]) == 0
    out_json = tmp_path / "r.json"
    with ShardServer(tmp_path / "shards") as srv:
        rc = bench.main([srv.url + "/index.json", "--seconds", "4", "--batch-size", "8", "--device", "cpu",
                         "--compare", "shards,shards-cache,webdataset,dataloader", "--json", str(out_json), "--quiet"])
    assert rc == 0
    report = json.loads(out_json.read_text())
    by = {r["name"]: r for r in report["results"]}
    assert report["dataset"]["kind"] == "tar shards" and report["dataset"]["images"] == 48
    _check_measured(by["shards"])
    _check_measured(by["shards-cache"])
    assert by["dataloader"]["status"] == "skipped" and "tar shards" in by["dataloader"]["reason"]
    if by["webdataset"]["status"] == "skipped":
        assert "webdataset" in by["webdataset"]["reason"]
    else:
        _check_measured(by["webdataset"])


def test_uint8_output_in_interleaved_rounds(tiny_folder: Path, tmp_path: Path) -> None:
    """The old benchmarks/bench_loader.py job: raw uint8 NHWC batches, rounds interleaved and pooled."""
    out_json = tmp_path / "u.json"
    rc = bench.main([str(tiny_folder), "--compare", "dataloader,ffcv,fastdata,dali", "--dtype", "uint8",
                     "--rounds", "2", "--seconds", "4", "--batch-size", "8", "--device", "cpu",
                     "--json", str(out_json), "--quiet"])
    assert rc == 0
    report = json.loads(out_json.read_text())
    assert report["config"]["rounds"] == 2 and report["config"]["dtype"] == "uint8"
    by = {r["name"]: r for r in report["results"]}
    assert [r["name"] for r in report["results"]] == ["dataloader", "ffcv", "fastdata", "dali"]
    for name in ("dataloader", "fastdata"):
        r = by[name]
        assert r["status"] == "ok", r
        assert r["output"].startswith("uint8[8x224x224x3] cpu"), r["output"]
        assert len(r["round_rates"]) == 2 and min(r["round_rates"]) > 0
        # pooled over both rounds: images over seconds of both, not a mean of the two rates
        assert r["images_per_s"] == pytest.approx(r["timed_images"] / r["timed_seconds"])
        assert min(r["round_rates"]) <= r["images_per_s"] <= max(r["round_rates"])
        assert 0 < r["wait_fraction"] <= 1.0 and r["wait_ms_p50"] > 0
    assert by["dali"]["status"] == "skipped" and "uint8" in by["dali"]["reason"]
    assert by["ffcv"]["status"] in ("ok", "skipped")  # installed or not, never dropped
    # each round waited for the machine to settle (a DataLoader's workers gone) before each run
    assert report["config"]["settle_max"] > 0
    for name in ("dataloader", "fastdata"):
        assert len(by[name]["settle"]) == 2 and all(s["seconds"] >= 0 for s in by[name]["settle"])


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_round_orders_put_each_contender_after_each_other_equally_often(n):
    rounds = n if n % 2 == 0 else 2 * n
    orders = bench.round_orders(n, rounds)
    assert all(sorted(row) == list(range(n)) for row in orders)
    follows = {}
    for row in orders:
        for a, b in zip(row, row[1:]):
            follows[a, b] = follows.get((a, b), 0) + 1
    assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1  # every ordered pair, equally often
    firsts = [row[0] for row in orders]
    assert all(firsts.count(i) == rounds // n for i in range(n))
    assert bench.round_orders(0, 2) == [[], []]  # nothing runnable: rounds with nothing to run


def test_rounds_run_in_the_orders_of_round_orders(monkeypatch, tiny_folder: Path) -> None:
    args = bench._parser().parse_args([str(tiny_folder), "--device", "cpu", "--batch-size", "8"])
    args.threads = 1
    job, _ = bench.make_job(args.data, args, bench.Progress(quiet=True))
    names = ["dataloader", "fastdata", "ram", "lmdb"]
    plan = bench.compare_plan(job, names)
    order = []

    def fake_measure(contender, job, share, **kw):
        order.append(contender.name)
        return {"name": contender.name, "label": contender.label, "status": "ok", "images_per_s": 1.0,
                "timed_images": 8, "timed_seconds": 8.0}

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "pool", lambda runs: runs[0])
    results = bench.run_plan(plan, job, 4.0, bench.Progress(quiet=True), False, rounds=4, settle_max=0)
    assert order == [names[i] for row in bench.round_orders(4, 4) for i in row]
    assert [r["name"] for r in results] == names  # the table keeps the asked order


def test_cpu_lists_as_the_kernel_writes_them() -> None:
    assert [bench_report.cpu_list_count(t) for t in ("0\n", "0,8", "0-1", "0-1,4-5", "", "x", "3-1")] == \
        [1, 2, 2, 4, None, None, None]


def test_gpu_contenders_are_checked_without_importing_nvimgcodecs_python_api(monkeypatch):
    # That import makes nvImageCodec's own instance with every codec extension loaded (making one
    # took 1.03 s on an H100), and the plan is made in the process the contenders then run in: the gpu and hybrid
    # rows are checked with find_spec, the import left to the contenders that decode through it.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys
        from fastdata.cli.bench_contenders import FastdataContender, Job
        job = Job(paths=["x.jpg"], labels=[0], classes=["a"], device="cuda", dtype="float16")
        reasons = [FastdataContender("files", backend=b).unavailable(job) for b in ("gpu", "hybrid")]
        print(reasons, sorted(m for m in sys.modules if m.startswith("nvidia.nvimgcodec")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    import torch

    cuda = None if torch.cuda.is_available() else "'CUDA is not available'"
    assert done.stdout.strip() == f"[{cuda}, {cuda}] []"
    # without the extra, the reason says how to install it
    from fastdata.decoders import nvimgcodec

    monkeypatch.setattr(nvimgcodec, "gpu_extra_installed", lambda: False)
    job = bench_contenders.Job(paths=["x.jpg"], labels=[0], classes=["a"], device="cuda", dtype="float16")
    assert bench_contenders.FastdataContender("files", backend="hybrid").unavailable(job) == nvimgcodec.GPU_MISSING


def test_the_ram_contender_caches_the_lmdb_records(monkeypatch, tiny_folder: Path, tmp_path: Path) -> None:
    # The ablation adds the RAM cache on top of the LMDB step: the RAM contender serves the LMDB
    # cache's records (restart-indexed rewrites, which crops decode faster), not the plain files,
    # and that cache is built before timing even when "ram" runs without "lmdb".
    import fastdata

    args = bench._parser().parse_args([str(tiny_folder), "--device", "cpu", "--batch-size", "8"])
    args.threads = 1
    job, _ = bench.make_job(args.data, args, bench.Progress(quiet=True))
    job.cache_dir = tmp_path
    ram = bench_contenders.FastdataContender("ram")
    assert ram.unavailable(job) is None and ram.reads_lmdb(job)
    built_before = []

    def fake_measure(contender, job, share, **kw):
        built_before.append((tmp_path / "lmdb").is_dir() and any((tmp_path / "lmdb").iterdir()))
        return {"name": contender.name, "label": contender.label, "status": "ok", "images_per_s": 1.0,
                "timed_images": 8, "timed_seconds": 8.0}

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "pool", lambda runs: runs[0])
    bench.run_plan(bench.compare_plan(job, ["ram"]), job, 1.0, bench.Progress(quiet=True), False, settle_max=0)
    assert built_before == [True]
    source = ram._open_source(job)
    assert isinstance(source, fastdata.RAMCache) and isinstance(source.source, fastdata.LMDBSource)
    assert len(source) == len(job.paths)
    assert all(b"fastdata-rst" in bytes(source.fetch(i)[0]) for i in range(len(source)))


def test_gpu_backend_rows_read_an_lmdb_given_as_data() -> None:
    # DATA an LMDB: the native files row is skipped (the lmdb row reads it), while a GPU backend's
    # row reads the cache's records.
    job = bench_contenders.Job(paths=[], labels=[0], classes=["a"], lmdb=Path("/nonexistent.lmdb"), device="cuda",
                               dtype="float16")
    native = bench_contenders.FastdataContender("files")
    assert "DATA is an LMDB cache" in native.unavailable(job)
    import torch

    for backend in ("gpu", "hybrid", "nvjpeg"):
        row = bench_contenders.FastdataContender("files", backend=backend)
        reason = row.unavailable(job)
        if not torch.cuda.is_available():
            assert reason == "CUDA is not available"  # the machine, not the LMDB, stops it here
        assert reason is None or "LMDB" not in reason  # never the LMDB
        assert row.reads_lmdb(job)
