"""The typed contract between Python and fastdata._C: the transform spec is validated in C++,
status codes come from C++, and batch results have named, typed fields.

Oracles: the transforms' own parameters, Pillow (a PNG is "not a JPEG"), and the files the
test makes broken on purpose.
"""
from __future__ import annotations

import gc
import io
import math
import os
import signal
import threading
import time

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


# Started runs overlap: once every row of a run has been claimed, free threads take rows of the
# next one (no barrier between runs). Oracle: the same rows decoded by a synchronous run.

def _started_batches(seed: int, runs: int = 12):
    """``runs`` batches of 1..40 rows drawn from JPEGs of varied sizes; every fourth batch has a
    corrupt row (a JPEG start, then noise: a native decode error), and (batch, row) of each."""
    rng = np.random.default_rng(seed)
    pool = [encode_jpeg(photo_like(int(h), int(w), index=i), quality=int(q))
            for i, (h, w, q) in enumerate(zip(rng.integers(24, 200, 40), rng.integers(24, 200, 40),
                                              rng.integers(50, 96, 40)))]
    batches, corrupt = [], []
    for b in range(runs):
        n = int(rng.integers(1, 41)) if b else 40
        items = [pool[int(k)] for k in rng.integers(0, len(pool), n)]
        if b % 4 == 1:
            row = int(rng.integers(0, n))
            items[row] = b"\xff\xd8\xff" + rng.bytes(int(rng.integers(500, 30000)))
            corrupt.append((b, row))
        batches.append(items)
    return batches, corrupt


_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _started_equal_synchronous(threads: int) -> None:
    batches, corrupt = _started_batches(seed=threads)
    rrc = fastdata.RandomResizedCrop(24)
    with fastdata.Engine(threads) as engine:
        def args(b):
            dtype = np.float32 if b % 3 == 2 else np.uint8  # every third run: normalized float32 rows
            out = np.full((len(batches[b]), 24, 24, 3), 7, dtype)
            kw = dict(seed=b, epoch=2, indices=np.arange(len(batches[b])) + 100 * b,
                      normalize=_MEAN_STD if dtype == np.float32 else None)
            return out, kw

        started = []
        for b, items in enumerate(batches):  # back to back, none finished in between
            out, kw = args(b)
            started.append((out, engine.start(items, rrc, out, **kw)))
        reports = [run.finish() for _, run in started]
        for b, items in enumerate(batches):
            want, kw = args(b)
            ref = engine.run(items, rrc, want, **kw)
            out, report = started[b][0], reports[b]
            assert out.tobytes() == want.tobytes(), b
            rows = [row for bb, row in corrupt if bb == b]
            assert report.failed_rows == ref.failed_rows == rows, b
            assert [str(e) for e in report.failures] == [str(e) for e in ref.failures]
            assert report.warnings == ref.warnings
            for row in rows:
                assert not out[row].any()  # zero-filled; the others decoded
            assert all(out[r].any() for r in range(len(items)) if r not in rows)
            assert report.wall_seconds >= 0 and (report.decode_seconds > 0 or len(rows) == len(items))


@pytest.mark.parametrize("threads", [1, 3])
def test_runs_started_back_to_back_equal_synchronous_runs(threads):
    assert _C._overlap_runs() is True  # the default
    _started_equal_synchronous(threads)


def test_runs_started_back_to_back_without_overlap_equal_synchronous_runs():
    was = _C._set_overlap_runs(False)  # the A/B switch: the old barrier between runs
    try:
        assert was is True and _C._overlap_runs() is False
        _started_equal_synchronous(3)
    finally:
        _C._set_overlap_runs(was)
    assert _C._overlap_runs() is True


def test_a_synchronous_run_while_runs_are_started_is_correct():
    batches, _ = _started_batches(seed=7, runs=6)
    rrc = fastdata.RandomResizedCrop(24)
    with fastdata.Engine(3) as engine:
        want = [np.empty((len(items), 24, 24, 3), np.uint8) for items in batches]
        for items, w in zip(batches, want):
            engine.run(items, rrc, w, seed=3)
        outs = [np.full_like(w, 7) for w in want]
        runs = [engine.start(items, rrc, o, seed=3) for items, o in zip(batches, outs)]
        # The caller works on its own rows at once (worker 0), the workers join once the started
        # runs' rows are claimed; the queue thread (its own scratch) keeps to the started runs.
        sync = [np.full_like(w, 7) for w in want]
        for items, s in zip(batches, sync):
            engine.run(items, rrc, s, seed=3)
        plan = engine.plan(batches[0], rrc, seed=3)
        for r in runs:
            r.finish()
        for w, o, s in zip(want, outs, sync):
            assert o.tobytes() == w.tobytes() and s.tobytes() == w.tobytes()
        assert plan.failed_rows == [row for row in range(len(batches[0])) if not want[0][row].any()]


