"""A decoder plugged into the Loader's pipeline: it gets exactly the rows it accepts, its rows
land in their places, and the skip/raise policy is the native path's, whatever decodes a row.

The fake decoder decodes its rows with its own native engine (same seed, epoch and index, so
the same pixels as the native decoder) and hands them back as a tensor, as a GPU decoder
does: any misplaced, lost or doubled row shows as a difference from Loader(backend="native").
"""
from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.cli.demo import photo_like_jpeg
from fastdata.decoders.base import DecodedRows, PlannedBatch

TRANSFORM = fastdata.RandomResizedCrop(32)
SEED = 3


class OddIndexDecoder:
    """Accepts JPEG rows whose dataset index is odd (from the planned batch's header facts).

    ``depth`` > 1 makes it asynchronous like DALI: ``start`` only queues, ``finish`` decodes.
    Rows it cannot decode (its engine reports a failure) and dataset indices in ``reject`` are
    rejected, as a GPU decoder rejects what it cannot take.
    """

    name = "odd-index"

    def __init__(self, depth: int = 1, reject: Tuple[int, ...] = (), strict: bool = False):
        self.depth = depth
        self.reject = set(reject)
        self.strict = strict
        self.engine = fastdata.Engine(1)
        self.got: List[Tuple[int, List[int]]] = []  # (epoch, dataset indices) per start
        self.pending: List[Any] = []
        self.finished = 0
        self.discarded = 0

    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        return np.array([row not in batch.not_jpeg and int(batch.indices[row]) % 2 == 1 for row in range(len(batch))],
                        dtype=bool)

    def start(self, batch: PlannedBatch, rows: List[int]) -> Any:
        self.got.append((batch.epoch, [int(batch.indices[r]) for r in rows]))
        handle = (batch, list(rows))
        self.pending.append(handle)
        return handle

    def finish(self, handle: Any, host: Any) -> DecodedRows:
        assert self.pending and self.pending[0] is handle, "finished out of start order"
        self.pending.pop(0)
        self.finished += 1
        batch, rows = handle
        h, w = TRANSFORM.output_size
        out = np.zeros((len(rows), h, w, 3), np.uint8)
        report = self.engine.run([batch.datas[r] for r in rows], TRANSFORM, out, seed=SEED, epoch=batch.epoch,
                                 indices=batch.indices[rows], strict=self.strict)
        bad = {rows[i] for i in report.failed_rows} | {r for r in rows if int(batch.indices[r]) in self.reject}
        keep = [i for i, r in enumerate(rows) if r not in bad]
        return DecodedRows(pixels=torch.from_numpy(out[keep]) if keep else None, rejected=sorted(bad))

    def discard(self, handle: Any) -> None:
        self.pending.remove(handle)
        self.discarded += 1

    def close(self) -> None:
        self.engine.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """2 classes x 13 photo-like JPEGs, a PNG, and in class b a garbage file and a truncated JPEG."""
    root = tmp_path_factory.mktemp("decoders")
    for c in "ab":
        (root / c).mkdir()
        for i in range(13):
            (root / c / f"{i:02d}.jpg").write_bytes(photo_like_jpeg(4, 100 * ord(c) + i, 60 + 3 * i, 48))
    buf = io.BytesIO()
    Image.open(io.BytesIO(photo_like_jpeg(4, 7, 50, 40))).save(buf, "PNG")
    (root / "a" / "05_png.png").write_bytes(buf.getvalue())
    (root / "b" / "03_garbage.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    good = (root / "b" / "04.jpg").read_bytes()
    (root / "b" / "06_truncated.jpg").write_bytes(good[: len(good) // 2])
    return root


def make(folder: Path, backend: Any, clean: bool = False, **kw) -> fastdata.Loader:
    """A loader over ``folder`` (``clean``: its good JPEGs only)."""
    cfg = dict(batch_size=5, transform=TRANSFORM, seed=SEED, threads=2, device="cpu", dtype=torch.uint8,
               drop_last=False, prefetch=2, backend=backend)
    cfg.update(kw)
    source = fastdata.ImageFolder(str(folder))
    if clean:
        good = [(path, label) for path, label in source.samples if "_" not in Path(path).name]
        source = fastdata.FileList([p for p, _ in good], [label for _, label in good])
    return fastdata.Loader(source, **cfg)


def epochs(loader: fastdata.Loader, which) -> List[List[Tuple[torch.Tensor, torch.Tensor]]]:
    out = []
    for e in which:
        loader.set_epoch(e)
        out.append([(x.clone(), y.clone()) for x, y in loader])
    return out


def skipping_epochs(loader: fastdata.Loader, which) -> Tuple[list, List[str]]:
    """``epochs`` with on_error="skip": the batches, and the replaced samples it warned about."""
    with pytest.warns(RuntimeWarning, match="replaced an undecodable sample") as record:
        out = epochs(loader, which)
    return out, sorted(str(w.message) for w in record)


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for eg, ew in zip(got, want):
        assert len(eg) == len(ew)
        for (a, la), (b, lb) in zip(eg, ew):
            assert torch.equal(la, lb)
            assert torch.equal(a, b)


def test_a_decoder_gets_exactly_the_rows_it_accepts_and_they_land_in_place(folder):
    source = fastdata.ImageFolder(str(folder))
    png = {i for i in range(len(source)) if source.name(i).endswith(".png")}
    garbage = {i for i in range(len(source)) if "garbage" in source.name(i)}
    fake = OddIndexDecoder()
    with make(folder, fake, on_error="skip", shuffle=False) as plugged, \
            make(folder, "native", on_error="skip", shuffle=False) as native:
        got, warned = skipping_epochs(plugged, [0, 1])
        want, warned_native = skipping_epochs(native, [0, 1])
        assert_same(got, want)
        assert warned == warned_native and any("garbage" in w for w in warned)
    order = plugged.order
    expected = [(e, [int(i) for i in b if i % 2 == 1 and int(i) not in png | garbage])
                for e in (0, 1, 2) for b in order.batches(e)]
    expected = [g for g in expected if g[1]]
    done = [g for g in fake.got if g[0] < 2]
    assert done == expected[:len(done)] and len(done) == sum(1 for g in expected if g[0] < 2)
    ahead = fake.got[len(done):]  # epoch 2, started before the loader closed (the lookahead)
    assert ahead == expected[len(done):len(done) + len(ahead)]
    assert fake.finished + fake.discarded == len(fake.got) and not fake.pending


def test_native_priority_follows_the_decoder_and_the_device(monkeypatch):
    from fastdata.loader import pipeline

    monkeypatch.setattr(pipeline, "GPU_NATIVE_IDLE", True)
    # beside a GPU decoder feeding CUDA: SCHED_IDLE; anywhere else the creator's priority
    assert [pipeline.native_priority(g, c) for g, c in ((True, True), (False, True), (True, False), (False, False))] \
        == [(0, True), (0, False), (0, False), (0, False)]
    monkeypatch.setattr(pipeline, "GPU_NATIVE_IDLE", False)
    assert pipeline.native_priority(True, True) == (pipeline.GPU_NATIVE_NICE, False)
    # native alone keeps the creator's priority on CUDA too (SCHED_IDLE there trained slower)
    assert pipeline.native_priority(False, True) == (0, False)


def test_engines_of_a_cpu_pipeline_with_a_plugged_decoder(folder):
    """The native threads keep their priority off CUDA (it is lowered only beside a GPU
    decoder's feeding threads), and the inline engine never has more threads than the native one."""
    with make(folder, OddIndexDecoder(), clean=True) as plugged, make(folder, "native", clean=True) as native:
        pipe = plugged._pipeline
        assert pipe.engine.nice == 0 and not pipe.engine.idle and pipe.engine.threads == 2
        assert pipe.inline_engine.threads == 2  # min(INLINE_THREADS_GPU, threads)
        assert native._pipeline.inline_engine.threads == 1  # the native decoder alone: replacements only
        next(iter(plugged))
        assert pipe.engine.priority_lowered


@pytest.mark.parametrize("strict", [False, True])
def test_rejected_rows_go_native_and_the_skip_policy_is_the_native_one(folder, strict):
    source = fastdata.ImageFolder(str(folder))
    odd = [i for i in range(len(source)) if i % 2 == 1]
    fake = OddIndexDecoder(reject=tuple(odd[::3]), strict=strict)
    with make(folder, fake, on_error="skip", strict=strict) as plugged, \
            make(folder, "native", on_error="skip", strict=strict) as native:
        got, warned = skipping_epochs(plugged, [2, 3])
        want, warned_native = skipping_epochs(native, [2, 3])
        assert_same(got, want)
        assert warned == warned_native and len(warned) == (2 if strict else 1)  # garbage (+ truncated)
    assert sum(len(rows) for _, rows in fake.got) > 0


def test_raise_policy_names_the_same_sample_with_a_plugged_decoder(folder):
    errors = []
    for backend in (OddIndexDecoder(), "native"):
        with make(folder, backend, shuffle=False, strict=True) as loader:
            with pytest.raises(fastdata.DecodeError) as info:
                for _ in loader:
                    pass
            errors.append((info.value.index, info.value.name))
    assert errors[0] == errors[1] and "garbage" in errors[0][1]


class FailingOddDecoder(OddIndexDecoder):
    """OddIndexDecoder that keeps the rows its engine cannot decode and reports them as failed
    (DecodedRows.failures, naming the sample as the native decoder does) instead of rejecting
    them, with bright pixels in their place: a failed row the pipeline delivered as it came
    would show. Dataset indices in ``fail`` fail too (decoded, then reported failed); those in
    ``reject`` are rejected; ``fail_rejected``: a rejected row is reported failed as well (a
    broken decoder)."""

    def __init__(self, strict: bool = False, fail: Tuple[int, ...] = (), reject: Tuple[int, ...] = (),
                 fail_rejected: bool = False):
        super().__init__(reject=reject, strict=strict)
        self.fail = set(fail)
        self.fail_rejected = fail_rejected

    def accepts(self, batch: PlannedBatch) -> np.ndarray:  # also the garbage and truncated files
        return np.array([int(batch.indices[row]) % 2 == 1 or "_" in Path(batch.names[row]).name
                         for row in range(len(batch))], dtype=bool)

    def finish(self, handle: Any, host: Any) -> DecodedRows:
        self.pending.remove(handle)
        self.finished += 1
        batch, rows = handle
        h, w = TRANSFORM.output_size
        out = np.zeros((len(rows), h, w, 3), np.uint8)
        report = self.engine.run([batch.datas[r] if len(batch.datas[r]) else batch.items[r] for r in rows], TRANSFORM,
                                 out, seed=SEED, epoch=batch.epoch, indices=batch.indices[rows], strict=self.strict,
                                 names=[batch.names[r] for r in rows])
        failures = [(rows[i], err) for i, err in zip(report.failed_rows, report.failures)]
        failures += [(row, fastdata.DecodeError("failed on purpose", int(batch.indices[row]), batch.names[row]))
                     for row in rows if int(batch.indices[row]) in self.fail]
        rejected = [i for i, row in enumerate(rows) if int(batch.indices[row]) in self.reject]
        if not self.fail_rejected:
            failures = [(row, err) for row, err in failures if rows.index(row) not in rejected]
        out[[rows.index(row) for row, _ in failures]] = 200
        keep = [i for i in range(len(rows)) if i not in rejected]
        return DecodedRows(pixels=torch.from_numpy(out[keep]), failures=failures,
                           rejected=[rows[i] for i in rejected])


def test_rows_a_plugged_decoder_fails_are_replaced_or_raised_as_native_ones_are(folder):
    # The skip policy decodes a replacement into a failed row's place, which was a host row
    # only when the native decoder had failed it: a plugged decoder's failure raised
    # ValueError (not in list) on the producer thread before 2026-12-05. Strict: the truncated
    # JPEG (its header is whole, so the plugged decoder gets it) fails; the garbage file's
    # header does not parse, so only the native decoder sees it.
    source = fastdata.ImageFolder(str(folder))
    truncated = [i for i in range(len(source)) if "truncated" in source.name(i)]
    fake = FailingOddDecoder(strict=True)
    with make(folder, fake, on_error="skip", strict=True) as plugged, \
            make(folder, "native", on_error="skip", strict=True) as native:
        got, warned = skipping_epochs(plugged, [0, 1])
        want, warned_native = skipping_epochs(native, [0, 1])
        assert_same(got, want)
        assert warned == warned_native and len(warned) == 2 and any("truncated" in w for w in warned)
        assert plugged.stats().failures == native.stats().failures == 4  # two files, two epochs
    assert sum(i in rows for _, rows in fake.got[:2 * len(plugged)] for i in truncated) == 2  # the decoder failed it
    # raise: without the garbage file the first failure is the plugged decoder's
    kept = [(p, label) for p, label in source.samples if "garbage" not in p]
    errors = []
    for backend in (FailingOddDecoder(strict=True), "native"):
        files = fastdata.FileList([p for p, _ in kept], [label for _, label in kept])
        with fastdata.Loader(files, batch_size=5, transform=TRANSFORM, seed=SEED, threads=2, device="cpu",
                             dtype=torch.uint8, shuffle=False, strict=True, backend=backend) as loader:
            with pytest.raises(fastdata.DecodeError) as info:
                for _ in loader:
                    pass
            errors.append((type(info.value), info.value.index, info.value.name))
    assert errors[0] == errors[1] and "truncated" in errors[0][2]


def test_a_failed_row_is_black_beside_a_rejected_one_in_a_used_slot(folder):
    # One batch where the decoder rejects a row (decoded natively into the slot) and fails
    # another (a black host row after it), in a pipeline whose slot holds an earlier batch's
    # pixels: the failed row is black, the rejected one the native decode, nothing moved.
    from fastdata.loader.pipeline import make_backend

    paths = sorted(str(p) for p in folder.glob("*/*.jpg") if "_" not in p.name)[:10]
    odd = [i for i in range(10) if i % 2 == 1]
    fake = FailingOddDecoder(fail=(odd[1],), reject=(odd[3],))
    cfg = dict(device="cpu", dtype=None, seed=SEED, threads=2)
    with make_backend(fake, TRANSFORM, **cfg) as plugged, make_backend("native", TRANSFORM, **cfg) as native:
        for _ in range(len(plugged.ring)):  # even indices only: every slot row 0..9 holds native pixels now
            plugged.run(paths[::-1], np.arange(10, 30, 2), 0)
        got, failures, failed = plugged.run(paths, np.arange(10), 1)
        want, _, _ = native.run(paths, np.arange(10), 1)
        assert failed == [odd[1]] and failures[0].reason == "failed on purpose" and "jpg" in failures[0].name
        assert (got[odd[1]] == 0).all() and want[odd[1]].any()
        keep = [r for r in range(10) if r != odd[1]]
        assert torch.equal(got[keep], want[keep])
        assert plugged.stats["gpu_rejected"] == 1 and plugged.stats["gpu_rows"] == len(odd) - 1  # all but the rejected one
    broken = FailingOddDecoder(fail=(odd[1],), reject=(odd[1],), fail_rejected=True)
    with make_backend(broken, TRANSFORM, **cfg) as plugged:
        with pytest.raises(RuntimeError, match="reported failures for rows it did not keep"):
            plugged.run(paths, np.arange(10), 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_cpu_outputs_skip_and_fall_back_as_float32_does(folder, dtype):
    # The native threads write 16-bit rows on the CPU; the Pillow fallback (the PNG) and the
    # skip policy's replacements (garbage, truncated under strict) write into the same slots:
    # every batch is the float32 one cast by torch, bit for bit.
    with make(folder, "native", on_error="skip", strict=True, dtype=torch.float32) as full, \
            make(folder, "native", on_error="skip", strict=True, dtype=dtype) as half:
        want, warned = skipping_epochs(full, [0])
        got, warned_half = skipping_epochs(half, [0])
        assert half._pipeline.ring.image_dtype == dtype and half.stats().fallbacks == 1
    assert warned == warned_half and len(warned) == 2
    assert len(got[0]) == len(want[0])
    for (x, y), (xf, yf) in zip(got[0], want[0]):
        assert torch.equal(x.view(torch.int16), xf.to(dtype).view(torch.int16)) and torch.equal(y, yf)


def test_an_asynchronous_decoder_in_flight_across_epochs_and_early_exits(folder):
    fake = OddIndexDecoder(depth=3)
    with make(folder, fake, clean=True) as plugged, make(folder, "native", clean=True) as native:
        for e in range(3):  # leave epochs early: started batches are discarded, in order
            plugged.set_epoch(e)
            for k, _ in enumerate(plugged):
                if k == 1:
                    break
        got = [[(x.clone(), y.clone()) for x, y in plugged] for _ in range(2)]  # epochs 3 and 4, implied
        want = epochs(native, [3, 4])
        assert_same(got, want)
    assert fake.discarded > 0 and not fake.pending
    assert fake.finished + fake.discarded == len(fake.got)


class TimedOddDecoder(OddIndexDecoder):
    """OddIndexDecoder that reports ``row_seconds`` per row as its own time, as a GPU decoder
    reports its rate to the hybrid split."""

    def __init__(self, row_seconds: float):
        super().__init__()
        self.row_seconds = row_seconds

    def finish(self, handle: Any, host: Any) -> DecodedRows:
        done = super().finish(handle, host)
        done.seconds = self.row_seconds * len(handle[1])
        return done


# The row time TimedOddDecoder reports in the split tests: 10 million rows/s, far above the
# native threads. At 100,000 rows/s the lead was thin: the native threads decode these 24x20
# images at ~64,000 rows/s (median of 40 runs on the 2-core box, up to 86,000), and one CI run
# read them fast enough to give the decoder 7 of its 8 rows.
FAST_ROW_SECONDS = 1e-7


def _paced_loader(tmp_path, fake) -> fastdata.Loader:
    for i in range(192):
        (tmp_path / f"{i:03d}.jpg").write_bytes(photo_like_jpeg(4, i, 24, 20))
    paths = sorted(str(p) for p in tmp_path.iterdir())
    return fastdata.Loader(fastdata.FileList(paths, [0] * len(paths)), batch_size=16, transform=TRANSFORM, seed=SEED,
                           threads=2, device="cpu", dtype=torch.uint8, prefetch=2, shuffle=False, backend=fake)


@pytest.mark.parametrize("consumer_seconds", [0.0, 0.2])
def test_the_split_leaves_the_gpu_side_the_least_while_the_consumer_is_slower(tmp_path, consumer_seconds):
    # The hybrid balancer (attached to a plugged decoder's pipeline, as backend="hybrid" does).
    # The decoder reports 10 million rows/s, far more than the native threads: a consumer that
    # takes batches as fast as they come gets the split by the two rates, so the decoder takes
    # every row it accepts (the odd indices); a consumer slower than the loader gets the loader
    # ahead, and then the native threads take all but the decoder's probe row, since they alone
    # keep the loader ahead and the GPU's time is the training step's.
    from fastdata.loader.balance import SplitBalancer

    fake = TimedOddDecoder(row_seconds=FAST_ROW_SECONDS)
    ahead = []
    with _paced_loader(tmp_path, fake) as loader:
        loader._pipeline.balancer = balancer = SplitBalancer()
        for _ in loader:
            ahead.append(balancer.ahead)  # read here: the epoch's last batches precede the next's lookahead
            time.sleep(consumer_seconds)
    # rows the decoder got per batch of epoch 0, of its 8 odd ones (then the next epoch's lookahead)
    given = [len(rows) for epoch, rows in fake.got if epoch == 0]
    assert len(given) == 12 and balancer.gpu_rate and balancer.native_rate
    if consumer_seconds:
        assert any(ahead) and given[-4:] == [1, 1, 1, 1], (given, ahead)
    else:  # a main thread descheduled for a moment can make one hand-over wait: most, not all
        assert ahead[-4:].count(False) >= 3 and given[-6:].count(8) >= 4, (given, ahead)


def test_a_new_iteration_starts_balanced_whatever_the_last_one_measured(tmp_path):
    # A slow consumer leaves the loader ahead (the GPU side at its probe); the iteration is
    # left, and a new one read as fast as it comes starts from the balanced split, not from
    # the old pace.
    from fastdata.loader.balance import SplitBalancer

    fake = TimedOddDecoder(row_seconds=FAST_ROW_SECONDS)
    with _paced_loader(tmp_path, fake) as loader:
        loader._pipeline.balancer = SplitBalancer()
        for k, _ in enumerate(loader):
            time.sleep(0.2)
            if k == 5:
                break
        slow = len(fake.got)
        loader.set_epoch(1)
        for _ in loader:
            pass
    given = [len(rows) for epoch, rows in fake.got[slow:] if epoch == 1]
    assert [len(rows) for _, rows in fake.got[3:slow]].count(1) >= 2  # the slow stretch left the GPU its probe
    assert given[:3] == [8, 8, 8], given


class GatedDecoder(OddIndexDecoder):
    """Every ``finish`` after the first says so (``entered``) and waits for ``release``: a
    producer waiting on another thread, as it waits for a GPU decoder's worker."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.closed = False

    def finish(self, handle: Any, host: Any) -> DecodedRows:
        self.calls += 1
        if self.calls > 1:
            self.entered.set()
            if not self.release.wait(60):
                raise RuntimeError("never released")
        return super().finish(handle, host)

    def close(self) -> None:
        self.closed = True
        super().close()


def _free_on_another_thread(held: list, decoder: GatedDecoder, release: bool = True) -> bool:
    """Drop the last references (``held``) on a thread other than the one that made them, then
    (``release``) release the decoder, as a decoder's own thread would after a garbage
    collection there. True when that thread got stuck (it waited for the producer, which
    waited for it)."""
    assert decoder.entered.wait(30)  # the producer waits in finish() now

    def free_then_release():
        held.clear()  # the last references: __del__ runs on this thread
        if release:
            decoder.release.set()

    worker = threading.Thread(target=free_then_release, name="not-the-consumer")
    worker.start()
    worker.join(10)
    stuck = worker.is_alive()
    if stuck:
        decoder.release.set()  # let a stuck worker end, so that a failure does not hang the suite
        worker.join(60)
    return stuck


def test_an_iterator_freed_on_another_thread_does_not_wait_for_the_producer(folder):
    # The garbage collector may free an iterator on any thread, also on one the producer is
    # waiting for (a GPU decoder's resample worker did, after a DecodeError ended the loop, and
    # the process hung at exit). Off the consumer's thread it only tells the feed to stop.
    decoder = GatedDecoder()
    loader = make(folder, decoder, clean=True)
    try:
        it = iter(loader)
        next(it)  # batch 0; the producer goes on into batch 1 and waits in finish()
        feed = loader._feed
        held = [it]
        del it
        assert not _free_on_another_thread(held, decoder), "the iterator's __del__ waited for the producer"
        assert feed.stop.is_set()  # told to stop, not left producing the epoch
    finally:
        loader.close()  # waits for the producer (the consumer's thread may)
    assert decoder.closed


def test_a_loader_freed_on_another_thread_is_closed_by_its_producer(folder):
    # The same for the loader itself (a local of a frame in the error's traceback): off the
    # thread that made it, __del__ stops the feed and the producer thread closes the pipeline.
    decoder = GatedDecoder()
    loader = make(folder, decoder, clean=True)
    it = iter(loader)
    next(it)
    producer = loader._thread._thread
    held = [loader, it]
    del loader, it
    assert not _free_on_another_thread(held, decoder), "the loader's __del__ waited for the producer"
    producer.join(30)
    assert not producer.is_alive() and decoder.closed  # it left the feed, closed the pipeline, ended
    from fastdata.loader import loader as loader_module
    assert not loader_module._closing_producers  # the exit hook has nothing left to wait for


def test_a_loader_never_iterated_and_freed_on_another_thread_is_closed_there(folder):
    # Nothing of it ran, so nothing is waited for: closed at once, and no producer thread is
    # started from a finalizer.
    decoder = GatedDecoder()
    held = [make(folder, decoder, clean=True)]
    producer = held[0]._thread._thread
    worker = threading.Thread(target=held.clear, name="not-the-creator")
    worker.start()
    worker.join(30)
    assert not worker.is_alive() and decoder.closed and producer.ident is None  # never started


def test_a_deferred_close_ends_only_its_own_shard_stream(tmp_path):
    # A loader over TarShards freed off its thread is closed later by its producer; by then a
    # newer loader on the same source reads its own epoch stream, which that close must not end.
    from shardserver import write_shards
    folder = tmp_path / "shards"
    write_shards(folder, [40] * 4)
    source = fastdata.TarShards(str(folder) + "/train-{000000..000003}.tar", shuffle_buffer=8)
    cfg = dict(transform=TRANSFORM, device="cpu", dtype=torch.uint8, batch_size=5, threads=1, prefetch=2, seed=3)
    decoder = GatedDecoder()
    old = fastdata.Loader(source, backend=decoder, **cfg)
    it = iter(old)
    next(it)
    producer = old._thread._thread
    held = [old, it]
    del old, it
    assert not _free_on_another_thread(held, decoder, release=False)
    new = fastdata.Loader(source, backend="native", **cfg)
    try:
        it = iter(new)
        batches = [next(it)]
        stream = source.stream
        decoder.release.set()  # the old producer leaves its batch and runs the close
        producer.join(30)
        assert not producer.is_alive() and decoder.closed
        assert source.stream is stream and stream is not None  # the newer loader's stream goes on
        batches += list(it)
        assert sum(len(labels) for _, labels in batches) == 160
    finally:
        new.close()


class FailingFetchList(fastdata.FileList):
    """A FileList whose lookup of the batch starting at ``bad`` raises (an unreachable store);
    it records the first index of every lookup."""

    def __init__(self, paths, labels, bad: int):
        super().__init__(paths, labels)
        self.bad = bad
        self.fetched: List[int] = []

    def fetch(self, indices):
        self.fetched.append(int(indices[0]))
        if int(indices[0]) == self.bad:
            raise OSError(f"store unreachable at {self.bad}")
        return super().fetch(indices)


@pytest.mark.parametrize("backend", ["native", "plugged"])
def test_a_failed_lookup_is_raised_after_the_batches_before_it_and_nothing_after_it_is_fetched(folder, backend):
    # With a plugged decoder (the pipeline plans) or without, a batch whose lookup fails ends
    # the epoch in its place: the batches before it are delivered, no later batch is looked up.
    good = sorted(str(p) for p in folder.rglob("*.jpg") if "_" not in p.name)
    source = FailingFetchList(good, [0] * len(good), bad=10)
    with fastdata.Loader(source, batch_size=5, transform=TRANSFORM, seed=SEED, threads=2, device="cpu",
                         dtype=torch.uint8, prefetch=2, shuffle=False,
                         backend=OddIndexDecoder() if backend == "plugged" else "native") as loader:
        delivered = []
        with pytest.raises(OSError, match="store unreachable at 10"):
            for x, _ in loader:
                delivered.append(len(x))
    assert delivered == [5, 5]
    assert source.fetched == [0, 5, 10]


def test_the_inline_engine_threads_are_named_apart_from_the_native_ones(folder):
    # With a decoder before the native one, the inline engine reads and plans every batch:
    # its threads carry their own name, so per-thread CPU does not count planning as decoding.
    from fastdata.io.host import thread_cpu_seconds
    from fastdata.loader.pipeline import INLINE_THREAD_NAME

    with make(folder, OddIndexDecoder(), clean=True, threads=3) as loader:
        for _ in loader:
            names = set(thread_cpu_seconds())  # while the loader's threads live
            break
    assert INLINE_THREAD_NAME in names and "fastdata-native" in names, names
