"""Crop geometry and fused crop/resize/flip output against torchvision and Pillow.

* Box distribution: ``fastdata._C.sample_crop_boxes`` vs torchvision's
  ``RandomResizedCrop.get_params`` (two-sample KS tests on area, log aspect ratio and
  relative centre; binomial test on the flip rate), the exact fallback box, bounds.
* Output: each ``decode_batch`` row vs Pillow ``crop(box).resize(size, BILINEAR)`` (+ flip)
  on the EXIF-oriented image; CenterCrop vs torchvision ``Resize`` + ``CenterCrop``;
  ``roi=True`` vs ``roi=False`` (bit-identical whenever DCT scaling is not used).

All randomness is seeded, so every statistical test is deterministic (no flakes).
"""
from __future__ import annotations

import math
from typing import List, Tuple

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from scipy import stats

import fastdata
from fastdata import _C
from imagegen_native import jpeg, photo, pil_crop_resize, pil_oriented, psnr

N_DRAWS = 4000
ALPHA = 0.001


# ----------------------------------------------------------------- box distribution

def engine_boxes(h: int, w: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, seed=0, epoch=0,
                 n: int = N_DRAWS) -> np.ndarray:
    """int64 [n, 5] = (top, left, height, width, flip)."""
    return _C.sample_crop_boxes(h, w, scale, ratio, hflip, seed, epoch, np.arange(n, dtype=np.int64))


def torchvision_boxes(h: int, w: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed: int = 0,
                      n: int = N_DRAWS) -> np.ndarray:
    """int64 [n, 4] = (top, left, height, width) from torchvision's own sampler."""
    torch.manual_seed(seed)
    img = torch.empty(3, h, w)
    return np.array([T.RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)],
                    dtype=np.int64)


def features(boxes: np.ndarray, h: int, w: int) -> dict:
    top, left, bh, bw = (boxes[:, k].astype(np.float64) for k in range(4))
    return {
        "area": bh * bw / (h * w),
        "log_aspect": np.log(bw / bh),
        "center_x": (left + bw / 2) / w,
        "center_y": (top + bh / 2) / h,
    }


def fallback_box(h: int, w: int, ratio=(3 / 4, 4 / 3)) -> Tuple[int, int, int, int]:
    """torchvision's central-crop fallback, written out (top, left, height, width)."""
    in_ratio = w / h
    if in_ratio < min(ratio):
        bw, bh = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        bh, bw = h, int(round(h * max(ratio)))
    else:
        bw, bh = w, h
    return (h - bh) // 2, (w - bw) // 2, bh, bw


DIST_CASES = [
    # (height, width, scale, ratio): ImageNet-like, portrait, wide (about 6% of draws fall
    # back to the centre crop), non-default parameters.
    (375, 500, (0.08, 1.0), (3 / 4, 4 / 3)),
    (640, 427, (0.08, 1.0), (3 / 4, 4 / 3)),
    (120, 400, (0.08, 1.0), (3 / 4, 4 / 3)),
    (300, 300, (0.25, 0.9), (0.5, 2.0)),
]


@pytest.mark.parametrize("h,w,scale,ratio", DIST_CASES)
def test_box_distribution_matches_torchvision(h: int, w: int, scale, ratio) -> None:
    ours = engine_boxes(h, w, scale, ratio, seed=1)[:, :4]
    theirs = torchvision_boxes(h, w, scale, ratio, seed=1)
    fo, ft = features(ours, h, w), features(theirs, h, w)
    for name in fo:
        p = stats.ks_2samp(fo[name], ft[name]).pvalue
        assert p > ALPHA, f"{name}: KS p = {p:.2g} (ours mean {fo[name].mean():.4f}, torchvision {ft[name].mean():.4f})"
    # How often the 10 tries all fail and the centre crop is used: same rate.
    fb = np.array(fallback_box(h, w, ratio))
    k_ours, k_theirs = int((ours == fb).all(1).sum()), int((theirs == fb).all(1).sum())
    if k_ours + k_theirs:
        table = [[k_ours, N_DRAWS - k_ours], [k_theirs, N_DRAWS - k_theirs]]
        assert stats.fisher_exact(table).pvalue > ALPHA, table


