"""nvJPEG's hardware batched decode, called through ctypes (no nvImageCodec, no fastdata decoder),
alone and beside a training-like GPU load: ResNet-18 forward + backward, bf16, channels_last,
batch 256, captured as one CUDA graph and replayed on the default stream by a thread (at most
two replays in flight). The question: do nvJPEG's own kernels and copies (its color conversion,
the bitstreams' upload) wait behind the model's kernels, and does a high-priority stream or
pinned bitstreams change that? nvImageCodec cannot tell: it decodes on internal streams of its
own, at the default priority (docs/results.md, twenty-third session).

Each variant: the decode stream at the default priority or the highest, the bitstreams in
pageable or pinned host memory; one thread, one batch of --batch images at a time, each
synchronized. Needs CUDA, torchvision and the nvidia-nvjpeg wheel (cu13).

    python benchmarks/bench_nvjpeg_beside_load.py /tmp/set8192 [--preallocate]

Twenty-third session (H100, without --preallocate): alone, 22,808 / 23,757 img/s pageable
(default / high priority), 25,841 / 25,180 pinned; beside the load every variant fell to
306 img/s while the load kept its 12,288 img/s. nvImageCodec preallocates nvJPEG's buffers
(nvjpegDecodeBatchedPreAllocate); this run did not, and the collapse was not traced, so those
beside-load figures say nothing about priority: --preallocate is the next run.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
import threading
import time
from typing import List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

import fastdata

NVJPEG_BACKEND_HARDWARE = 3
NVJPEG_OUTPUT_RGBI = 5
NVJPEG_CSS_420 = 2


class NvjpegImage(ctypes.Structure):  # nvjpegImage_t (CUDA 13: size_t pitches)
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def load_nvjpeg() -> ctypes.CDLL:
    for base in sys.path + ["/tmp/site"]:
        hits = glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libnvjpeg.so.13"))
        if hits:
            return ctypes.CDLL(hits[0])
    raise SystemExit("libnvjpeg.so.13 not found: pip install nvidia-nvjpeg")


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: nvJPEG status {status}")


class HardwareDecoder:
    """One nvJPEG hardware-backend handle and state, decoding fixed batches into device buffers."""

    def __init__(self, lib: ctypes.CDLL, datas: List[bytes], batch: int, preallocate: bool):
        self.lib = lib
        self.handle, self.state = ctypes.c_void_p(), ctypes.c_void_p()
        check(lib.nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, None, None, 0, ctypes.byref(self.handle)), "nvjpegCreateEx")
        engines, cores = ctypes.c_uint(), ctypes.c_uint()
        check(lib.nvjpegGetHardwareDecoderInfo(self.handle, ctypes.byref(engines), ctypes.byref(cores)), "decoder info")
        print(f"hardware JPEG engines: {engines.value} x {cores.value} cores")
        check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)), "nvjpegJpegStateCreate")
        check(lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, batch, 1, NVJPEG_OUTPUT_RGBI), "initialize")
        sizes = [fastdata.probe(d) for d in datas]
        if preallocate:
            check(lib.nvjpegDecodeBatchedPreAllocate(self.handle, self.state, batch, max(s.width for s in sizes),
                                                     max(s.height for s in sizes), NVJPEG_CSS_420, NVJPEG_OUTPUT_RGBI),
                  "nvjpegDecodeBatchedPreAllocate")
        self.datas, self.batch = datas, batch
        self.pinned = [torch.frombuffer(bytearray(d), dtype=torch.uint8).pin_memory() for d in datas]
        self.batches = []
        for k in range(len(datas) // batch):
            rows = range(k * batch, (k + 1) * batch)
            outs, images = [], (NvjpegImage * batch)()
            for j, i in enumerate(rows):
                out = torch.empty(sizes[i].height * sizes[i].width * 3, dtype=torch.uint8, device="cuda")
                outs.append(out)
                images[j].channel[0], images[j].pitch[0] = out.data_ptr(), sizes[i].width * 3
            pageable = (ctypes.c_void_p * batch)(*[ctypes.cast(ctypes.c_char_p(datas[i]), ctypes.c_void_p).value
                                                   for i in rows])
            pinned = (ctypes.c_void_p * batch)(*[self.pinned[i].data_ptr() for i in rows])
            lengths = (ctypes.c_size_t * batch)(*[len(datas[i]) for i in rows])
            self.batches.append((outs, images, pageable, pinned, lengths))

    def rate(self, stream: torch.cuda.Stream, pinned: bool, seconds: float) -> float:
        """Images per second, one synchronized batch at a time on ``stream``, for ``seconds``
        (at least one batch: the first)."""
        n, t0 = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t0 < seconds:
            outs, images, pageable, pinned_ptrs, lengths = self.batches[n % len(self.batches)]
            check(self.lib.nvjpegDecodeBatched(self.handle, self.state, pinned_ptrs if pinned else pageable, lengths,
                                               images, ctypes.c_void_p(stream.cuda_stream)), "nvjpegDecodeBatched")
            stream.synchronize()
            n += 1
        return n * self.batch / (time.perf_counter() - t0)

    def first_image(self) -> np.ndarray:
        info = fastdata.probe(self.datas[0])
        return self.batches[0][0][0].view(info.height, info.width, 3).cpu().numpy()

    def close(self) -> None:
        check(self.lib.nvjpegJpegStateDestroy(self.state), "nvjpegJpegStateDestroy")
        check(self.lib.nvjpegDestroy(self.handle), "nvjpegDestroy")


class GraphLoad:
    """ResNet-18 forward + backward as one CUDA graph, replayed on the default stream by a thread."""

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

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as torch.cuda.graph asks
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            step()
        torch.cuda.synchronize()
        self.steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        in_flight = []
        while not self._stop.is_set():
            self.graph.replay()
            done = torch.cuda.Event()
            done.record()
            in_flight.append(done)
            if len(in_flight) > 2:
                in_flight.pop(0).synchronize()
            self.steps += 1
        torch.cuda.synchronize()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="a folder of baseline 4:2:0 JPEGs the engines take (the 8,192 set)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=8, help="distinct batches cycled through")
    p.add_argument("--seconds", type=float, default=6.0, help="per variant beside the load (4 alone)")
    p.add_argument("--preallocate", action="store_true", help="nvjpegDecodeBatchedPreAllocate first, as nvImageCodec does")
    args = p.parse_args()
    files = sorted(glob.glob(os.path.join(args.data, "**", "*.jpg"), recursive=True))[: args.batch * args.batches]
    if len(files) < args.batch:
        raise SystemExit(f"{args.data}: {len(files)} JPEGs, fewer than one batch of {args.batch}")
    datas = [open(f, "rb").read() for f in files]
    decoder = HardwareDecoder(load_nvjpeg(), datas, args.batch, args.preallocate)
    low, high = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-100)  # torch clamps to the device's range
    print(f"stream priorities: default {low.priority}, high {high.priority}")
    # the oracle, for both bitstream paths: fastdata's decode (libjpeg-turbo's IDCT and
    # upsampling differ from the engines' by a little)
    reference = np.asarray(fastdata.decode(datas[0])).astype(np.float64)
    for pinned in (False, True):
        decoder.batches[0][0][0].zero_()
        decoder.rate(low, pinned, 0.0)  # one batch: the first
        diff = np.abs(decoder.first_image().astype(np.float64) - reference).mean()
        print(f"first image ({'pinned' if pinned else 'pageable'} bitstreams) against fastdata.decode: "
              f"mean absolute difference {diff:.2f}")
        if diff > 3:
            raise SystemExit("the engines' output does not match the image: the harness is wrong")
    variants: List[Tuple[str, torch.cuda.Stream, bool]] = [
        ("default pageable", low, False), ("high pageable", high, False),
        ("default pinned", low, True), ("high pinned", high, True)]
    rows = [(label, "alone", decoder.rate(stream, pinned, 4.0), None) for label, stream, pinned in variants]
    load = GraphLoad()
    load.start()
    time.sleep(2.0)
    s0, t0 = load.steps, time.perf_counter()
    time.sleep(4.0)
    rows.append(("(none)", "load alone", None, (load.steps - s0) * 256 / (time.perf_counter() - t0)))
    for _ in range(2):
        for label, stream, pinned in variants:
            s0, t0 = load.steps, time.perf_counter()
            rate = decoder.rate(stream, pinned, args.seconds)
            rows.append((label, "beside the load", rate, (load.steps - s0) * 256 / (time.perf_counter() - t0)))
    load.stop()
    decoder.close()
    print(f"| decode stream, bitstreams | when | nvJPEG hardware decode img/s (batch {args.batch}, one thread) | "
          "load img/s (ResNet-18 fwd+bwd graph) |")
    print("|---|---|---:|---:|")
    for label, when, rate, load_rate in rows:
        print(f"| {label} | {when} | {'' if rate is None else f'{rate:,.0f}'} | "
              f"{'' if load_rate is None else f'{load_rate:,.0f}'} |")


if __name__ == "__main__":
    main()
