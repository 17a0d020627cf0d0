"""gpu_resize: the batched resampler's Triton kernels against Pillow and the native engine.

The kernels run on CUDA where there is a GPU, else on CPU tensors under Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1): keep images small, the interpreter is slow.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import fastdata
from fastdata import _C
from fastdata.decoders import gpu_resize, resample_kernels
from fastdata.decoders.gpu_resize import ImageLayout, axis_tables, filter_reach, resample_batch
from fastdata.loader.cuda import GpuNormalizer
from fastdata.cli.demo import photo_like_jpeg

from imagegen import psnr


def photos(sizes):
    return [np.asarray(Image.open(io.BytesIO(photo_like_jpeg(7, i, w, h))).convert("RGB")) for i, (w, h) in enumerate(sizes)]


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run(images, boxes, flips, orientations, out_hw, clip=True, chw=False):
    if chw:
        flat = torch.cat([torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))).reshape(-1) for a in images])
    else:
        flat = torch.cat([torch.from_numpy(a.copy()).reshape(-1) for a in images])
    layout = ImageLayout.packed([a.shape[:2] for a in images], chw=chw)
    return resample_batch(flat.to(DEVICE), layout, np.asarray(boxes, float), np.asarray(flips, bool),
                          np.asarray(orientations, np.int64), out_hw, clip).cpu().numpy()


def test_matches_pillow_crop_resize_with_flips_upscale_and_big_downscale():
    sizes = [(120, 90), (200, 150), (64, 100), (300, 220), (90, 90)]
    images = photos(sizes)
    rng = np.random.default_rng(0)
    boxes, flips = [], []
    for w, h in sizes:
        x0, y0 = rng.integers(0, w // 3), rng.integers(0, h // 3)
        boxes.append([x0, y0, rng.integers(x0 + 8, w + 1), rng.integers(y0 + 8, h + 1)])
        flips.append(bool(rng.integers(0, 2)))
    boxes[3] = [0, 0, 300, 220]  # 300 -> 40: a 7.5x antialiased reduction
    for out_hw in [(40, 48), (160, 130)]:  # downscale and upscale
        got = run(images, boxes, flips, [1] * 5, out_hw)
        assert got.shape == (5, out_hw[0], out_hw[1], 3)
        for i, a in enumerate(images):
            ref = Image.fromarray(a).crop(tuple(int(v) for v in boxes[i])).resize(out_hw[::-1], Image.BILINEAR)
            if flips[i]:
                ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
            ref = np.asarray(ref)
            assert psnr(got[i], ref) >= 45, (i, out_hw, psnr(got[i], ref))
            assert np.abs(got[i] - ref).max() <= 2
    # Wrong flip would be visibly different: the oracle distinguishes flips.
    unflipped = run(images[:1], boxes[:1], [not flips[0]], [1], (40, 48))[0]
    assert psnr(unflipped, run(images[:1], boxes[:1], flips[:1], [1], (40, 48))[0]) < 30


def test_fused_resize_center_crop_matches_pillow_box_resize():
    images = photos([(200, 150), (150, 230)])
    boxes = [[12.5, 3.25, 180.75, 140.0], [0.4, 20.2, 149.9, 200.1]]
    got = run(images, boxes, [False, True], [1, 1], (56, 64), clip=False)
    for i, a in enumerate(images):
        ref = Image.fromarray(a).resize((64, 56), Image.BILINEAR, box=tuple(boxes[i]))
        if i == 1:
            ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
        assert psnr(got[i], np.asarray(ref)) >= 45


@pytest.mark.parametrize("chw", [False, True])
def test_exif_orientations_fold_into_the_gather(chw):
    rng = np.random.default_rng(1)
    stored = rng.integers(0, 256, (30, 50, 3), dtype=np.uint8)
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        buf = io.BytesIO()
        Image.fromarray(stored).save(buf, "PNG", exif=exif.tobytes())
        oriented = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue()))))
        h, w = oriented.shape[:2]
        whole = run([stored], [[0, 0, w, h]], [False], [orientation], (h, w), chw=chw)[0]
        np.testing.assert_array_equal(whole, oriented)
        box = (3, 5, w - 4, h - 2)
        part = run([stored], [box], [True], [orientation], (20, 24), chw=chw)[0]
        ref = Image.fromarray(oriented).crop(box).resize((24, 20), Image.BILINEAR).transpose(Image.FLIP_LEFT_RIGHT)
        assert np.abs(part - np.asarray(ref)).max() <= 1


def test_matches_native_engine_for_the_same_plan():
    # Crops below 2x the output: the native engine decodes at full scale (no DCT scaling), so
    # both resamplers see the same libjpeg pixels and use the same fixed-point filter. Where the
    # native engine also runs the horizontal pass first (source rows <= output rows) the bytes
    # are equal; where it runs the vertical pass first, the rounding order differs (<= 1 level).
    datas = [photo_like_jpeg(3, i, 200, 150) for i in range(8)]
    transform = fastdata.RandomResizedCrop(128)
    indices = np.arange(40, 48)
    with fastdata.Engine(2) as engine:
        plan = engine.plan(datas, transform, seed=5, epoch=2, indices=indices)
        native = np.empty((8, 128, 128, 3), np.uint8)
        report = engine.run(datas, transform, native, seed=5, epoch=2, indices=indices)
    assert not report.failures and not plan.failures
    images = [fastdata.decode(d) for d in datas]
    got = run(images, plan.boxes, plan.flips, plan.orientations, (128, 128))
    rows = axis_tables(plan.boxes[:, 1], (plan.boxes[:, 3] - plan.boxes[:, 1]) / 128,
                       np.floor(plan.boxes[:, 1]).astype(np.int64), np.ceil(plan.boxes[:, 3]).astype(np.int64), 128)
    horizontal_first = (rows.need_hi - rows.need_lo) <= 128
    for i in range(8):
        if horizontal_first[i]:
            np.testing.assert_array_equal(got[i], native[i], err_msg=str(i))
        else:
            assert np.abs(got[i] - native[i]).max() <= 1 and psnr(got[i], native[i]) >= 50, i
    assert horizontal_first.sum() >= 4 and not horizontal_first.all()  # both orders were compared
    assert plan.flips.any() and not plan.flips.all()  # both branches were exercised


def test_filter_reach_holds_every_source_pixel_the_filter_reads():
    # DALI's decode window for a fused resize + center crop is the box widened by
    # filter_reach; the filter (axis_tables, the native engine's in Python) must never read
    # outside it, for up- and downscales, fractional boxes and boxes at the image edges.
    rng = np.random.default_rng(3)
    size = 400
    for out in (1, 7, 16, 224):
        x0 = rng.uniform(0, size - 2, 500)
        x1 = np.minimum(size, x0 + rng.uniform(1, size, 500))
        x1[:20] = size  # boxes touching the far edge
        x0[20:40] = 0.0  # and the near one
        scale = (x1 - x0) / out
        tables = axis_tables(x0, scale, np.zeros(500, np.int64), np.full(500, size, np.int64), out)
        reach = filter_reach(scale)
        assert (tables.need_lo >= np.maximum(0, np.floor(x0 - reach))).all()
        assert (tables.need_hi <= np.minimum(size, np.ceil(x1 + reach))).all()


def test_axis_filters_reused_across_calls_equal_fresh_builds():
    # _C.axis_filters keeps the filters it built, keyed by what build_axis_filter's output
    # depends on (window length, origin in the window, scale, output size, flip): a wrong or
    # incomplete key would hand one window another's taps. Oracle: the same call building
    # every filter afresh (cache=False, build_axis_filter itself). Few distinct lengths, both
    # flips, two output sizes, integer boxes at many offsets (RandomResizedCrop) and
    # fractional boxes over whole images (a fused center crop), so most calls hit the cache.
    _C.clear_axis_filter_cache()
    rng = np.random.default_rng(11)
    lengths = np.array([1, 2, 37, 120, 224, 333, 500])
    built = 0
    for trial in range(40):
        n = 48
        out = int(rng.choice([7, 224]))
        size = 600
        if trial % 2 == 0:  # RandomResizedCrop: integer box = window, anywhere in the image
            width = rng.choice(lengths, n)
            lo = rng.integers(0, size - width + 1)
            hi = lo + width
            start = lo.astype(np.float64)
            scale = width / out
        else:  # fused center crop: fractional box, the whole image is the window
            width = rng.choice(lengths[2:], n)
            lo, hi = np.zeros(n, np.int64), width.astype(np.int64)
            start = rng.choice([0.0, 0.25, 3.5], n)
            scale = (width - 2 * start) / out
        reverse = rng.integers(0, 2, n).astype(bool)
        args = (start, scale, lo.astype(np.int64), hi.astype(np.int64), out, reverse)
        got = _C.axis_filters(*args)
        want = _C.axis_filters(*args, cache=False)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w, err_msg=f"trial {trial}")
        built += n
    held = _C.axis_filter_cache_size()
    assert 0 < held < built // 4  # reused: 1,920 windows, few distinct filters


def test_axis_filters_cache_tells_apart_windows_that_differ_in_one_key_field():
    # Pairs of windows alike in every key field but one, the first call filling the cache: a
    # key without that field would hand the second window the first one's filter. Each pair's
    # fresh filters differ (checked), so such a key would fail the comparison with them.
    def relative(tables, lo):
        first, weights, max_count, need_lo, need_hi = tables
        return first - lo, weights, max_count, need_lo - lo, need_hi - lo

    def call(start, scale, lo, hi, out, reverse, cache):
        return _C.axis_filters(np.array([start], float), np.array([scale], float), np.array([lo], np.int64),
                               np.array([hi], np.int64), out, np.array([reverse]), cache=cache)

    pairs = {  # (start, scale, lo, hi, out, reverse) twice
        "origin": ((10.0, 120 / 224, 10, 130, 224, False), (10.25, 120 / 224, 10, 130, 224, False)),
        "scale": ((0.0, 300 / 224, 0, 300, 224, False), (0.0, 1.2, 0, 300, 224, False)),
        "window": ((0.0, 1.0, 0, 120, 120, False), (0.0, 1.0, 0, 121, 120, False)),
        "out": ((0.0, 0.5, 0, 120, 100, False), (0.0, 0.5, 0, 120, 224, False)),
        "reverse": ((0.0, 300 / 224, 0, 300, 224, False), (0.0, 300 / 224, 0, 300, 224, True)),
    }
    for field, (a, b) in pairs.items():
        _C.clear_axis_filter_cache()
        fresh_a, fresh_b = call(*a, cache=False), call(*b, cache=False)
        rel_a, rel_b = relative(fresh_a, a[2]), relative(fresh_b, b[2])
        assert any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(rel_a, rel_b)), field
        call(*a, cache=True)
        got_b = call(*b, cache=True)
        assert _C.axis_filter_cache_size() == 2, field
        for g, w in zip(got_b, fresh_b):
            np.testing.assert_array_equal(g, w, err_msg=field)
    # And the cache hit itself: the same window at another offset, shifted back, equal.
    _C.clear_axis_filter_cache()
    call(0.0, 120 / 224, 0, 120, 224, False, cache=True)
    moved = call(77.0, 120 / 224, 77, 197, 224, False, cache=True)
    assert _C.axis_filter_cache_size() == 1
    for g, w in zip(moved, call(77.0, 120 / 224, 77, 197, 224, False, cache=False)):
        np.testing.assert_array_equal(g, w)


def test_gpu_normalizer_against_float_reference():
    # The one normalizer of GPU outputs (Loader and backends); runs on CPU tensors too.
    x = torch.randint(0, 256, (2, 5, 7, 3), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ref = (x.double() / 255 - torch.tensor(mean, dtype=torch.float64)) / torch.tensor(std, dtype=torch.float64)
    ref = ref.permute(0, 3, 1, 2)
    y = GpuNormalizer(mean, std, torch.float32, True, torch.device("cpu"))(x)
    assert y.shape == (2, 3, 5, 7) and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=0)
    y16 = GpuNormalizer(mean, std, torch.float16, False, torch.device("cpu"))(x)
    assert y16.dtype == torch.float16 and y16.is_contiguous()
    torch.testing.assert_close(y16.double(), ref, atol=3e-3, rtol=0)
    with pytest.raises(ValueError, match="std"):
        GpuNormalizer(mean, (0.2, 0.0, 0.2), torch.float32, True, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [True, False])
def test_gpu_normalizer_one_pass_equals_float_then_addcmul_then_cast(dtype, channels_last):
    # The normalizer reads uint8 (or float32 0..255) and writes the output dtype in one pass;
    # the values are those of converting to float32 first, then bias + x * scale, then casting.
    x = torch.randint(0, 256, (3, 6, 5, 3), dtype=torch.uint8, device=DEVICE)
    norm = GpuNormalizer((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), dtype, channels_last, DEVICE)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for pixels in (x, x.float()):
        want = torch.addcmul(norm.bias, pixels.permute(0, 3, 1, 2).float(), norm.scale).to(dtype=dtype, memory_format=fmt)
        got = norm(pixels)
        assert got.dtype == dtype and got.is_contiguous(memory_format=fmt) and torch.equal(got, want)


def test_bad_boxes_and_layouts_raise():
    images = photos([(64, 64)])
    flat = torch.from_numpy(images[0].copy()).reshape(-1).to(DEVICE)
    box = np.array([[0, 0, 8, 8]], float)
    with pytest.raises(ValueError, match="reaches element"):  # one element past the buffer
        resample_batch(flat[:-1], ImageLayout.packed([(64, 64)], chw=False), box, [False], [1], (8, 8), True)
    with pytest.raises(ValueError, match="2 images"):
        resample_batch(flat, ImageLayout.packed([(64, 64)], chw=False), np.repeat(box, 2, 0), [False] * 2, [1] * 2,
                       (8, 8), True)
    with pytest.raises(ValueError, match="positive"):
        run(images, [[10, 10, 10, 20]], [False], [1], (8, 8))
    with pytest.raises(ValueError, match="orientation"):
        run(images, [[0, 0, 8, 8]], [False], [9], (8, 8))


def pillow_crop_resize(image, box, out_hw, flip):
    ref = Image.fromarray(image).crop(tuple(int(v) for v in box)).resize(out_hw[::-1], Image.BILINEAR)
    return np.asarray(ref.transpose(Image.FLIP_LEFT_RIGHT) if flip else ref)


def test_mixed_batch_tiny_and_huge_images_upscale_and_heavy_downscale():
    # One launch per pass covers 1-pixel windows (upscaled), tiny images, and a 1600 x 1200
    # crop to 48 x 40 (a 33x reduction: 67 taps per output) in the same ragged batch.
    rng = np.random.default_rng(2)
    tiny = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in [(3, 2), (9, 13)]]
    big, small, mid = photos([(1600, 1200), (40, 30), (260, 190)])
    images = [big, tiny[0], small, tiny[1], mid]
    boxes = [[0, 0, 1600, 1200], [0, 0, 3, 2], [17, 11, 18, 12], [2, 3, 7, 13], [30, 20, 230, 180]]
    flips = [True, False, True, False, True]
    out_hw = (40, 48)
    got = run(images, boxes, flips, [1] * 5, out_hw)
    for i, a in enumerate(images):
        ref = pillow_crop_resize(a, boxes[i], out_hw, flips[i])
        assert np.abs(got[i] - ref).max() <= 2 and psnr(got[i], ref) >= 45, (i, psnr(got[i], ref))
    # The 1-pixel window is that pixel, everywhere.
    np.testing.assert_array_equal(got[2], np.broadcast_to(images[2][11, 17], (40, 48, 3)))


def test_output_does_not_depend_on_the_batch_or_block_sizes(monkeypatch):
    images = photos([(70, 50), (33, 90), (120, 80), (16, 12)])
    boxes = [[5, 4, 60, 50], [0, 10, 33, 70], [10, 0, 120, 75], [1, 1, 15, 11]]
    flips = [False, True, True, False]
    orientations = [1, 6, 3, 8]
    boxes[1] = [10, 0, 70, 33]  # orientation 6: 90 wide x 33 high once oriented
    boxes[3] = [1, 1, 11, 15]
    whole = run(images, boxes, flips, orientations, (24, 28))
    for i in range(4):
        alone = run(images[i:i + 1], boxes[i:i + 1], flips[i:i + 1], orientations[i:i + 1], (24, 28))
        np.testing.assert_array_equal(alone[0], whole[i])
    order = [2, 0, 3, 1]
    shuffled = run([images[i] for i in order], [boxes[i] for i in order], [flips[i] for i in order],
                   [orientations[i] for i in order], (24, 28), chw=True)
    np.testing.assert_array_equal(shuffled, whole[order])
    # The other device's tiles (small GPU blocks under the interpreter, big ones on a GPU).
    other = not resample_kernels.INTERPRETED
    tiles = gpu_resize._tiles
    monkeypatch.setattr(gpu_resize, "_tiles", lambda h, w, interpreted: tiles(h, w, other))
    np.testing.assert_array_equal(run(images, boxes, flips, orientations, (24, 28)), whole)
    # int64 offsets (buffers past 2**31 elements) compute the same addresses.
    monkeypatch.setattr(gpu_resize, "_INT32_OFFSETS", 1000)
    np.testing.assert_array_equal(run(images, boxes, flips, orientations, (24, 28)), whole)


@pytest.mark.parametrize("clip", [True, False])
def test_boxes_touching_every_edge(clip):
    # Whole image, each edge, each corner: the filter's taps stop at the window (clip: the box,
    # Pillow's crop; else the image, Pillow's resize with box=), never outside the buffer.
    (a,) = photos([(60, 44)])
    w, h = 60, 44
    boxes = [[0, 0, w, h], [0, 5, 30, 40], [20, 0, 50, 30], [30, 10, w, 40], [10, 14, 50, h],
             [0, 0, 25, 20], [35, 24, w, h], [0, 24, 25, h], [35, 0, w, 20]]
    flips = [i % 2 == 1 for i in range(len(boxes))]
    got = run([a] * len(boxes), boxes, flips, [1] * len(boxes), (18, 22), clip=clip)
    for i, box in enumerate(boxes):
        if clip:
            ref = pillow_crop_resize(a, box, (18, 22), flips[i])
        else:
            ref = Image.fromarray(a).resize((22, 18), Image.BILINEAR, box=tuple(float(v) for v in box))
            ref = np.asarray(ref.transpose(Image.FLIP_LEFT_RIGHT) if flips[i] else ref)
        assert np.abs(got[i] - ref).max() <= 2 and psnr(got[i], ref) >= 45, (i, psnr(got[i], ref))


@pytest.mark.parametrize("chw", [False, True])
def test_flip_mirrors_the_output_exactly(chw):
    # The flip reverses the horizontal filter table, so a flipped output is the unflipped one
    # mirrored, to the byte, for every EXIF orientation and both layouts.
    rng = np.random.default_rng(4)
    stored = rng.integers(0, 256, (26, 34, 3), dtype=np.uint8)
    orientations = list(range(1, 9))
    boxes = [[2.5, 1, 30, 20] if o < 5 else [1, 2.5, 22, 31] for o in orientations]
    plain = run([stored] * 8, boxes, [False] * 8, orientations, (11, 13), chw=chw)
    flipped = run([stored] * 8, boxes, [True] * 8, orientations, (11, 13), chw=chw)
    np.testing.assert_array_equal(flipped, plain[:, :, ::-1])
    assert np.abs(plain - plain[:, :, ::-1]).max() > 50  # the images are not symmetric


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(resample_kernels, "INTERPRETED", False)
    images = photos([(16, 16)])
    flat = torch.from_numpy(images[0].copy()).reshape(-1)
    with pytest.raises(ValueError, match="CUDA tensors"):
        resample_batch(flat, ImageLayout.packed([(16, 16)], chw=False), np.array([[0, 0, 16, 16]], float),
                       np.array([False]), np.array([1]), (8, 8), True)


def test_aligned_packed_layout_and_a_selection_of_it_equal_the_plain_buffer():
    """ImageLayout.packed with an alignment (the gpu decoder's batch buffer: gaps between the
    images) and ``select`` (the rows it decoded) give the plain packed buffer's output."""
    arrays = photos([(120, 90), (150, 97), (170, 111), (210, 111)])
    boxes = [[3, 4, 100, 80], [0, 0, 150, 97], [20, 10, 170, 100], [5, 5, 111, 200]]
    flips, orientations = [True, False, True, False], [1, 2, 3, 6]
    layout = ImageLayout.packed([a.shape[:2] for a in arrays], chw=False, align=256)
    assert (layout.base % 256 == 0).all() and layout.nbytes() == layout.base[-1] + 210 * 111 * 3
    flat = torch.zeros(layout.nbytes() + 7, dtype=torch.uint8)
    for a, b in zip(arrays, layout.base):
        flat[b:b + a.size] = torch.from_numpy(a.copy().reshape(-1))
    flat = flat.to(DEVICE)
    keep = np.array([True, False, True, True])
    sel = np.flatnonzero(keep)
    want = run([np.ascontiguousarray(arrays[i]) for i in sel], [boxes[i] for i in sel], [flips[i] for i in sel],
               [orientations[i] for i in sel], (48, 56))
    got = resample_batch(flat, layout.select(keep), np.asarray(boxes, float)[keep], np.asarray(flips)[keep],
                         np.asarray(orientations)[keep], (48, 56), True).cpu().numpy()
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="reaches element"):
        resample_batch(flat[:layout.nbytes() - 1], layout, np.asarray(boxes, float), np.asarray(flips),
                       np.asarray(orientations), (48, 56), True)