@pytest.mark.parametrize("hflip", [0.5, 0.2])
def test_flip_rate(hflip: float) -> None:
    flips = engine_boxes(375, 500, hflip=hflip, seed=2)[:, 4]
    assert set(np.unique(flips)) <= {0, 1}
    assert stats.binomtest(int(flips.sum()), len(flips), hflip).pvalue > ALPHA


def test_flip_probability_zero_and_one() -> None:
    assert not engine_boxes(375, 500, hflip=0.0, n=500)[:, 4].any()
    assert engine_boxes(375, 500, hflip=1.0, n=500)[:, 4].all()


def test_flip_is_independent_of_the_box() -> None:
    b = engine_boxes(375, 500, seed=3)
    area = b[:, 2] * b[:, 3]
    flipped, kept = area[b[:, 4] == 1], area[b[:, 4] == 0]
    assert stats.ks_2samp(flipped, kept).pvalue > ALPHA


@pytest.mark.parametrize("h,w", [(30, 2000), (2000, 30), (10, 500)])
def test_fallback_box_is_torchvision_exactly(h: int, w: int) -> None:
    # So thin that no try can fit: every draw is torchvision's deterministic fallback.
    ours = engine_boxes(h, w, seed=4, n=200)[:, :4]
    theirs = torchvision_boxes(h, w, seed=4, n=20)
    assert (theirs == theirs[0]).all()
    assert (ours == theirs[0]).all(), (ours[0], theirs[0])
    assert tuple(theirs[0]) == fallback_box(h, w)


@pytest.mark.parametrize("h,w,scale,ratio", DIST_CASES + [(33, 47, (0.08, 1.0), (3 / 4, 4 / 3)),
                                                          (1, 1, (0.08, 1.0), (3 / 4, 4 / 3))])
def test_every_box_is_inside_and_within_bounds(h: int, w: int, scale, ratio) -> None:
    b = engine_boxes(h, w, scale, ratio, seed=5)
    top, left, bh, bw = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    assert (top >= 0).all() and (left >= 0).all() and (bh >= 1).all() and (bw >= 1).all()
    assert (top + bh <= h).all() and (left + bw <= w).all()
    fb = np.array(fallback_box(h, w, ratio))
    is_fallback = (b[:, :4] == fb).all(1)
    # A drawn box is round(sqrt(area*aspect)) x round(sqrt(area/aspect)): allow the rounding.
    area = h * w
    ok_area = ((bw - 0.5) * (bh - 0.5) <= scale[1] * area + 1e-9) & ((bw + 0.5) * (bh + 0.5) >= scale[0] * area - 1e-9)
    ok_ratio = ((bw - 0.5) / (bh + 0.5) <= ratio[1] + 1e-9) & ((bw + 0.5) / np.maximum(bh - 0.5, 1e-9) >= ratio[0] - 1e-9)
    bad = ~(is_fallback | (ok_area & ok_ratio))
    assert not bad.any(), b[bad][:5]


def test_boxes_depend_on_seed_epoch_index_only() -> None:
    a = engine_boxes(375, 500, seed=6, epoch=2, n=64)
    assert np.array_equal(a, engine_boxes(375, 500, seed=6, epoch=2, n=64))
    assert not np.array_equal(a, engine_boxes(375, 500, seed=6, epoch=3, n=64))
    assert not np.array_equal(a, engine_boxes(375, 500, seed=7, epoch=2, n=64))
    one = _C.sample_crop_boxes(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), 0.5, 6, 2, np.array([41], dtype=np.int64))
    assert np.array_equal(one[0], a[41])


# ----------------------------------------------------------------- fused output

