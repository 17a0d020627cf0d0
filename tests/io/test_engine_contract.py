"""The typed contract between Python and fastdata._C: the transform spec is validated in C++,
status codes come from C++, and batch results have named, typed fields.

Oracles: the transforms' own parameters, Pillow (a PNG is "not a JPEG"), and the files the
test makes broken on purpose.
"""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata import _C
from fastdata.io.engine import native_spec
from imagegen import encode_jpeg, photo_like

RRC = _C.TransformKind.RANDOM_RESIZED_CROP


def spec(**kw) -> _C.TransformSpec:
    return _C.TransformSpec(**{"kind": RRC, "out_h": 8, "out_w": 8, **kw})


def test_native_spec_carries_every_transform_parameter():
    t = fastdata.RandomResizedCrop((24, 32), scale=(0.25, 0.9), ratio=(0.5, 2.0), hflip=0.3)
    s = native_spec(t, roi=False)
    assert (s.kind, s.out_h, s.out_w) == (RRC, 24, 32)
    assert (s.scale_lo, s.scale_hi, s.ratio_lo, s.ratio_hi, s.hflip, s.roi) == (0.25, 0.9, 0.5, 2.0, 0.3, False)
    c = native_spec(fastdata.CenterCrop(224))
    assert (c.kind, c.out_h, c.out_w, c.resize_to, c.hflip, c.roi) == (_C.TransformKind.CENTER_CROP, 224, 224,
                                                                        256, 0.0, True)
    assert native_spec(fastdata.CenterCrop(32, resize=40)).resize_to == 40


def test_native_spec_follows_the_transform_and_roi():
    a, b = fastdata.RandomResizedCrop(16), fastdata.RandomResizedCrop(16, hflip=0.0)
    assert native_spec(a).hflip == 0.5 and native_spec(b).hflip == 0.0 and native_spec(a).hflip == 0.5
    assert native_spec(a, roi=False).roi is False and native_spec(a).roi is True
    with pytest.raises(TypeError, match="RandomResizedCrop or fastdata.CenterCrop"):
        native_spec(None)


@pytest.mark.parametrize("bad, field", [
    (dict(out_h=0), "out_h"), (dict(out_w=16385), "out_w"),
    (dict(scale_lo=0.0), "scale"), (dict(scale_lo=0.9, scale_hi=0.5), "scale"), (dict(scale_lo=math.nan), "scale"),
    (dict(ratio_lo=-1.0), "ratio"), (dict(ratio_hi=math.nan), "ratio"),
    (dict(hflip=1.5), "hflip"), (dict(hflip=-0.1), "hflip"), (dict(hflip=math.nan), "hflip"),
    (dict(resize_to=0), "resize_to"),
])
def test_spec_rejects_bad_values_in_cpp(bad, field):
    with pytest.raises(ValueError, match=f"TransformSpec: .*{field}"):
        spec(**bad)


@pytest.mark.parametrize("bad", [dict(kind=0), dict(out_h="8"), dict(hflip="x"), dict(out_h=8.5)])
def test_spec_rejects_bad_types(bad):
    with pytest.raises(TypeError):
        spec(**bad)


def test_spec_is_immutable_and_keyword_only():
    s = spec(hflip=0.25)
    with pytest.raises(AttributeError):
        s.hflip = 0.5
    with pytest.raises(TypeError):
        _C.TransformSpec(RRC, 8, 8)
    assert "hflip=0.25" in repr(s) and "RANDOM_RESIZED_CROP" in repr(s)


def test_engine_takes_only_a_spec():
    engine = _C.Engine(1)
    out = np.zeros((0, 8, 8, 3), np.uint8)
    with pytest.raises(TypeError):
        engine.run([], (0, 8, 8, 0.08, 1.0, 0.75, 4 / 3, 0.5, 0, True), out, 0, 0, None, False, 0, 0)  # the old tuple


def png_bytes() -> bytes:
    buf = io.BytesIO()
    photo_like(20, 20, index=1).save(buf, "PNG")
    return buf.getvalue()


def test_batch_report_fields_and_statuses(tmp_path):
    good = encode_jpeg(photo_like(40, 48, index=2), quality=90)
    items = [good, png_bytes(), b"\xff\xd8\xff" + bytes(50), str(tmp_path / "missing.jpg")]
    out = np.full((4, 8, 8, 3), 7, np.uint8)
    report = _C.Engine(2).run(items, spec(), out, 0, 0, None, False, 0, 0)
    assert isinstance(report, _C.BatchReport)
    assert [(f.row, f.status) for f in report.failures] == [
        (1, _C.SampleStatus.NOT_JPEG), (2, _C.SampleStatus.DECODE_ERROR), (3, _C.SampleStatus.READ_ERROR)]
    assert "No such file" in report.failures[2].message and report.failures[1].message  # Python adds the name
    assert (out[1] == 7).all()  # NOT_JPEG rows are left for the caller's fallback
    assert (out[2] == 0).all() and (out[3] == 0).all() and (out[0] != 7).any()
    assert isinstance(report.warnings, int) and report.decode_seconds > 0 and report.read_seconds >= 0


