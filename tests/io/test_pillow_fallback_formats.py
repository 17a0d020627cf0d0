"""The Pillow fallback opens only plain raster formats and turns every Pillow failure into a
DecodeError naming the sample (#16 item 10): EPS bytes never start Ghostscript, a damaged DDS
file no longer escapes as NotImplementedError."""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

import fastdata
from fastdata.io.pillow_fallback import FALLBACK_FORMATS

from repo import ROOT as REPO
RRC = fastdata.RandomResizedCrop(16)


def _eps() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, "EPS")  # Pillow writes EPS without Ghostscript
    return buf.getvalue()


def _damaged_dds() -> bytes:
    """A DDS header naming an unknown FourCC: Pillow's DDS plugin raises NotImplementedError."""
    header = struct.pack("<IIIIIII", 124, 0x1007, 8, 8, 0, 0, 0) + b"\0" * 44 + struct.pack("<II4s", 32, 0x4, b"XYZW")
    return b"DDS " + header + b"\0" * (124 - len(header)) + b"\0" * 256


def _encode(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.arange(12 * 10 * 3, dtype=np.uint8).reshape(10, 12, 3)).save(buf, fmt)
    return buf.getvalue()


# Every way a sample's bytes reach Pillow: decode, decode_batch (bytes and a path), a Loader over
# an ImageFolder, and a record of a crafted LMDB cache.
CHILD = textwrap.dedent("""
    import os, sys, warnings
    import numpy as np, torch, fastdata
    from fastdata.cache.build.writer import convert
    data, folder, db = open(sys.argv[1], "rb").read(), sys.argv[2], sys.argv[3]
    rrc = fastdata.RandomResizedCrop(16)
    for call in (lambda: fastdata.decode(data), lambda: fastdata.decode_batch([data], rrc)):
        try:
            call()
            raise SystemExit("decoded EPS")
        except fastdata.DecodeError as e:
            print("DecodeError:", e)
    _, failures = fastdata.decode_batch([sys.argv[1]], rrc, on_error="skip")
    assert [f.name for f in failures] == [sys.argv[1]], failures
    loader = fastdata.Loader(fastdata.ImageFolder(folder), batch_size=2, transform=rrc, device="cpu",
                             dtype=torch.uint8, threads=1, on_error="skip", shuffle=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        batches = list(loader)
    assert loader.stats().failures >= 1
    print("loader failures", loader.stats().failures)
    src = fastdata.LMDBSource(db)
    report = fastdata.Engine(1).run(src.fetch([0, 1]), rrc, np.zeros((2, 16, 16, 3), np.uint8), names=["a", "b"])
    assert [f.index for f in report.failures] == [1], report.failures
    print("ok")
""")


def test_eps_never_runs_ghostscript(tmp_path: Path) -> None:
    marker = tmp_path / "gs-was-run"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    gs = bindir / "gs"
    gs.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 1\n")
    gs.chmod(0o755)
    eps = tmp_path / "x.eps.jpg"
    eps.write_bytes(_eps())
    folder = tmp_path / "folder"
    (folder / "c").mkdir(parents=True)
    (folder / "c" / "0.jpg").write_bytes(_encode("JPEG"))
    (folder / "c" / "1.jpg").write_bytes(_eps())
    (folder / "c" / "2.jpg").write_bytes(_encode("JPEG"))
    # A crafted cache: convert a good folder, then put EPS bytes in record 1 (and its checksum,
    # as a crafter would), so only the fallback stands between the record and gs.
    good = tmp_path / "good"
    (good / "c").mkdir(parents=True)
    for i in range(2):
        (good / "c" / f"{i}.jpg").write_bytes(_encode("JPEG"))
    from fastdata.cache import format as cf
    from fastdata.cache.build.writer import convert

    convert(str(good), str(tmp_path / "db"), workers=1)
    import hashlib

    import lmdb

    env = lmdb.open(str(tmp_path / "db"), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(cf.sample_key(1), _eps())
        for key in (cf.SHA256_KEY, cf.STORED_SHA256_KEY):
            sums = bytearray(txn.get(key) or b"\0" * 64)
            sums[32:64] = hashlib.sha256(_eps()).digest()
            txn.put(key, bytes(sums))
    env.close()

    env_vars = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(eps), str(folder), str(tmp_path / "db")],
                          capture_output=True, text=True, timeout=300, env=env_vars, cwd=REPO)
    assert not marker.exists(), f"Pillow ran the fake gs: {marker.read_text()!r}"
    assert done.returncode == 0 and done.stdout.endswith("ok\n"), done.stdout + done.stderr[-3000:]
    assert "not a supported image format" in done.stdout


def test_damaged_dds_is_a_named_decode_error(tmp_path: Path) -> None:
    dds = _damaged_dds()
    with pytest.raises(NotImplementedError):  # what Pillow itself does with it
        Image.open(io.BytesIO(dds)).load()
    with pytest.raises(fastdata.DecodeError):
        fastdata.decode(dds)
    path = tmp_path / "bad.png"
    path.write_bytes(dds)
    _, failures = fastdata.decode_batch([_encode("PNG"), dds, str(path)], RRC, on_error="skip",
                                        indices=[7, 8, 9])
    assert [(f.index, f.name) for f in failures] == [(8, None), (9, str(path))]


def test_any_pillow_exception_becomes_decode_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Even inside an allowed format, a plugin failure of any type is the sample's DecodeError."""
    def broken(self):
        raise NotImplementedError("plugin bug")

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", broken)
    path = tmp_path / "x.png"
    path.write_bytes(_encode("PNG"))
    with pytest.raises(fastdata.DecodeError, match="NotImplementedError: plugin bug"):
        fastdata.decode(path.read_bytes())
    _, failures = fastdata.decode_batch([str(path)], RRC, on_error="skip")
    assert [f.name for f in failures] == [str(path)] and "plugin bug" in failures[0].reason


@pytest.mark.parametrize("fmt", FALLBACK_FORMATS)
def test_allowed_formats_still_decode(fmt: str) -> None:
    data = _encode(fmt)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(fastdata.decode(data), ref)


@pytest.mark.parametrize("fmt", ["EPS", "PDF", "ICO", "TGA", "PCX"])
def test_other_formats_refused(fmt: str) -> None:
    with pytest.raises(fastdata.DecodeError, match="not a supported image format"):
        fastdata.decode(_encode(fmt))
