"""fastdata-convert --format tar: WebDataset shards with the LMDB cache's stored bytes
(progressive JPEGs transcoded losslessly), shards no larger than --shard-size, an index that
equals a scan of the shards, damaged inputs skipped and listed or named."""
from __future__ import annotations

import gc
import json
import os
import tarfile
import warnings
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

import fastdata
from fastdata.sources.shard_index import ShardIndex

from test_convert import make_damaged, make_folder, make_progressive_folder  # noqa: E402

lmdb = pytest.importorskip("lmdb")

from fastdata.cache.build.records import stored_bytes  # noqa: E402
from fastdata.cli.convert import main  # noqa: E402


def read_index(dst: Path) -> dict:
    return json.loads((dst / "index.json").read_text())


def test_tar_shards_hold_the_cache_bytes_and_labels(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "src", per_class=8)
    make_progressive_folder(src / "prog")  # a fourth class of progressive JPEGs (transcoded)
    dst = tmp_path / "shards"
    assert main([str(src), str(dst), "--format", "tar", "--shard-size", "24KB", "--workers", "2", "--quiet"]) == 0
    doc = read_index(dst)
    shards = sorted(dst.glob("shard-*.tar"))
    assert len(doc["shards"]) == len(shards) >= 3 and not list(dst.glob("*.part"))
    source = fastdata.TarShards(index=str(dst / "index.json"))
    ref = ImageFolder(str(src))
    assert source.classes == ref.classes and len(source) == len(ref.samples)
    seen = {i: source.fetch([i])[0] for i in range(len(source))}  # byte-range reads through the index
    by_path = {}
    # each sample's .json names its source file: its bytes are what the LMDB cache stores for it
    for shard in shards:
        with tarfile.open(shard) as tar:
            names = tar.getnames()
            metas = {n.split(".")[0]: json.loads(tar.extractfile(n).read()) for n in names if n.endswith(".json")}
            assert os.path.getsize(shard) <= 24_000 or len(metas) == 1
            for key, meta in metas.items():
                img_name = next(n for n in names if n.startswith(key + ".") and not n.endswith((".json", ".cls")))
                data = tar.extractfile(img_name).read()
                expected, _ = stored_bytes((src / meta["path"]).read_bytes(), None, 90, False)
                assert data == expected, meta["path"]
                assert int(tar.extractfile(key + ".cls").read()) == meta["label"] == ref.class_to_idx[meta["class"]]
                assert data == seen[int(key)]
                assert source.labels[int(key)] == meta["label"]
                by_path[meta["path"]] = data
    for name in ("p420.jpg", "p444.jpg", "pgray.jpg", "prot.jpg"):  # transcoded to baseline, as in the cache
        assert fastdata.probe((src / "prog" / "a" / name).read_bytes()).progressive
        assert not fastdata.probe(by_path[f"prog/a/{name}"]).progressive
    # the written index equals a scan of the shards
    scanned = ShardIndex.scan([str(p) for p in shards])
    assert scanned.labels.tolist() == source.labels.tolist()
    for a, b in zip(scanned.shards, source.index.shards):
        assert a.names == b.names and a.offsets.tolist() == b.offsets.tolist() and a.sizes.tolist() == b.sizes.tolist()
    # written in a seeded random order, not class by class
    assert source.labels.tolist() != sorted(source.labels.tolist())
    assert main([str(src), str(dst), "--format", "tar", "--quiet"]) == 1  # refuses to overwrite


def test_tar_damaged_inputs_skipped_and_listed_or_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src"
    bad = make_damaged(src)
    assert main([str(src), str(tmp_path / "skip"), "--format", "tar", "--on-error", "skip", "--quiet"]) == 0
    doc = read_index(tmp_path / "skip")
    assert sorted(s["path"] for s in doc["skipped"]) == sorted(bad)
    assert len(fastdata.TarShards(index=str(tmp_path / "skip" / "index.json"))) == 8
    capsys.readouterr()
    assert main([str(src), str(tmp_path / "raise"), "--format", "tar", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "trunc.jpg" in err
    assert not (tmp_path / "raise" / "index.json").exists() and not list((tmp_path / "raise").glob("*.part"))


def test_webdataset_reads_the_shards(tmp_path: Path) -> None:
    """A peer's reader sees the same samples (keys, labels, image bytes) as the index."""
    wds = pytest.importorskip("webdataset")  # optional: not a fastdata dependency
    src = make_folder(tmp_path / "src", per_class=5)
    dst = tmp_path / "shards"
    assert main([str(src), str(dst), "--format", "tar", "--shard-size", "20KB", "--workers", "1", "--quiet"]) == 0
    source = fastdata.TarShards(index=str(dst / "index.json"))
    urls = [str(p) for p in sorted(dst.glob("shard-*.tar"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its shard files to the GC
        got = [(s["__key__"], int(s["cls"]), s[next(k for k in s if k in ("jpg", "png"))])
               for s in wds.WebDataset(urls, shardshuffle=False)]
        gc.collect()
    assert [k for k, _, _ in got] == [f"{i:08d}" for i in range(len(source))]
    assert [lab for _, lab, _ in got] == source.labels.tolist()
    assert [d for _, _, d in got] == [source.fetch([i])[0] for i in range(len(source))]
