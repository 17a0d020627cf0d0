"""The hardware JPEG engines' calls as the gpu decoder makes them (``_C.NvImageCodecBatch`` on
nvImageCodec's HW_GPU_ONLY backend, RGB out; no Loader), with the files' bytes as read (pageable
host memory) or copied into pinned host memory first, alone and beside a training-like GPU load:
ResNet-18 forward + backward, bf16, channels_last, batch 256, one CUDA graph replayed by a
thread, at most two replays in flight.

The question: beside such a load the calls from pageable bytes ran ~20x slower than alone, their
thread's CPU busy the whole call (one H100, thirty-ninth session: 583 img/s on one lane against
13,659, 1,233 us of CPU an image; in the Loader beside training CUDA's blocking sync did not
change that CPU). nvJPEG uploads the bytes inside the call (the profile's `Memcpy HtoD (Pageable
-> Device)`), a copy the driver may hold until its stream's earlier work is done: is that the
wait? No (one H100, fortieth session). From pinned bytes (`Memcpy HtoD (Pinned -> Device)`) the
calls ran no faster beside the load, somewhat slower, busy the whole call: one lane 361 and 347
img/s against pageable's 407 and 382, four lanes 1,088 and 1,071 against 1,151 and 1,110 (about
19,000 and 20,800 alone either way). Whatever the calls wait for inside nvJPEG, it is not that
copy. Each lane is one thread with one decoder object and one stream, decoding one batch at a time
and waiting for it asleep (a blocking event), so the CPU figures are the calls' own: per image,
and the part in the kernel. A profile of each kind alone lists the GPU work the calls launch.

    python benchmarks/bench_engines_beside_load.py /tmp/set8192 --lanes 1,4 --seconds 5
"""
from __future__ import annotations

import argparse
import glob
import os
import threading
import time
from collections import defaultdict
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

import fastdata
from fastdata import _C
from fastdata.decoders.nvimgcodec import BACKEND_KINDS, IMAGE_ALIGN, nvimgcodec_library
from fastdata.io.host import calling_thread_cpu


def pinned_copies(datas: List[bytes]) -> Tuple[torch.Tensor, List[np.ndarray]]:
    """``datas`` copied one after another into one pinned host buffer, and a view of each."""
    ends = np.cumsum([len(d) for d in datas])
    buffer = torch.empty(int(ends[-1]), dtype=torch.uint8, pin_memory=True)
    host = buffer.numpy()
    np.concatenate([np.frombuffer(d, np.uint8) for d in datas], out=host)
    return buffer, np.split(host, ends[:-1])


