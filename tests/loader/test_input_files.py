"""What counts as an input file, for every caller that reads one (#16 items 5, 9, 11).

Files are opened in one place (fastdata.engine.read_file / the engine's native read_file), so
decode_batch, the Loader, the GPU backends' reads, fastdata-convert and the RAM cache share
its rules: only regular files are read (a named pipe used to block open() forever), a file
above ``max_file_bytes`` is refused from its size before a byte is read (a 3 GB sparse .jpg
was read whole, twice when it was not a JPEG), and a file name that is not valid UTF-8 reads
like any other (it failed every batch with a pybind11 cast error naming no file).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.cli.convert import main as convert_main
from fastdata.cli.demo import photo_like_jpeg
from fastdata.io.engine import DEFAULT_MAX_FILE_BYTES, read_file
from fastdata.sources.lmdb import LMDBSource

RRC = fastdata.RandomResizedCrop(32)
CENTER = fastdata.CenterCrop(32, resize=36)


def finishes(fn: Callable[[], object], fifo: Path, seconds: float = 20.0) -> object:
    """``fn()``'s result; fails the test when it is still blocked after ``seconds`` (then a
    writer opens the FIFO, which releases a reader stuck in open(), so no thread stays hung)."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised below, on the test's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(10)
        pytest.fail(f"blocked on the named pipe {fifo} for {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture()
def folder_with_fifo(tmp_path: Path) -> Path:
    root = tmp_path / "a"
    for c in ("x", "y"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            (root / c / f"{i}.jpg").write_bytes(photo_like_jpeg(1, i, 40, 48))
    (root / "x" / "2.jpg").unlink()
    os.mkfifo(root / "x" / "2.jpg")
    return root


def test_a_named_pipe_is_a_named_read_error_in_decode_batch(folder_with_fifo):
    fifo = folder_with_fifo / "x" / "2.jpg"
    good = str(folder_with_fifo / "x" / "0.jpg")
    out, failures = finishes(lambda: fastdata.decode_batch([good, str(fifo)], RRC, on_error="skip"), fifo)
    assert len(failures) == 1 and failures[0].index == 1 and failures[0].name == str(fifo)
    assert "not a regular file (a named pipe)" in str(failures[0])
    assert out[1].max() == 0 and out[0].max() > 0
    with pytest.raises(fastdata.DecodeError, match="named pipe"):
        finishes(lambda: fastdata.decode_batch([str(fifo)], RRC), fifo)
    with pytest.raises(fastdata.DecodeError, match="named pipe"):
        read_file(fifo)
    with fastdata.Engine(2) as engine:  # the GPU backends' reads
        arrays, reasons = finishes(lambda: engine.read_files([good, str(fifo)]), fifo)
    assert reasons[0] is None and arrays[0].size == os.path.getsize(good)
    assert "named pipe" in reasons[1] and arrays[1].size == 0


def test_a_named_pipe_is_a_counted_skip_in_the_loader(folder_with_fifo):
    fifo = folder_with_fifo / "x" / "2.jpg"
    source = fastdata.ImageFolder(str(folder_with_fifo))
    assert str(fifo) in source.paths  # listed like torchvision lists it

    def epoch() -> list:
        with fastdata.Loader(source, batch_size=6, transform=CENTER, shuffle=False, threads=2, device="cpu",
                             on_error="skip", drop_last=False) as loader:
            with pytest.warns(RuntimeWarning, match="named pipe") as record:
                batches = [y.tolist() for _, y in loader]
            return [batches, loader.stats().failures, [str(w.message) for w in record]]

    batches, failures, warned = finishes(epoch, fifo)
    assert batches == [[0, 0, 1, 1, 1, 1]]  # x/2.jpg replaced by the next sample, y/0.jpg
    assert len(warned) == 1 and repr(str(fifo)) in warned[0]
    assert failures >= 1  # counted (the producer may already have met it again in the next epoch)


def test_a_named_pipe_is_skipped_by_fastdata_convert(folder_with_fifo, tmp_path, capsys):
    fifo = folder_with_fifo / "x" / "2.jpg"
    dst = tmp_path / "cache"
    rc = finishes(lambda: convert_main([str(folder_with_fifo), str(dst), "--on-error", "skip", "--workers", "1",
                                        "--quiet"]), fifo)
    assert rc == 0
    assert len(LMDBSource(str(dst))) == 5  # the pipe left out, counted
    rc = finishes(lambda: convert_main([str(folder_with_fifo), str(tmp_path / "strict"), "--workers", "1",
                                        "--quiet"]), fifo)
    assert rc == 1 and "named pipe" in capsys.readouterr().err


def test_a_device_or_a_directory_is_refused_not_read():
    with pytest.raises(fastdata.DecodeError, match="character device"):
        read_file("/dev/zero")  # would never end
    _, failures = fastdata.decode_batch(["/dev/zero", "/"], RRC, on_error="skip")
    assert ["character device" in str(failures[0]), "a directory" in str(failures[1])] == [True, True]


# ------------------------------------------------------------------ item 9: the size cap

def test_the_default_cap_is_the_raw_size_of_an_image_at_the_pixel_limit():
    assert DEFAULT_MAX_FILE_BYTES == 256 << 20 == fastdata.DEFAULT_MAX_FILE_BYTES
    assert abs(DEFAULT_MAX_FILE_BYTES - 3 * fastdata.DEFAULT_MAX_PIXELS) < 8


@pytest.fixture()
def sparse_jpg(tmp_path: Path) -> Path:
    """A .jpg of 300 MB (above the default cap) that takes no disk: a JPEG, then a hole."""
    p = tmp_path / "c" / "huge.jpg"
    p.parent.mkdir()
    p.write_bytes(photo_like_jpeg(2, 0, 40, 48))
    os.truncate(p, 300 << 20)
    assert os.stat(p).st_blocks * 512 < 1 << 20  # sparse: nothing written
    return p


def test_a_file_above_the_cap_fails_unread_naming_it(sparse_jpg):
    _, failures = fastdata.decode_batch([str(sparse_jpg)], RRC, on_error="skip")
    assert len(failures) == 1 and failures[0].name == str(sparse_jpg)
    assert f"file is {300 << 20} bytes, above the limit of {256 << 20}" in str(failures[0])
    with pytest.raises(fastdata.DecodeError, match="above the limit"):
        read_file(sparse_jpg)
    # The cap is the caller's: raised, the same file is read (a JPEG followed by zeros decodes).
    out = fastdata.decode_batch([str(sparse_jpg)], RRC, max_file_bytes=301 << 20)
    assert out.max() > 0


def test_the_cap_applies_in_the_loader_and_is_configurable(tmp_path):
    root = tmp_path / "r"
    (root / "c").mkdir(parents=True)
    sizes = []
    for i in range(4):
        data = photo_like_jpeg(5, i, 64, 64 + 16 * i)
        (root / "c" / f"{i}.jpg").write_bytes(data)
        sizes.append(len(data))
    cap = sorted(sizes)[1]  # two files above it
    source = fastdata.ImageFolder(str(root))
    with fastdata.Loader(source, batch_size=4, transform=CENTER, shuffle=False, threads=2, device="cpu",
                         on_error="skip", max_file_bytes=cap) as loader:
        with pytest.warns(RuntimeWarning, match="above the limit") as record:
            list(loader)
        warned = {p for p in source.paths if any(repr(p) in str(w.message) for w in record)}
        assert warned == {p for p, s in zip(source.paths, sizes) if s > cap} and len(warned) == 2
        stats = loader.stats()
        over = [s > cap for s in sizes]  # a file over the cap also fails as its predecessor's replacement
        chained = sum(over[i] and over[(i + 1) % len(over)] for i in range(len(over)))
        assert (stats.failures, stats.replacement_failures) == (2, chained)
    with fastdata.Loader(source, batch_size=4, transform=CENTER, shuffle=False, threads=2, device="cpu",
                         max_file_bytes=0) as loader:  # 0: no limit
        assert len(list(loader)) == 1 and loader.stats().failures == 0
    with pytest.raises(ValueError, match="max_file_bytes"):
        fastdata.Loader(source, batch_size=4, device="cpu", max_file_bytes=-1)


def test_a_non_jpeg_path_is_read_once_for_the_pillow_fallback(tmp_path, monkeypatch):
    """The fallback decodes the bytes the native read returned: Python never opens the file."""
    p = tmp_path / "img.png"
    Image.fromarray(np.full((20, 30, 3), 77, np.uint8)).save(p)
    import builtins
    real_open = builtins.open
    opened = []

    def spying_open(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spying_open)
    out = fastdata.decode_batch([str(p)], RRC)
    assert str(p) not in opened
    assert (out == 77).all()


# ------------------------------------------------------------- item 11: non-UTF-8 file names

def test_a_file_name_that_is_not_utf8_reads_in_decode_batch_and_a_loader(tmp_path):
    root = tmp_path / "set"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
    datas = [photo_like_jpeg(9, i, 48, 56) for i in range(4)]
    names = [b"caf\xe9.jpg", b"plain.jpg", b"\xff\xfe.jpg", b"ok.jpg"]  # latin-1 and junk bytes
    for i, (data, name) in enumerate(zip(datas, names)):
        with open(os.path.join(os.fsencode(root / ("a" if i < 2 else "b")), name), "wb") as f:
            f.write(data)
    source = fastdata.ImageFolder(str(root))
    bad = [p for p in source.paths if "\udcff" in p or "\udce9" in p]
    assert len(bad) == 2  # os.listdir's surrogateescape names, as torchvision sees them too
    want = fastdata.decode_batch([read_file(p) for p in source.paths], CENTER)
    got, failures = fastdata.decode_batch(source.paths, CENTER, on_error="skip")
    assert failures == []
    np.testing.assert_array_equal(got, want)
    with fastdata.Loader(source, batch_size=4, transform=CENTER, shuffle=False, threads=2, device="cpu",
                         dtype=__import__("torch").uint8) as loader:
        (x, y), = list(loader)
    np.testing.assert_array_equal(x.numpy(), want)
    assert y.tolist() == [0, 0, 1, 1]