def test_crop_plan_fields_match_the_engine_boxes():
    datas = [encode_jpeg(photo_like(40 + 4 * i, 60, index=i), quality=90) for i in range(5)] + [png_bytes()]
    plan = _C.Engine(1).plan(datas, spec(out_h=16, out_w=16), 3, 4, np.arange(10, 16), 0, 0)
    assert isinstance(plan, _C.CropPlan)
    assert plan.boxes.dtype == np.float64 and plan.boxes.shape == (6, 4)
    assert plan.flips.dtype == np.bool_ and plan.flips.shape == (6,)
    assert plan.sizes.dtype == np.int32 and plan.sizes.shape == (6, 2)
    assert plan.orientations.dtype == np.int32 and plan.orientations.shape == (6,)
    assert [(f.row, f.status) for f in plan.failures] == [(5, _C.SampleStatus.NOT_JPEG)]
    for i in range(5):  # the same draw as sample_crop_boxes (top, left, height, width, flip)
        h = 40 + 4 * i
        top, left, bh, bw, flip = _C.sample_crop_boxes(h, 60, (0.08, 1.0), (0.75, 4 / 3), 0.5, 3, 4, [10 + i])[0]
        assert plan.boxes[i].tolist() == [left, top, left + bw, top + bh]
        assert bool(plan.flips[i]) == bool(flip)
        assert plan.sizes[i].tolist() == [h, 60] and plan.orientations[i] == 1


def test_rows_are_claimed_largest_first_when_every_row_is_a_buffer():
    # A run ends with its last row: threads take big rows first (stable among equal sizes).
    # Paths keep their order: their sizes are unknown until read.
    sizes = [5, 9, 9, 1, 20]
    buffers = [False] * 5
    assert _C._claim_order(sizes, buffers) == [4, 1, 2, 0, 3]
    assert _C._claim_order(sizes, [True] * 5) == [0, 1, 2, 3, 4]
    assert _C._claim_order(sizes, [False, False, True, False, False]) == [0, 1, 2, 3, 4]  # one path is enough
    assert _C._claim_order([], []) == []
    was = _C._set_claim_largest_first(False)  # the A/B switch: the rows' own order
    try:
        assert was is True
        assert _C._claim_order(sizes, buffers) == [0, 1, 2, 3, 4]
    finally:
        _C._set_claim_largest_first(was)
    assert _C._claim_order(sizes, buffers) == [4, 1, 2, 0, 3]


def test_each_row_lands_in_its_own_place_whatever_the_claim_order():
    # Sizes spread over 4x so that the claim order differs from the row order; the same rows
    # in another order (items and indices permuted together) give the same pixels per row,
    # and so does each row decoded alone.
    datas = [encode_jpeg(photo_like(h, w, seed=i), quality=q)
             for i, (h, w, q) in enumerate([(60, 80, 50), (200, 150, 95), (90, 90, 75), (160, 240, 90), (40, 40, 60),
                                            (120, 100, 85)])]
    sizes = [len(d) for d in datas]
    assert _C._claim_order(sizes, [False] * len(sizes)) != list(range(len(datas)))
    rrc = fastdata.RandomResizedCrop(48)
    idx = np.arange(10, 10 + len(datas))
    with fastdata.Engine(3) as engine:
        out = np.empty((len(datas), 48, 48, 3), np.uint8)
        report = engine.run(datas, rrc, out, seed=4, epoch=1, indices=idx)
        assert not report.failures
        perm = np.array([3, 0, 5, 1, 4, 2])
        permuted = np.empty_like(out)
        engine.run([datas[i] for i in perm], rrc, permuted, seed=4, epoch=1, indices=idx[perm])
        np.testing.assert_array_equal(permuted, out[perm])
        for i in range(len(datas)):
            alone = np.empty((1, 48, 48, 3), np.uint8)
            engine.run([datas[i]], rrc, alone, seed=4, epoch=1, indices=idx[i:i + 1])
            np.testing.assert_array_equal(alone[0], out[i], err_msg=str(i))
        # The float32 rows (normalized by the threads) land in their places too.
        mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        f32 = np.empty((len(datas), 48, 48, 3), np.float32)
        engine.run(datas, rrc, f32, seed=4, epoch=1, indices=idx, normalize=(mean, std))
        ref = (out.astype(np.float64) / 255 - np.array(mean)) / np.array(std)
        np.testing.assert_allclose(f32, ref, atol=2e-6, rtol=0)
        # A corrupt row (a JPEG start, then noise), the largest so claimed first, fails alone:
        # its row zeroed, the others intact.
        broken = list(datas)
        broken[2] = b"\xff\xd8" + np.random.default_rng(0).bytes(4 * max(sizes))
        assert _C._claim_order([len(d) for d in broken], [False] * len(broken))[0] == 2
        out2 = np.full_like(out, 7)
        report = engine.run(broken, rrc, out2, seed=4, epoch=1, indices=idx)
        assert report.failed_rows == [2]
        assert not out2[2].any()
        keep = [0, 1, 3, 4, 5]
        np.testing.assert_array_equal(out2[keep], out[keep])
