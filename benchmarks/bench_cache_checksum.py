"""What LMDBSource's per-record SHA-256 check costs, next to decoding the same records.

Exact command (the number in fastdata/sources/lmdb.py's docstring comes from it):

    PYTHONPATH=$PWD python benchmarks/bench_cache_checksum.py

Builds a cache of 256 photo-like 500x375 JPEGs (fastdata.cli.demo.photo_like_jpeg, ~120 KB,
ImageNet-like), then, in one run: fetch of all records with verify=False and verify="always"
(every fetch hashes: the default "once" hashes a record at its first fetch only; median of 7 passes, three rounds each, interleaved), and decode_batch RandomResizedCrop(224)
on one thread over the same bytes (median of 5). Prints µs per record and the check's share
of the decode.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import fastdata
from fastdata.cache.build.writer import convert
from fastdata.cli.demo import photo_like_jpeg
from fastdata.sources.lmdb import LMDBSource

N = 256


def fetch_us(src: LMDBSource) -> float:
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        src.fetch(range(N))
        times.append((time.perf_counter() - t0) / N * 1e6)
    return statistics.median(times)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="fastdata-checksum-"))
    for i in range(N):
        d = work / "src" / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.jpg").write_bytes(photo_like_jpeg(0, i, 500, 375))
    convert(str(work / "src"), str(work / "db"), workers=1)
    checked, unchecked = LMDBSource(str(work / "db"), verify="always"), LMDBSource(str(work / "db"), verify=False)
    fetch_us(checked), fetch_us(unchecked)  # warm-up: pages in the page cache
    off, on = [], []
    for _ in range(3):
        off.append(fetch_us(unchecked))
        on.append(fetch_us(checked))
    items = [bytes(v) for v in unchecked.fetch(range(N))]
    kb = sum(map(len, items)) / N / 1024
    rrc = fastdata.RandomResizedCrop(224)
    out = np.empty((N, 224, 224, 3), np.uint8)
    fastdata.decode_batch(items[:8], rrc, out[:8], threads=1)
    dec = []
    for _ in range(5):
        t0 = time.perf_counter()
        fastdata.decode_batch(items, rrc, out, threads=1)
        dec.append((time.perf_counter() - t0) / N * 1e6)
    sha = statistics.median(on) - statistics.median(off)
    print(f"{N} photo-like 500x375 JPEGs, mean {kb:.1f} KB")
    print(f"fetch verify=False {statistics.median(off):.1f} us/record, verify="always" {statistics.median(on):.1f} "
          f"us/record: checksum {sha:.1f} us/record ({sha / kb:.2f} us/KB)")
    print(f"decode_batch RandomResizedCrop(224), 1 thread: {statistics.median(dec):.0f} us/record; "
          f"checksum = {100 * sha / statistics.median(dec):.1f}% of it")


if __name__ == "__main__":
    main()