def test_a_native_engine_destroyed_with_runs_started_finishes_them_first():
    """The native destructor waits for every started run (its caller holds the buffers): the
    handles then report the same as synchronous runs. On a thread, so that a hang fails."""
    batches, corrupt = _started_batches(seed=11, runs=8)
    s = spec(out_h=24, out_w=24)
    ref_engine = _C.Engine(2)
    want = [np.empty((len(items), 24, 24, 3), np.uint8) for items in batches]
    refs = [ref_engine.run(items, s, w, 5, 0, None, False, 0, 0) for items, w in zip(batches, want)]
    got: dict = {}

    def scenario():
        engine = _C.Engine(3)
        outs = [np.full_like(w, 7) for w in want]
        pending = [engine.start_run(items, s, o, 5, 0, None, False, 0, 0) for items, o in zip(batches, outs)]
        del engine
        gc.collect()  # the native destructor runs here, with runs still started
        got["done"] = [p.done() for p in pending]
        got["reports"] = [p.wait() for p in pending]
        got["outs"] = outs

    t = threading.Thread(target=scenario, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "destroying an engine with runs started hung"
    assert all(got["done"])  # finished by the destructor
    for b, (o, w, report, ref) in enumerate(zip(got["outs"], want, got["reports"], refs)):
        assert o.tobytes() == w.tobytes(), b
        assert [(f.row, f.status) for f in report.failures] == [(f.row, f.status) for f in ref.failures]
        assert [f.row for f in report.failures] == [row for bb, row in corrupt if bb == b]


def test_started_runs_wall_seconds_count_overlap_once():
    """Each started run is charged from the later of its start and the previous run's end to
    its own end: the sum is at most the time the sequence took, and more than nothing."""
    batches, _ = _started_batches(seed=5)
    rrc = fastdata.RandomResizedCrop(24)
    with fastdata.Engine(3) as engine:
        outs = [np.empty((len(items), 24, 24, 3), np.uint8) for items in batches]
        t0 = time.monotonic()
        runs = [engine.start(items, rrc, o) for items, o in zip(batches, outs)]
        walls = [r.finish().wall_seconds for r in runs]
        elapsed = time.monotonic() - t0
    assert all(w >= 0 for w in walls)
    assert 0 < sum(walls) <= elapsed + 1e-4


def test_a_started_run_s_rows_start_while_the_run_before_it_still_decodes():
    """Run A is one slow row (a full decode of a 3000x3000 JPEG, ~40 ms here), run B many small
    ones (~3 ms of decoding), on two threads. With the overlap one thread decodes A's row while
    the other decodes all of B: the two runs are charged together about A's time alone (B ran
    inside A's window, which they share by decode seconds: B is not charged ~0, which would read
    as a huge rate). With the old barrier B started once A had ended: at least A's row plus B's
    span (half its two threads' decode seconds)."""
    big = encode_jpeg(Image.fromarray(np.tile(np.asarray(photo_like(500, 500, index=3)), (6, 6, 1))), quality=95)
    small = [encode_jpeg(photo_like(96, 128, index=i), quality=85) for i in range(80)]
    rrc = fastdata.RandomResizedCrop(32)

    def a_then_b():
        out_a, out_b = np.empty((1, 32, 32, 3), np.uint8), np.empty((len(small), 32, 32, 3), np.uint8)
        run_a = engine.start([big], rrc, out_a, roi=False)
        run_b = engine.start(small, rrc, out_b)
        a, b = run_a.finish(), run_b.finish()
        assert not a.failures and not b.failures and b.wall_seconds > 0
        return a.wall_seconds + b.wall_seconds, a.decode_seconds, b.decode_seconds, b.wall_seconds

    with fastdata.Engine(2) as engine:
        was = _C._set_overlap_runs(False)
        try:
            wall, a, b, _ = a_then_b()
            assert wall >= a + 0.45 * b, (wall, a, b)
        finally:
            _C._set_overlap_runs(was)
        # A few tries: B must finish on one thread while A's row decodes on the other, which a
        # loaded machine can delay; without the overlap no try can pass.
        tries = []
        for _ in range(3):
            wall, a, b, b_wall = a_then_b()
            tries.append((wall, a, b, b_wall))
            if wall < a + 0.3 * b:
                assert b_wall > 0.5 * b, tries  # its share of A's window: ~a * b / (a + b)
                break
        else:
            pytest.fail(f"run B did not overlap run A: (wall, A's and B's decode seconds, B's wall) {tries}")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_start_run_in_a_forked_child_raises_instead_of_hanging():
    """A child has none of its parent's native threads: start_run refuses there (whether the
    queue thread was made yet or not, and for a pool of one thread too), rather than queue a run
    nothing would finish; a handle the parent started, dropped in the child, does not wait."""
    items = [encode_jpeg(photo_like(40, 48, index=i), quality=90) for i in range(3)]
    s = spec()
    engines = [_C.Engine(1), _C.Engine(3), _C.Engine(2)]
    out = np.empty((3, 8, 8, 3), np.uint8)
    engines[2].start_run(items, s, out, 0, 0, None, False, 0, 0).wait()  # its queue thread exists
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        said = []
        try:
            os.close(r)
            for engine in engines:
                try:
                    engine.start_run(items, s, np.empty_like(out), 0, 0, None, False, 0, 0)
                    said.append("no error")
                except RuntimeError as e:
                    said.append(str(e))
        finally:
            os.write(w, "\n".join(said).encode())
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 60
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("start_run in a forked child hung")
        time.sleep(0.02)
    with os.fdopen(r) as f:
        said = f.read().split("\n")
    assert len(said) == 3 and all("before a fork" in m and "do not exist" in m for m in said), said
    out2 = np.empty_like(out)
    engines[0].start_run(items, s, out2, 0, 0, None, False, 0, 0).wait()  # the parent's engines still work
    assert out2.tobytes() == out.tobytes()
