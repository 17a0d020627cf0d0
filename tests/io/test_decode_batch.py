"""decode_batch / Engine.run: the API contract, rows of a mixed batch vs their Pillow
references, determinism across thread counts, RNG keying, the item kinds accepted (paths and
buffers), the Pillow fallback inside a batch.

Crop accuracy for each transform is in test_crops.py; bad data in test_bad_input.py.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch
from torchvision import transforms as T

import fastdata
from fastdata import _C
from PIL import Image
from imagegen import (encode_jpeg, encode_oriented, encode_other, photo_like, pillow_crop_resize, pillow_oriented,
                      pillow_rgb, psnr, read_index)

MIN_PSNR = 30.0
RRC = fastdata.RandomResizedCrop((48, 64))
PNG = 10    # the PNG of ``mixed`` (decoded by the Pillow fallback)
STRIP = 15  # the 33x700 image of ``mixed``: no drawn box fits, every box is the centre fallback


@pytest.fixture(scope="module")
def mixed() -> List[bytes]:
    """16 encoded images of different kinds and sizes; image i carries index i in its corner.

    Every EXIF orientation, every Pillow subsampling, progressive, restart markers, gray,
    CMYK and a PNG (Pillow fallback)."""
    kinds = [
        dict(h=375, w=500), dict(h=500, w=375, subsampling="4:4:4"), dict(h=97, w=131, orientation=6),
        dict(h=240, w=320, progressive=True), dict(h=300, w=200, subsampling="4:2:2", orientation=3),
        dict(h=64, w=64), dict(h=600, w=450, orientation=8), dict(h=120, w=90, restart_blocks=2),
        dict(h=200, w=300, gray=True), dict(h=150, w=150, cmyk=True), dict(h=180, w=240, png=True),
        dict(h=130, w=170, orientation=2, subsampling="4:4:4"), dict(h=170, w=130, orientation=4, progressive=True),
        dict(h=141, w=187, orientation=5), dict(h=187, w=141, orientation=7, subsampling="4:2:2"),
        dict(h=33, w=700),
    ]
    out = []
    for i, k in enumerate(kinds):
        # h, w are the oriented size; the index sits in the oriented image's top-left corner
        img = photo_like(k.pop("h"), k.pop("w"), index=i)
        if k.pop("png", False):
            out.append(encode_other(img, "PNG"))
        elif k.pop("cmyk", False):
            out.append(encode_jpeg(img.convert("CMYK")))
        elif k.pop("gray", False):
            out.append(encode_jpeg(img.convert("L")))
        else:
            out.append(encode_oriented(img, k.pop("orientation", 1), **k))
    return out


def reference_rows(items: List[bytes], transform, seed: int, epoch: int, indices) -> List[np.ndarray]:
    """Pillow's version of each row: the engine's box (sample_crop_boxes with the same key)
    cropped from the EXIF-oriented image, resized with BILINEAR (antialiased), flipped."""
    refs = []
    for data, index in zip(items, indices):
        im = pillow_oriented(data)
        box = _C.sample_crop_boxes(im.height, im.width, transform.scale, transform.ratio, transform.hflip,
                                   seed, epoch, np.array([index], np.int64))[0]
        refs.append(pillow_crop_resize(im, box, transform.output_size))
    return refs


# ------------------------------------------------------------------ API

def test_out_none_allocates(mixed):
    out = fastdata.decode_batch(mixed, RRC)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8
    assert out.shape == (len(mixed), 48, 64, 3) and out.flags.c_contiguous and out.flags.writeable


def test_out_written_in_place(mixed):
    want = fastdata.decode_batch(mixed, RRC, seed=1)
    out = np.full((len(mixed), 48, 64, 3), 0xAB, dtype=np.uint8)
    got = fastdata.decode_batch(mixed, RRC, out, seed=1)
    assert got is out
    assert np.array_equal(out, want)


def _bad_outs(n):
    good = np.zeros((n, 48, 64, 3), np.uint8)
    readonly = good.copy()
    readonly.setflags(write=False)
    return {  # kind -> (out, the error it must raise)
        "float64": (np.zeros((n, 48, 64, 3), np.float64), TypeError),
        "int8": (np.zeros((n, 48, 64, 3), np.int8), TypeError),
        "too_few_rows": (np.zeros((n - 1, 48, 64, 3), np.uint8), ValueError),
        "too_many_rows": (np.zeros((n + 1, 48, 64, 3), np.uint8), ValueError),
        "swapped_hw": (np.zeros((n, 64, 48, 3), np.uint8), ValueError),
        "one_column_short": (np.zeros((n, 48, 63, 3), np.uint8), ValueError),
        "four_channels": (np.zeros((n, 48, 64, 4), np.uint8), ValueError),
        "3d": (np.zeros((n, 48, 64 * 3), np.uint8), ValueError),
        "strided": (np.zeros((n, 48, 128, 3), np.uint8)[:, :, ::2], ValueError),
        "nhwc_view_of_nchw": (np.zeros((n, 3, 48, 64), np.uint8).transpose(0, 2, 3, 1), ValueError),
        "fortran": (np.asfortranarray(good), ValueError),
        "readonly": (readonly, ValueError),
        "list": (good.tolist(), TypeError),
    }


@pytest.mark.parametrize("kind", list(_bad_outs(2)))
def test_bad_out_rejected(mixed, kind):
    items = mixed[:2]
    out, exc = _bad_outs(len(items))[kind]
    before = out.copy() if isinstance(out, np.ndarray) else None
    with pytest.raises(exc) as e:
        fastdata.decode_batch(items, RRC, out)
    assert not isinstance(e.value, fastdata.DecodeError)  # a bad argument is not bad data
    if before is not None:
        assert np.array_equal(out, before)  # nothing was written


def test_torch_tensor_view_as_out(mixed):
    pin = torch.cuda.is_available()
    t = torch.zeros((len(mixed), 48, 64, 3), dtype=torch.uint8, pin_memory=pin)
    view = t.numpy()
    got = fastdata.decode_batch(mixed, RRC, view, seed=4)
    assert got is view and np.shares_memory(got, t.numpy())
    assert np.array_equal(t.numpy(), fastdata.decode_batch(mixed, RRC, seed=4))
    assert t.is_pinned() == pin


def test_empty_batch():
    out = fastdata.decode_batch([], RRC)
    assert out.shape == (0, 48, 64, 3)


@pytest.mark.parametrize("call,exc", [
    (lambda d: fastdata.decode_batch([d], RRC, on_error="ignore"), ValueError),
    (lambda d: fastdata.decode_batch([d, d], RRC, indices=[1]), ValueError),
    (lambda d: fastdata.decode_batch([d, d], RRC, indices=[1, -1]), ValueError),
    (lambda d: fastdata.decode_batch([d], RRC, seed=-1), ValueError),
    (lambda d: fastdata.decode_batch([d], "RandomResizedCrop(224)"), TypeError),
    (lambda d: fastdata.decode_batch([12345], RRC), TypeError),
    (lambda d: fastdata.Engine(threads=0), ValueError),
    (lambda d: fastdata.Engine(threads=-1), ValueError),
    (lambda d: fastdata.Engine(threads=1.5), ValueError),
], ids=["on_error", "indices_len", "indices_negative", "seed_negative", "transform_type", "item_type",
        "threads_0", "threads_negative", "threads_float"])
def test_bad_arguments(call, exc):
    # Bad arguments are TypeError/ValueError (architecture: "errors cross the boundary typed").
    with pytest.raises(exc) as e:
        call(encode_jpeg(photo_like(64, 64)))
    assert not isinstance(e.value, fastdata.DecodeError)


def test_buffer_kinds_and_paths_agree(mixed, tmp_path: Path):
    paths = []
    for i, d in enumerate(mixed):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(d)
        paths.append(str(p))
    ref = fastdata.decode_batch(mixed, RRC, seed=8, threads=2)
    kinds = [
        paths,
        [memoryview(d) for d in mixed],
        [np.frombuffer(d, np.uint8) for d in mixed],
        [bytearray(d) for d in mixed],
        [d if i % 2 else paths[i] for i, d in enumerate(mixed)],  # mixed in one batch
    ]
    for items in kinds:
        assert np.array_equal(fastdata.decode_batch(items, RRC, seed=8, threads=2), ref)


def test_buffer_slices_with_offsets(mixed):
    # One arena holding all files (as a RAM cache would): items are views into it.
    arena = np.frombuffer(b"".join(mixed), np.uint8)
    offsets = np.cumsum([0] + [len(d) for d in mixed])
    views = [arena[offsets[i]:offsets[i + 1]] for i in range(len(mixed))]
    assert np.array_equal(fastdata.decode_batch(views, RRC, seed=8), fastdata.decode_batch(mixed, RRC, seed=8))


# ------------------------------------------------------------------ rows vs Pillow

def test_rows_match_pillow_and_are_the_right_images(mixed):
    # Every row matches its own Pillow reference (PSNR >= 30 dB), and better than any other
    # row's (row i is image i, not a neighbour's).
    seed, epoch = 11, 3
    indices = list(range(100, 100 + len(mixed)))
    out = fastdata.decode_batch(mixed, RRC, seed=seed, epoch=epoch, indices=indices, threads=2)
    refs = reference_rows(mixed, RRC, seed, epoch, indices)
    for row, ref in enumerate(refs):
        scores = [psnr(out[j], ref) for j in range(len(mixed))]
        assert scores[row] >= MIN_PSNR, f"row {row}: {scores[row]:.1f} dB"
        assert int(np.argmax(scores)) == row, f"row {row}: best match is row {int(np.argmax(scores))}"


def test_no_flip_keeps_orientation_and_order(mixed):
    # A "crop" of the whole image at its own size is the decoded image itself, so row i
    # must show image i's index in its top-left corner.
    for i, data in enumerate(mixed):
        h, w = pillow_rgb(data).shape[:2]
        whole = fastdata.RandomResizedCrop((h, w), scale=(1.0, 1.0), ratio=(w / h, w / h), hflip=0.0)
        row = fastdata.decode_batch([data], whole)[0]
        assert row.shape[:2] == (h, w)
        assert read_index(row) == i
        assert psnr(row, pillow_rgb(data)) >= 40


# ------------------------------------------------------------------ determinism and RNG keys

@pytest.mark.parametrize("transform", [RRC, fastdata.RandomResizedCrop(48), fastdata.CenterCrop(64, resize=72)],
                         ids=["rrc_48x64", "rrc_48", "center"])
def test_bit_identical_for_1_2_and_8_threads(mixed, transform):
    items = mixed * 2
    outs = [fastdata.decode_batch(items, transform, seed=7, epoch=1, threads=t) for t in (1, 2, 8)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    with fastdata.Engine(8) as engine:  # a fresh pool, and a second call on it
        out = np.empty_like(outs[0])
        for _ in range(2):
            engine.run(items, transform, out, seed=7, epoch=1)
            assert np.array_equal(out, outs[0])


def test_crops_of_2x4_sampled_jpeg_do_not_depend_on_the_previous_image(assets_dir):
    """A crop is a function of (file, key) only, also for sampling libjpeg-turbo mishandles
    when it crops columns (luma 2x4): decode after a white and after a black image."""
    data = (assets_dir / "sampling_2x4.jpg").read_bytes()
    primes = [encode_jpeg(Image.new("RGB", (87, 22), c)) for c in ((255, 255, 255), (0, 0, 0))]
    tf = fastdata.RandomResizedCrop(3, scale=(0.05, 1.0))
    with fastdata.Engine(1) as engine:  # one thread: the previous image is the prime
        for i in range(16):
            outs = []
            for prime in primes:
                out = np.empty((2, 3, 3, 3), np.uint8)
                engine.run([prime, data], tf, out, seed=1, indices=[i, i])
                outs.append(out[1].copy())
            np.testing.assert_array_equal(outs[0], outs[1])
            with fastdata.Engine(1) as fresh:  # and as decoded first by a fresh decoder
                fresh.run([data, data], tf, out, seed=1, indices=[i, i])
            np.testing.assert_array_equal(outs[0], out[0])


def test_same_key_same_output_other_key_other_crops(mixed):
    a = fastdata.decode_batch(mixed, RRC, seed=3, epoch=4, threads=2)
    assert np.array_equal(a, fastdata.decode_batch(mixed, RRC, seed=3, epoch=4, threads=1))
    for seed, epoch in ((3, 5), (4, 4)):
        other = fastdata.decode_batch(mixed, RRC, seed=seed, epoch=epoch, threads=2)
        same = {i for i in range(len(mixed)) if np.array_equal(a[i], other[i])}
        # only the strip can repeat: its box is always the fallback, only its flip is drawn
        assert same <= {STRIP}, (seed, epoch, same)
    # ... and it is the crops that differ, as the plan says (it reads JPEG headers only: the
    # PNG is listed in not_jpeg_rows, without a box)
    with fastdata.Engine(1) as engine:
        pa = engine.plan(mixed, RRC, seed=3, epoch=4)
        pb = engine.plan(mixed, RRC, seed=3, epoch=5)
    assert pa.not_jpeg_rows == [PNG] and pa.failures == []
    moved = [i for i in range(len(mixed)) if not np.array_equal(pa.boxes[i], pb.boxes[i])]
    assert moved == [i for i in range(len(mixed)) if i not in (STRIP, PNG)]


def test_indices_select_rng_stream(mixed):
    full = fastdata.decode_batch(mixed, RRC, seed=9, epoch=3, threads=2)
    single = fastdata.decode_batch([mixed[7]], RRC, seed=9, epoch=3, indices=[7], threads=1)
    assert np.array_equal(single[0], full[7])
    # the same image under another index gets another crop
    other = fastdata.decode_batch([mixed[7]], RRC, seed=9, epoch=3, indices=[8], threads=1)
    assert not np.array_equal(other[0], full[7])
    # a permuted batch with its indices permuted gives the permuted rows
    perm = np.random.default_rng(0).permutation(len(mixed))
    shuffled = fastdata.decode_batch([mixed[i] for i in perm], RRC, seed=9, epoch=3, indices=perm, threads=2)
    assert np.array_equal(shuffled, full[perm])
    # explicit default indices are the same as none
    assert np.array_equal(fastdata.decode_batch(mixed, RRC, seed=9, epoch=3, indices=range(len(mixed))), full)


def test_large_indices_and_seeds(mixed):
    big = [2**40 + 3, 2**62]
    kw = dict(seed=2**63 - 1, epoch=10**6, threads=1)
    out = fastdata.decode_batch(mixed[:2], RRC, indices=big, **kw)
    assert np.array_equal(out, fastdata.decode_batch(mixed[:2], RRC, indices=big, **kw))
    assert np.array_equal(out[1], fastdata.decode_batch([mixed[1]], RRC, indices=[2**62], **kw)[0])


def test_concurrent_calls_from_python_threads(mixed):
    # The loader calls Engine.run from a background thread while other threads run: calls on
    # a shared engine are serialized, calls on different engines run side by side.
    ref = fastdata.decode_batch(mixed, RRC, seed=12, threads=2)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda k: fastdata.decode_batch(mixed, RRC, seed=12, threads=1 + k % 2), range(8)))
    for out in outs:
        assert np.array_equal(out, ref)


# ------------------------------------------------------------------ Pillow fallback inside a batch

@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_non_jpeg_in_a_batch_goes_through_the_same_crop(fmt):
    data = encode_other(photo_like(100, 140, index=4), fmt)
    jpeg = encode_jpeg(photo_like(150, 200, index=5))
    t = fastdata.RandomResizedCrop(40)
    n = 6
    items: List[object] = [data] * n
    items.insert(2, jpeg)  # a JPEG among them keeps its own row
    indices = np.array([10, 11, 50, 12, 13, 14, 15])
    with fastdata.Engine(2) as engine:
        out = np.zeros((n + 1, 40, 40, 3), np.uint8)
        report = engine.run(items, t, out, seed=3, indices=indices)
    assert report.fallbacks == n
    assert report.failures == [] and report.failed_rows == []
    refs = reference_rows(items, t, 3, 0, indices)
    for row in range(n + 1):
        if row != 2:  # no DCT scaling on the fallback path: near-exact
            assert psnr(out[row], refs[row]) >= 40.0, row
    assert psnr(out[2], refs[2]) >= MIN_PSNR
    assert np.array_equal(out[2], fastdata.decode_batch([jpeg], t, seed=3, indices=[50], threads=1)[0])
    # decode_batch (raise mode) accepts it too
    assert np.array_equal(fastdata.decode_batch([data], t, seed=3, indices=[10])[0], out[0])
    # and CenterCrop: torchvision Resize + CenterCrop on the Pillow decode
    out = fastdata.decode_batch([data], fastdata.CenterCrop(64, resize=80))
    want = np.asarray(T.CenterCrop(64)(T.Resize(80)(pillow_oriented(data))))
    assert psnr(out[0], want) >= MIN_PSNR


# ------------------------------------------------------------------ Engine

def test_engine_matches_decode_batch(mixed):
    want = fastdata.decode_batch(mixed, RRC, seed=1, epoch=2)
    with fastdata.Engine(threads=2) as engine:
        assert engine.threads == 2
        out = np.zeros_like(want)
        report = engine.run(mixed, RRC, out, seed=1, epoch=2)
        assert np.array_equal(out, want)
        assert report.failures == [] and report.warnings == 0
        assert report.fallbacks == 1  # the PNG
        assert report.decode_seconds > 0
    with pytest.raises(RuntimeError):
        engine.run(mixed, RRC, out)


def test_engine_releases_gil():
    # While a background thread is inside Engine.run, the main thread must keep running
    # Python. If the GIL were held, the loop below could not advance until run returned.
    data = encode_jpeg(photo_like(375, 500))
    items = [data] * 160  # long enough to tell (~0.1 s) even with a fast decoder
    out = np.zeros((len(items), 48, 64, 3), np.uint8)
    with fastdata.Engine(threads=1) as engine:
        engine.run(items[:2], RRC, out[:2])  # warm up
        done = threading.Event()
        t0 = time.perf_counter()

        def work():
            engine.run(items, RRC, out)
            done.set()

        thread = threading.Thread(target=work)
        thread.start()
        spins = 0
        spins_while_running = 0
        while not done.is_set():
            spins += 1
            if thread.is_alive():
                spins_while_running += 1
        thread.join()
        elapsed = time.perf_counter() - t0
    assert elapsed > 0.02, "batch too small to tell"
    assert spins_while_running > 1000, f"main thread ran only {spins_while_running} loops in {elapsed:.3f} s"


@pytest.mark.gpu
def test_pinned_out_copies_to_gpu(mixed):
    # How the loader uses it: native threads write a pinned tensor, then an async H2D copy.
    t = torch.empty((len(mixed), 48, 64, 3), dtype=torch.uint8, pin_memory=True)
    assert t.is_pinned()
    fastdata.decode_batch(mixed, RRC, t.numpy(), seed=4)
    on_gpu = t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert np.array_equal(on_gpu.cpu().numpy(), fastdata.decode_batch(mixed, RRC, seed=4))