class Lane:
    """One decoder object, its stream and its output buffers, decoding fixed batches in turn."""

    def __init__(self, instance, datas: List[bytes], sizes: np.ndarray, batch: int):
        self.decoder = _C.NvImageCodecBatch(instance, torch.cuda.current_device(), 1,
                                            [BACKEND_KINDS["HW_GPU_ONLY"]], "")
        self.stream = torch.cuda.Stream()
        self.batch = batch
        self.batches = []
        self._pinned = []  # the pinned buffers the batches' pinned views point into
        for k in range(len(datas) // batch):
            rows = slice(k * batch, (k + 1) * batch)
            h, w = sizes[rows, 0], sizes[rows, 1]
            slot = (h * w * 3 + IMAGE_ALIGN - 1) // IMAGE_ALIGN * IMAGE_ALIGN
            offsets = np.concatenate([[0], np.cumsum(slot)[:-1]]).astype(np.int64)
            out = torch.empty(int(slot.sum()), dtype=torch.uint8, device="cuda")
            pageable = list(datas[rows])
            buffer, pinned = pinned_copies(pageable)
            self._pinned.append(buffer)
            self.batches.append(({False: pageable, True: pinned}, out, offsets, h.copy(), w.copy()))

    def run(self, pinned: bool, stop: threading.Event, result: Dict[str, float]) -> None:
        n = calls_wall = calls_cpu = calls_sys = 0.0
        done = torch.cuda.Event(blocking=True)
        t0 = time.perf_counter()
        while not stop.is_set():
            datas, out, offsets, h, w = self.batches[int(n) % len(self.batches)]
            c0, s0 = calling_thread_cpu()
            w0 = time.perf_counter()
            status = self.decoder.decode(datas[pinned], out.data_ptr(), out.numel(), offsets, h, w,
                                         self.stream.cuda_stream)
            calls_wall += time.perf_counter() - w0
            c1, s1 = calling_thread_cpu()
            calls_cpu += c1 - c0
            calls_sys += s1 - s0
            done.record(self.stream)
            done.synchronize()
            if (np.asarray(status) != 0).any():  # recorded, not raised: the other rows of the table still run
                result["error"] = (f"rows not decoded ({kind(pinned)}): "
                                   f"statuses {sorted(set(np.asarray(status).tolist()))}")
                break
            n += 1
        result.update(images=n * self.batch, seconds=time.perf_counter() - t0, calls_wall=calls_wall,
                      calls_cpu=calls_cpu, calls_sys=calls_sys)


class GraphLoad:
    """ResNet-18 forward + backward as one CUDA graph, replayed on its own stream by a thread."""

    def __init__(self):
        import torchvision

        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet18().cuda().to(memory_format=torch.channels_last)
        x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (256,), device="cuda")

        def step() -> None:
            with torch.autocast("cuda", torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()

        self.stream = torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):  # warm-up before capture, as torch.cuda.graph asks
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(self.stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            step()
        torch.cuda.synchronize()
        self.steps = 0
        self._stop = threading.Event()
        self._thread = None

    def _run(self) -> None:
        in_flight = []
        with torch.cuda.stream(self.stream):
            while not self._stop.is_set():
                self.graph.replay()
                done = torch.cuda.Event(blocking=True)
                done.record()
                in_flight.append(done)
                if len(in_flight) > 2:
                    in_flight.pop(0).synchronize()
                self.steps += 1
        torch.cuda.synchronize()

    def start(self) -> None:
        self._stop.clear()
        self.steps = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def kind(pinned: bool) -> str:
    return "pinned" if pinned else "pageable"


def measure(lanes: List[Lane], pinned: bool, seconds: float) -> Dict[str, float]:
    stop = threading.Event()
    results = [dict() for _ in lanes]
    threads = [threading.Thread(target=lane.run, args=(pinned, stop, r)) for lane, r in zip(lanes, results)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(errors[0])
    total = {k: sum(r[k] for r in results) for k in results[0]}
    total["seconds"] = max(r["seconds"] for r in results)
    return total


def kernels_launched(lane: Lane, pinned: bool, batches: int = 4) -> Dict[str, List[float]]:
    """GPU work (kernels and copies, by name: count, total µs) of ``batches`` calls alone."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for k in range(batches):
            datas, out, offsets, h, w = lane.batches[k % len(lane.batches)]
            status = lane.decoder.decode(datas[pinned], out.data_ptr(), out.numel(), offsets, h, w,
                                         lane.stream.cuda_stream)
            if (np.asarray(status) != 0).any():
                raise RuntimeError(f"rows not decoded: statuses {sorted(set(np.asarray(status).tolist()))}")
        torch.cuda.synchronize()
    work: Dict[str, List[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            name = e.name if len(e.name) < 70 else e.name[:67] + "..."
            work[name][0] += 1
            work[name][1] += e.time_range.elapsed_us()
    return work


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="a folder of baseline 4:2:0 JPEGs (bench_gpu_decode.py's 8,192 set)")
    p.add_argument("--batch", type=int, default=64, help="rows per call (hybrid's GPU side made ~64-row calls)")
    p.add_argument("--batches", type=int, default=8, help="distinct batches per lane, cycled through")
    p.add_argument("--lanes", default="1,4", help="threads calling at once, each its own decoder and stream")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (pageable, pinned)")
    p.add_argument("--hold", choices=("pageable", "pinned"),
                   help="only run one lane with these bytes beside the load for --seconds, after printing "
                        "'holding' (for a native stack sampler such as py-spy to attach)")
    args = p.parse_args()
    lane_counts = [int(x) for x in args.lanes.split(",")]
    need = args.batch * args.batches * max(lane_counts)
    files = sorted(glob.glob(os.path.join(args.data, "**", "*.jpg"), recursive=True))[:need]
    if len(files) < need:
        raise SystemExit(f"{args.data}: {len(files)} JPEGs, fewer than {need}")
    datas = np.empty(len(files), dtype=object)
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            datas[i] = fh.read()
    probes = [fastdata.probe(d) for d in datas]
    sizes = np.array([(s.height, s.width) for s in probes], np.int64)
    instance = _C.NvImageCodecInstance(nvimgcodec_library())
    per = args.batch * args.batches
    lanes = [Lane(instance, datas[k * per:(k + 1) * per], sizes[k * per:(k + 1) * per], args.batch)
             for k in range(max(lane_counts))]
    if args.hold:
        load = GraphLoad()
        load.start()
        measure(lanes[:1], args.hold == "pinned", 1.0)
        print(f"holding: pid {os.getpid()}, one lane of {args.hold} bytes beside the load", flush=True)
        res = measure(lanes[:1], args.hold == "pinned", args.seconds)
        load.stop()
        print(f"held: {res['images'] / res['seconds']:,.0f} img/s, calls' CPU "
              f"{1e6 * res['calls_cpu'] / max(res['images'], 1):.0f} us/img")
        return
    kinds = [False, True]
    for pinned in (False, True):
        try:
            measure(lanes[:1], pinned, 1.0)  # warm-up
        except RuntimeError as e:  # a kind whose rows the engines refused: the other still runs
            print(f"{kind(pinned)} bytes left out: {e}")
            kinds.remove(pinned)
            continue
        try:
            work = kernels_launched(lanes[0], pinned)
        except Exception as e:  # a profiler that cannot attach must not cost the measurements below
            print(f"no profile ({kind(pinned)}): {type(e).__name__}: {e}")
            continue
        print(f"GPU work of 4 calls of {args.batch} alone, {kind(pinned)} bytes:")
        for name, (count, us) in sorted(work.items(), key=lambda kv: -kv[1][1])[:8]:
            print(f"  {count:5d} x  {us / 1e3:8.2f} ms  {name}")
    load = GraphLoad()
    load.start()
    time.sleep(1.0)
    t0, s0 = time.perf_counter(), load.steps
    time.sleep(3.0)
    load_alone = (load.steps - s0) * 256 / (time.perf_counter() - t0)
    load.stop()
    print(f"the load alone: {load_alone:,.0f} img/s")
    print(f"{'lanes':>5} {'load':>5} {'bytes':>8} {'img/s':>8} {'call wall us/img':>16} {'call CPU us/img':>15} "
          f"{'kernel':>6} {'load img/s':>10}")
    for n in lane_counts:
        for beside in (False, True):
            for r in range(args.rounds):
                for pinned in (kinds if r % 2 == 0 else kinds[::-1]):
                    if beside:
                        load.start()
                        time.sleep(0.5)
                        s0, t0 = load.steps, time.perf_counter()
                    try:
                        res = measure(lanes[:n], pinned, args.seconds)
                    except RuntimeError as e:
                        res = {"images": 0, "seconds": 1.0, "calls_wall": 0.0, "calls_cpu": 0.0, "calls_sys": 0.0}
                        print(f"{n} lanes, {kind(pinned)}: {e}")
                    load_rate = ""
                    if beside:
                        load_rate = f"{(load.steps - s0) * 256 / (time.perf_counter() - t0):,.0f}"
                        load.stop()
                    imgs = max(res["images"], 1)
                    print(f"{n:>5} {'yes' if beside else 'no':>5} {kind(pinned):>8} "
                          f"{res['images'] / res['seconds']:>8,.0f} {1e6 * res['calls_wall'] / imgs:>16.0f} "
                          f"{1e6 * res['calls_cpu'] / imgs:>15.0f} "
                          f"{res['calls_sys'] / max(res['calls_cpu'], 1e-9):>6.0%} {load_rate:>10}", flush=True)


if __name__ == "__main__":
    main()