FUSED_CASES = [
    # (oriented height, width, orientation, subsampling, output size)
    (300, 400, 1, "4:2:0", 48),
    (300, 400, 1, "4:2:0", (64, 80)),
    (375, 500, 6, "4:2:2", 56),
    (400, 300, 8, "4:4:4", (72, 48)),
    (224, 296, 3, "4:2:0", 40),
    (181, 257, 6, "4:2:0", 48),   # stored dimensions not multiples of 8
    (333, 500, 3, "4:4:4", 48),
    (257, 181, 2, "4:2:0", 40),
    (300, 400, 1, "4:2:0", 224),  # every crop < 2x output: no DCT scaling
]


def fused_rows(data: bytes, transform: fastdata.RandomResizedCrop, n: int, seed: int) -> List[Tuple[float, bool]]:
    """(PSNR vs the Pillow reference, DCT-scaled?) for rows 0..n-1 of one decode_batch."""
    info = fastdata.probe(data)
    oh, ow = transform.output_size
    boxes = _C.sample_crop_boxes(info.oriented_height, info.oriented_width, transform.scale, transform.ratio,
                                 transform.hflip, seed, 0, np.arange(n, dtype=np.int64))
    out = fastdata.decode_batch([data] * n, transform, seed=seed, threads=2)
    ref_img = pil_oriented(data)
    rows = []
    for i, (top, left, bh, bw, flip) in enumerate(boxes):
        ref = pil_crop_resize(ref_img, int(top), int(left), int(bh), int(bw), (oh, ow), bool(flip))
        rows.append((psnr(out[i], ref), bh >= 2 * oh and bw >= 2 * ow))
    return rows


@pytest.mark.parametrize("h,w,orientation,subsampling,size", FUSED_CASES)
def test_fused_random_resized_crop_matches_pillow(h: int, w: int, orientation: int, subsampling: str, size) -> None:
    data = jpeg(photo(h, w, seed=h * w + orientation), orientation=orientation, subsampling=subsampling)
    rows = fused_rows(data, fastdata.RandomResizedCrop(size), n=24, seed=orientation)
    worst = min(p for p, _ in rows)
    assert worst >= 30.0, f"worst row PSNR {worst:.1f} dB (DCT-scaled rows: {sum(d for _, d in rows)}/24)"


def test_fused_cases_cover_the_dct_scaled_path() -> None:
    # Guards the table above: both paths are exercised.
    data = jpeg(photo(300, 400, seed=0))
    rows = fused_rows(data, fastdata.RandomResizedCrop(48), n=24, seed=1)
    assert sum(d for _, d in rows) >= 12
    rows = fused_rows(data, fastdata.RandomResizedCrop(224), n=8, seed=1)
    assert not any(d for _, d in rows)


def test_plan_boxes_are_the_sampled_boxes() -> None:
    # Engine.plan's boxes (oriented pixels) and flips are sample_crop_boxes' on the oriented size.
    t = fastdata.RandomResizedCrop(48)
    data = jpeg(photo(181, 257, seed=1), orientation=6)
    with fastdata.Engine(1) as engine:
        plan = engine.plan([data] * 32, t, seed=9, epoch=4)
    b = _C.sample_crop_boxes(181, 257, t.scale, t.ratio, t.hflip, 9, 4, np.arange(32, dtype=np.int64))
    expect = np.stack([b[:, 1], b[:, 0], b[:, 1] + b[:, 3], b[:, 0] + b[:, 2]], axis=1).astype(np.float64)
    assert np.array_equal(plan.boxes, expect)
    assert np.array_equal(plan.flips, b[:, 4].astype(bool))
    assert (plan.sizes == [181, 257]).all() and (plan.orientations == 6).all()


def step_image() -> np.ndarray:
    """Four flat quadrants meeting at (x=100, y=77) of a 203x157 picture: edges to locate."""
    img = np.zeros((157, 203, 3), np.uint8)
    img[:, 100:, 0] = 255
    img[77:, :, 1] = 255
    img[:, :, 2] = 128
    return img


