"""Engine.read_files: the GPU backends' native file reads (bytes, and the reason a file failed)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import fastdata


def test_reads_every_file_exactly_and_names_failures(tmp_path):
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in (1, 1000, 300_000)]
    paths = []
    for i, data in enumerate(payloads):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(data)
        paths.append(str(p))
    (tmp_path / "empty.bin").write_bytes(b"")
    paths += [str(tmp_path / "empty.bin"), str(tmp_path / "missing.bin"), str(tmp_path)]  # a directory too
    with fastdata.Engine(3) as engine:
        arrays, reasons = engine.read_files(paths)
    assert len(arrays) == len(reasons) == len(paths)
    for data, array, reason in zip(payloads, arrays, reasons):
        assert reason is None and array.dtype == np.uint8 and array.tobytes() == data
        array[0] = 7  # owned, writable memory (torch and DALI take it as is)
    assert reasons[3] is None and arrays[3].size == 0  # empty is readable; the plan reports it
    assert arrays[4].size == 0 and "No such file" in reasons[4]
    assert arrays[5].size == 0 and reasons[5]


def test_closed_engine_refuses():
    engine = fastdata.Engine(1)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.read_files([os.devnull])
