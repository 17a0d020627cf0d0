"""The Loader's CUDA handoff: no host sync in next(), stream-safe outputs, fixed host memory.

Complements test_loader_cuda_basic.py (pixel equality with the CPU path, dtypes, overlap).
The oracle everywhere is the CPU path of the same loader configuration (same seed, so the
same samples, crops and flips). ``torch.cuda._sleep`` makes a stream busy for a known time
without touching memory, which turns stream-ordering bugs into visible wrong pixels or
into measurable host stalls.
"""
from __future__ import annotations

import time
from typing import List, Tuple

import pytest
import torch

import fastdata
from fastdata.cli.demo import photo_like_jpeg

pytestmark = pytest.mark.gpu

N, B, SIZE = 64, 8, 64


@pytest.fixture(scope="module")
def source() -> "fastdata.BytesSource":
    data = [photo_like_jpeg(5, i, 120 + 9 * i, 96 + 5 * i) for i in range(N)]
    return fastdata.BytesSource(data, [i % 5 for i in range(N)])


def make(source, **kw) -> "fastdata.Loader":
    args = dict(batch_size=B, transform=fastdata.RandomResizedCrop(SIZE), seed=11, threads=2, device="cuda",
                dtype=torch.uint8, drop_last=False, backend="native")  # the native CUDA path
    args.update(kw)
    return fastdata.Loader(source, **args)


def cpu_reference(source, epoch: int = 0, **kw) -> List[Tuple["torch.Tensor", "torch.Tensor"]]:
    with make(source, device="cpu", **kw) as loader:
        loader.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y in loader]


def sleep_cycles_per_second() -> float:
    """Calibrate torch.cuda._sleep (it spins for a number of GPU clock cycles)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(50_000_000)
    torch.cuda.synchronize()
    return 50_000_000 / (time.perf_counter() - t0)


def test_next_does_not_wait_for_the_callers_stream(source) -> None:
    """next() only makes the current stream wait on an event: with that stream busy for
    ~0.5 s, a prefetched batch must come back at once (a host sync would take the 0.5 s)."""
    ref = cpu_reference(source)
    rate = sleep_cycles_per_second()
    with make(source) as loader:
        it = iter(loader)
        got = [next(it)]
        time.sleep(0.5)  # let the producer fill the queue
        torch.cuda._sleep(int(0.5 * rate))
        t0 = time.perf_counter()
        got.append(next(it))
        returned_after = time.perf_counter() - t0
        got += list(it)
        torch.cuda.synchronize()
    assert returned_after < 0.1, f"next() blocked {returned_after:.3f} s behind the caller's stream"
    assert len(got) == len(ref)
    for (x, y), (xr, yr) in zip(got, ref):
        assert torch.equal(x.cpu(), xr) and torch.equal(y.cpu(), yr)


def test_outputs_are_safe_on_a_slow_side_stream(source) -> None:
    """Batches used on the caller's own (non-default) stream, dropped right after enqueueing
    work that runs later: record_stream must keep their memory from the next batches'
    copies, and a ring slot must not be rewritten before its copy finished (prefetch=1
    puts every slot under maximum pressure)."""
    ref = cpu_reference(source, epoch=2)
    rate = sleep_cycles_per_second()
    user = torch.cuda.Stream()
    clones = []
    with make(source, prefetch=1) as loader, torch.cuda.stream(user):
        loader.set_epoch(2)
        for x, y in loader:
            torch.cuda._sleep(int(0.02 * rate))  # the step is slower than the input pipeline
            clones.append((x.clone(), y.clone()))  # runs after the sleep, on `user`
            del x, y
    user.synchronize()
    assert len(clones) == len(ref)
    for (x, y), (xr, yr) in zip(clones, ref):
        assert torch.equal(x.cpu(), xr) and torch.equal(y.cpu(), yr)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_resume_on_cuda_matches_the_uninterrupted_run(source, dtype) -> None:
    with make(source, dtype=dtype) as loader:
        loader.set_epoch(3)
        full = [(x.clone(), y.clone()) for x, y in loader]
    k = 3
    with make(source, dtype=dtype) as loader:
        loader.set_epoch(3)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
    with make(source, dtype=dtype) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(3)
        rest = [(x.clone(), y.clone()) for x, y in loader]
    assert len(rest) == len(full) - k
    for (x, y), (xr, yr) in zip(rest, full[k:]):
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x, xr) and torch.equal(y, yr)


def test_host_ring_and_gpu_memory_stay_flat(source) -> None:
    with make(source, dtype=torch.float16, prefetch=3) as loader:
        used = []
        for epoch in range(6):
            loader.set_epoch(epoch)
            for x, _ in loader:
                x.float().sum()  # a "step"
            torch.cuda.synchronize()
            used.append(torch.cuda.memory_allocated())
        # prefetch slots, plus one for the native rows queued a batch ahead (NativeDecoder.depth 2)
        slots = 3 + loader._pipeline.depth - 1
        assert loader._pipeline.depth == 2
        assert loader._ring.allocations == len(loader._ring) == slots, "no host allocation per batch"
    # Leaking one batch per epoch would add 4 batches between epochs 1 and 5; allow < 1.
    batch_bytes = B * 3 * SIZE * SIZE * 2
    assert used[5] - used[1] < batch_bytes, used


def test_pinned_cpu_outputs_survive_async_copies(source) -> None:
    """device='cpu' outputs are pinned; x.cuda(non_blocking=True) and dropping x at once is
    the common pattern, and the batch memory must not be rewritten under the DMA."""
    ref = cpu_reference(source, epoch=1)
    rate = sleep_cycles_per_second()
    gpu = []
    with make(source, device="cpu", prefetch=1) as loader:
        loader.set_epoch(1)
        for x, y in loader:
            assert x.is_pinned() and y.is_pinned()
            torch.cuda._sleep(int(0.02 * rate))  # the copy below starts only after this
            gpu.append((x.cuda(non_blocking=True), y.cuda(non_blocking=True)))
            del x, y
    torch.cuda.synchronize()
    for (x, y), (xr, yr) in zip(gpu, ref):
        assert torch.equal(x.cpu(), xr) and torch.equal(y.cpu(), yr)


def test_skip_on_cuda_matches_the_cpu_path(source) -> None:
    bad = fastdata.BytesSource(list(source.buffers[:20]) + [b"<html>nope</html>"] + list(source.buffers[21:]),
                               source.labels)
    with pytest.warns(RuntimeWarning, match="bytes #20"):
        ref = cpu_reference(bad, on_error="skip", shuffle=False)
    with pytest.warns(RuntimeWarning, match="bytes #20"):
        with make(bad, on_error="skip", shuffle=False) as loader:
            got = [(x.cpu(), y.cpu()) for x, y in loader]
            assert loader.stats().failures == 1
    for (x, y), (xr, yr) in zip(got, ref):
        assert torch.equal(x, xr) and torch.equal(y, yr)
    with pytest.raises(fastdata.DecodeError, match="bytes #20"):
        with make(bad, shuffle=False) as loader:
            list(loader)