@pytest.mark.parametrize("size,resize", [(24, 28), (36, 40), (64, 72)])
def test_dct_scaling_keeps_edges_in_place_for_every_orientation(size: int, resize: int) -> None:
    # A crop 2-6x the output is DCT-scaled (1/2, 1/4). Stored sizes (203, 157) are not
    # multiples of 2/4/8, so a mirrored axis that ignored the partial last block would move
    # every edge by up to d-1 source pixels. The scaled IDCT differs from Pillow's filter by an
    # amount that depends on where edges fall on the block grid (so PSNR varies with the
    # orientation); what must not vary is the position: in every orientation the output is
    # closer to the exact reference than to the reference of the image moved by one pixel.
    t = fastdata.CenterCrop(size, resize=resize)
    ref_tf = T.Compose([T.Resize(resize), T.CenterCrop(size)])
    misplaced = {}
    for orientation in range(1, 9):
        data = jpeg(step_image(), orientation=orientation, subsampling="4:4:4", quality=100)
        out = fastdata.decode_batch([data], t, threads=1)[0]
        oriented = np.asarray(pil_oriented(data))
        scores = {}
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                moved = np.roll(np.roll(oriented, dx, axis=1), dy, axis=0)
                scores[(dx, dy)] = psnr(out, np.asarray(ref_tf(Image.fromarray(moved))))
        best = max(scores, key=scores.get)
        if best != (0, 0) or scores[(0, 0)] < 30.0:
            misplaced[orientation] = (best, round(scores[(0, 0)], 1), round(scores[best], 1))
    assert not misplaced, f"orientation: (best shift, dB unshifted, dB best) = {misplaced}"


CENTER_CASES = [
    # (oriented height, width, orientation): ImageNet-like, portrait, the DCT-scaled path
    # (1600x1200: crop 4.7x the output -> 1/4), upscaling (shorter side < 256), EXIF-rotated.
    (375, 500, 1),
    (500, 333, 1),
    (1200, 1600, 1),
    (150, 200, 1),
    (500, 375, 6),
    (1000, 750, 8),
]


@pytest.mark.parametrize("h,w,orientation", CENTER_CASES)
def test_center_crop_matches_torchvision(h: int, w: int, orientation: int) -> None:
    data = jpeg(photo(h, w, seed=h + w), orientation=orientation)
    ref = np.asarray(T.Compose([T.Resize(256), T.CenterCrop(224)])(pil_oriented(data)))
    out = fastdata.decode_batch([data], fastdata.CenterCrop(224, resize=256), threads=1)[0]
    assert out.shape == ref.shape == (224, 224, 3)
    assert psnr(out, ref) >= 30.0


def test_center_crop_default_resize_is_256_for_224() -> None:
    data = jpeg(photo(300, 420, seed=1))
    a = fastdata.decode_batch([data], fastdata.CenterCrop(224), threads=1)
    b = fastdata.decode_batch([data], fastdata.CenterCrop(224, resize=256), threads=1)
    assert np.array_equal(a, b)


# ----------------------------------------------------------------- ROI decode vs full decode

ROI_KINDS = {
    "420": dict(subsampling="4:2:0"),
    "422": dict(subsampling="4:2:2"),
    "444": dict(subsampling="4:4:4"),
    "progressive": dict(progressive=True),
    "restart": dict(restart_blocks=2),
    "orient5": dict(orientation=5),
    "orient6": dict(orientation=6),
    "orient7": dict(orientation=7),
    "orient3": dict(orientation=3),
    "orient2": dict(orientation=2),
}


