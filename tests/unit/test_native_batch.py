"""decode_batch / Engine.run: determinism across threads, RNG keys, the ``out`` contract,
and the item kinds accepted (paths and buffers)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import _C
from imagegen_native import jpeg, photo, pil_crop_resize, pil_oriented, psnr

RRC = fastdata.RandomResizedCrop(48)


@pytest.fixture(scope="module")
def datas() -> List[bytes]:
    """16 varied JPEGs: sizes, subsampling, orientation, gray, progressive, CMYK."""
    out = []
    for i in range(16):
        h, w = 90 + 13 * i, 200 - 7 * i
        px = photo(h, w, seed=100 + i)
        if i % 8 == 3:
            out.append(jpeg(Image.fromarray(px).convert("L")))
        elif i % 8 == 5:
            out.append(jpeg(Image.fromarray(px).convert("CMYK")))
        else:
            out.append(jpeg(px, subsampling=("4:2:0", "4:2:2", "4:4:4")[i % 3], progressive=i % 4 == 1,
                            orientation=1 + i % 8))
    return out


@pytest.mark.parametrize("transform", [RRC, fastdata.RandomResizedCrop((40, 72)), fastdata.CenterCrop(64, resize=72)])
def test_bit_identical_for_1_2_and_8_threads(datas: List[bytes], transform) -> None:
    outs = [fastdata.decode_batch(datas, transform, seed=5, epoch=1, threads=t) for t in (1, 2, 8)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    with fastdata.Engine(8) as engine:  # a fresh pool, and a second call on it
        out = np.empty_like(outs[0])
        for _ in range(2):
            engine.run(datas, transform, out, seed=5, epoch=1)
            assert np.array_equal(out, outs[0])


def test_same_key_same_output_different_epoch_different_crops(datas: List[bytes]) -> None:
    a = fastdata.decode_batch(datas, RRC, seed=3, epoch=0, threads=2)
    assert np.array_equal(a, fastdata.decode_batch(datas, RRC, seed=3, epoch=0, threads=2))
    b = fastdata.decode_batch(datas, RRC, seed=3, epoch=1, threads=2)
    c = fastdata.decode_batch(datas, RRC, seed=4, epoch=0, threads=2)
    differing_b = sum(not np.array_equal(a[i], b[i]) for i in range(len(datas)))
    differing_c = sum(not np.array_equal(a[i], c[i]) for i in range(len(datas)))
    assert differing_b == len(datas) and differing_c == len(datas)
    # ... and it is the crops that differ, as the plan says
    with fastdata.Engine(1) as engine:
        pa = engine.plan(datas, RRC, seed=3, epoch=0)
        pb = engine.plan(datas, RRC, seed=3, epoch=1)
    assert not np.array_equal(pa.boxes, pb.boxes)


def test_center_crop_ignores_the_key(datas: List[bytes]) -> None:
    t = fastdata.CenterCrop(48, resize=56)
    assert np.array_equal(fastdata.decode_batch(datas, t, seed=1, epoch=0), fastdata.decode_batch(datas, t, seed=9, epoch=7))


def test_indices_select_the_rng_stream(datas: List[bytes]) -> None:
    full = fastdata.decode_batch(datas, RRC, seed=2, epoch=3, threads=2)
    one = fastdata.decode_batch([datas[7]], RRC, seed=2, epoch=3, indices=[7], threads=1)
    assert np.array_equal(one[0], full[7])
    # A permuted batch with its indices permuted gives the permuted rows.
    perm = np.random.default_rng(0).permutation(len(datas))
    shuffled = fastdata.decode_batch([datas[i] for i in perm], RRC, seed=2, epoch=3, indices=perm, threads=2)
    assert np.array_equal(shuffled, full[perm])
    # The same image under another index gets another crop.
    other = fastdata.decode_batch([datas[7]], RRC, seed=2, epoch=3, indices=[8], threads=1)
    assert not np.array_equal(other[0], full[7])


def test_large_indices_and_seeds(datas: List[bytes]) -> None:
    big = [2**40 + 3, 2**62]
    kw = dict(seed=2**63 - 1, epoch=10**6, threads=1)
    out = fastdata.decode_batch(datas[:2], RRC, indices=big, **kw)
    assert np.array_equal(out, fastdata.decode_batch(datas[:2], RRC, indices=big, **kw))
    assert np.array_equal(out[1], fastdata.decode_batch([datas[1]], RRC, indices=[2**62], **kw)[0])


def test_out_none_allocates(datas: List[bytes]) -> None:
    out = fastdata.decode_batch(datas, fastdata.RandomResizedCrop((40, 56)))
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8
    assert out.shape == (len(datas), 40, 56, 3) and out.flags.c_contiguous and out.flags.writeable


def test_out_is_written_in_place_and_returned(datas: List[bytes]) -> None:
    out = np.full((len(datas), 48, 48, 3), 7, np.uint8)
    got = fastdata.decode_batch(datas, RRC, out, seed=1)
    assert got is out
    assert np.array_equal(out, fastdata.decode_batch(datas, RRC, seed=1))


@pytest.mark.parametrize("bad,exc", [
    (np.zeros((16, 48, 48, 3), np.float64), TypeError),
    (np.zeros((16, 48, 48, 3), np.int8), TypeError),
    (np.zeros((15, 48, 48, 3), np.uint8), ValueError),
    (np.zeros((16, 48, 47, 3), np.uint8), ValueError),
    (np.zeros((16, 48, 48, 4), np.uint8), ValueError),
    (np.zeros((16, 48, 48), np.uint8), ValueError),
    (np.zeros((16, 48, 96, 3), np.uint8)[:, :, ::2], ValueError),          # strided
    (np.zeros((16, 3, 48, 48), np.uint8).transpose(0, 2, 3, 1), ValueError),  # channels-last view of NCHW
    ("read-only", ValueError),
    ([[0]], TypeError),
])
def test_bad_out_is_refused(datas: List[bytes], bad, exc) -> None:
    if isinstance(bad, str):
        bad = np.zeros((16, 48, 48, 3), np.uint8)
        bad.flags.writeable = False
    before = bad.copy() if isinstance(bad, np.ndarray) else None
    with pytest.raises(exc):
        fastdata.decode_batch(datas, RRC, bad)
    if before is not None:
        assert np.array_equal(bad, before)  # nothing was written


def test_torch_tensor_numpy_view_as_out(datas: List[bytes]) -> None:
    tensor = torch.zeros((len(datas), 48, 48, 3), dtype=torch.uint8)
    got = fastdata.decode_batch(datas, RRC, tensor.numpy(), seed=4)
    assert np.array_equal(tensor.numpy(), fastdata.decode_batch(datas, RRC, seed=4))
    assert np.shares_memory(got, tensor.numpy())


def test_buffer_kinds_and_paths_agree(datas: List[bytes], tmp_path: Path) -> None:
    paths = []
    for i, d in enumerate(datas):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(d)
        paths.append(str(p))
    ref = fastdata.decode_batch(datas, RRC, seed=8, threads=2)
    kinds = [
        paths,
        [memoryview(d) for d in datas],
        [np.frombuffer(d, np.uint8) for d in datas],
        [bytearray(d) for d in datas],
        [d if i % 2 else paths[i] for i, d in enumerate(datas)],  # mixed in one batch
    ]
    for items in kinds:
        assert np.array_equal(fastdata.decode_batch(items, RRC, seed=8, threads=2), ref)


def test_buffer_slices_with_offsets(datas: List[bytes]) -> None:
    # One arena holding all files (as a RAM cache would): items are views into it.
    arena = np.frombuffer(b"".join(datas), np.uint8)
    offsets = np.cumsum([0] + [len(d) for d in datas])
    views = [arena[offsets[i]:offsets[i + 1]] for i in range(len(datas))]
    assert np.array_equal(fastdata.decode_batch(views, RRC, seed=8), fastdata.decode_batch(datas, RRC, seed=8))


def test_empty_batch() -> None:
    out = fastdata.decode_batch([], RRC)
    assert out.shape == (0, 48, 48, 3)


def test_rows_are_the_right_images(datas: List[bytes]) -> None:
    # Row i is image i (not a neighbour's): compare every row to its own Pillow reference.
    out = fastdata.decode_batch(datas, RRC, seed=6, threads=2)
    for i, d in enumerate(datas):
        info = fastdata.probe(d)
        top, left, h, w, flip = _C.sample_crop_boxes(info.oriented_height, info.oriented_width, RRC.scale, RRC.ratio,
                                                     RRC.hflip, 6, 0, np.array([i], np.int64))[0]
        ref = pil_crop_resize(pil_oriented(d), int(top), int(left), int(h), int(w), (48, 48), bool(flip))
        scores = [psnr(out[j], ref) for j in range(len(datas))]
        assert int(np.argmax(scores)) == i and scores[i] >= 30.0


@pytest.mark.parametrize("call,exc", [
    (lambda d: fastdata.decode_batch([d], RRC, on_error="ignore"), ValueError),
    (lambda d: fastdata.decode_batch([d, d], RRC, indices=[1]), ValueError),
    (lambda d: fastdata.decode_batch([d], RRC, indices=[-1]), ValueError),
    (lambda d: fastdata.decode_batch([d], RRC, seed=-1), ValueError),
    (lambda d: fastdata.decode_batch([d], "RandomResizedCrop(48)"), TypeError),
    (lambda d: fastdata.decode_batch([12345], RRC), TypeError),
    (lambda d: fastdata.Engine(0), ValueError),
], ids=["on_error", "indices_len", "indices_negative", "seed_negative", "transform_type", "item_type", "threads"])
def test_bad_arguments(call, exc) -> None:
    # Bad arguments are TypeError/ValueError (architecture: "errors cross the boundary typed").
    with pytest.raises(exc):
        call(jpeg(photo(64, 64)))


def test_concurrent_calls_from_python_threads(datas: List[bytes]) -> None:
    # The loader calls Engine.run from a background thread while other threads run: calls on
    # a shared engine are serialized, calls on different engines run side by side.
    from concurrent.futures import ThreadPoolExecutor
    ref = fastdata.decode_batch(datas, RRC, seed=12, threads=2)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda k: fastdata.decode_batch(datas, RRC, seed=12, threads=1 + k % 2), range(8)))
    for out in outs:
        assert np.array_equal(out, ref)