def run_both(data: bytes, transform, n: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    oh, ow = transform.output_size
    roi = np.empty((n, oh, ow, 3), np.uint8)
    full = np.empty_like(roi)
    with fastdata.Engine(2) as engine:
        r1 = engine.run([data] * n, transform, roi, seed=seed, roi=True)
        r2 = engine.run([data] * n, transform, full, seed=seed, roi=False)
    assert not r1.failures and not r2.failures
    return roi, full


@pytest.mark.parametrize("kind", list(ROI_KINDS) + ["gray", "cmyk"])
def test_roi_decode_is_bit_identical_without_dct_scaling(kind: str) -> None:
    # 211x317 (odd, partial MCUs); outputs of at least 112x160 (and CenterCrop's 180 vs 211):
    # every crop is < 2x the output, so no DCT scaling, and the only difference between the
    # paths is decoding a region (+1 px margin) vs the whole image.
    pixels = photo(211, 317, seed=8)
    if kind == "gray":
        data = jpeg(Image.fromarray(pixels).convert("L"))
    elif kind == "cmyk":
        data = jpeg(Image.fromarray(pixels).convert("CMYK"))
    else:
        data = jpeg(pixels, **ROI_KINDS[kind])
    for transform in (fastdata.RandomResizedCrop(224), fastdata.RandomResizedCrop((112, 160)),
                      fastdata.CenterCrop(160, resize=180)):
        roi, full = run_both(data, transform, n=12, seed=3)
        diff = [i for i in range(len(roi)) if not np.array_equal(roi[i], full[i])]
        assert not diff, f"{transform}: rows {diff} differ (max {np.abs(roi.astype(int) - full).max()})"


def test_roi_decode_close_to_full_decode_with_dct_scaling() -> None:
    data = jpeg(photo(480, 640, seed=9))
    roi, full = run_both(data, fastdata.RandomResizedCrop(64), n=16, seed=4)
    worst = min(psnr(roi[i], full[i]) for i in range(16))
    assert worst >= 30.0, worst
    assert not np.array_equal(roi, full)  # the scaled path was really taken


def test_torchvision_fallback_semantics_in_output() -> None:
    # A 30x400 strip: every draw falls back to the central 40x30 box; check the pixels too.
    pixels = photo(30, 400, seed=10)
    data = jpeg(pixels, subsampling="4:4:4", quality=95)
    t = fastdata.RandomResizedCrop(30, hflip=0.0)
    out = fastdata.decode_batch([data] * 4, t, threads=1)
    top, left, bh, bw = fallback_box(30, 400)
    ref = pil_crop_resize(pil_oriented(data), top, left, bh, bw, (30, 30), False)
    for row in out:
        assert psnr(row, ref) >= 40.0
    assert math.isclose(bw / bh, 4 / 3, rel_tol=0.02)


@pytest.mark.parametrize("subsampling", ["4:1:1", "4:4:0"])
def test_roi_decode_bit_identical_411_440(subsampling: str) -> None:
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2, "IMWRITE_JPEG_SAMPLING_FACTOR"):
        pytest.skip("OpenCV too old to choose JPEG subsampling")
    from imagegen_native import opencv_jpeg
    data = opencv_jpeg(photo(211, 317, seed=12), subsampling)
    roi, full = run_both(data, fastdata.RandomResizedCrop((112, 160)), n=12, seed=5)
    assert np.array_equal(roi, full)


@pytest.mark.parametrize("h,w", [(1, 1), (1, 9), (9, 1), (2, 3), (1, 300), (300, 1)])
@pytest.mark.parametrize("orientation", [1, 6])
def test_degenerate_sizes_match_pillow(h: int, w: int, orientation: int) -> None:
    data = jpeg(photo(h, w, seed=1), orientation=orientation)
    img = pil_oriented(data)
    t = fastdata.RandomResizedCrop(16)
    out = fastdata.decode_batch([data] * 4, t, threads=1)
    boxes = _C.sample_crop_boxes(h, w, t.scale, t.ratio, t.hflip, 0, 0, np.arange(4, dtype=np.int64))
    for i in range(4):
        top, left, bh, bw, flip = (int(v) for v in boxes[i])
        assert psnr(out[i], pil_crop_resize(img, top, left, bh, bw, (16, 16), bool(flip))) >= 40.0
    ref = np.asarray(T.Compose([T.Resize(20), T.CenterCrop(16)])(img))
    assert psnr(fastdata.decode_batch([data], fastdata.CenterCrop(16, resize=20), threads=1)[0], ref) >= 40.0
