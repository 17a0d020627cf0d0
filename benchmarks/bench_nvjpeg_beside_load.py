"""nvJPEG's hardware batched decode through fastdata's own call (``_C.NvJpegBatch``, the gpu
decoder's ``ENGINE_CALLS = "nvjpeg"``; no nvImageCodec, no Loader), alone and beside a
training-like GPU load: ResNet-18 forward + backward, bf16, channels_last, batch 256, captured as
one CUDA graph and replayed on the default stream by a thread (at most two replays in flight). The
question: do nvJPEG's own kernels and copies (its color conversion, the bitstreams' upload) wait
behind the model's kernels, and does a high-priority stream or pinned bitstreams change that?
nvImageCodec cannot tell: it decodes on internal streams of its own, at the default priority
(docs/results.md, twenty-third session).

Each variant: the decode stream at the default priority or the highest, the bitstreams in
pageable or pinned host memory; one thread, one batch of --batch images at a time, each
synchronized. Needs CUDA, torchvision and the nvidia-nvjpeg wheel (cu13).

    python benchmarks/bench_nvjpeg_beside_load.py /tmp/set8192

Twenty-third session (H100; a ctypes harness of its own then, without nvjpegDecodeBatchedPreAllocate,
which NvJpegBatch calls as nvImageCodec does): alone, 22,808 / 23,757 img/s pageable (default /
high priority), 25,841 / 25,180 pinned; beside the load every variant fell to 306 img/s while the
load kept its 12,288 img/s. The collapse was not traced, so those beside-load figures say nothing
about priority. This version has not run yet.
"""
from __future__ import annotations

import argparse
import glob
import os
import threading
import time
from typing import List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

import fastdata
from fastdata import _C
from fastdata.decoders.gpu_resize import ImageLayout
from fastdata.decoders.nvimgcodec import IMAGE_ALIGN, cudart_library, nvjpeg_library


class HardwareDecoder:
    """One _C.NvJpegBatch decoding fixed batches into one device buffer per batch."""

    def __init__(self, datas: List[bytes], batch: int):
        self.decoder = _C.NvJpegBatch(nvjpeg_library(), cudart_library())
        print(f"hardware JPEG engines: {self.decoder.hardware_engines} x {self.decoder.cores_per_engine} cores")
        sizes = [fastdata.probe(d) for d in datas]
        self.datas, self.batch = datas, batch
        pageable = [np.frombuffer(d, np.uint8) for d in datas]
        pinned = [torch.frombuffer(bytearray(d), dtype=torch.uint8).pin_memory() for d in datas]
        self._pinned = pinned  # the views below point into these
        self.batches = []
        for k in range(len(datas) // batch):
            rows = range(k * batch, (k + 1) * batch)
            layout = ImageLayout.packed(np.asarray([(sizes[i].height, sizes[i].width) for i in rows], np.int64),
                                        chw=False, align=IMAGE_ALIGN)
            out = torch.empty(layout.nbytes(), dtype=torch.uint8, device="cuda")
            self.batches.append((out, layout, [pageable[i] for i in rows], [pinned[i].numpy() for i in rows]))

    def rate(self, stream: torch.cuda.Stream, pinned: bool, seconds: float) -> float:
        """Images per second, one synchronized batch at a time on ``stream``, for ``seconds``
        (at least one batch: the first)."""
        n, t0 = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t0 < seconds:
            out, layout, pageable, pinned_rows = self.batches[n % len(self.batches)]
            status = self.decoder.decode(pinned_rows if pinned else pageable, out.data_ptr(), out.numel(),
                                         layout.base, layout.height, layout.width, stream.cuda_stream)
            stream.synchronize()
            if (np.asarray(status) != 0).any():
                raise RuntimeError(f"rows not decoded: statuses {sorted(set(np.asarray(status).tolist()))}")
            n += 1
        return n * self.batch / (time.perf_counter() - t0)

    def first_image(self) -> np.ndarray:
        out, layout = self.batches[0][:2]
        h, w = int(layout.height[0]), int(layout.width[0])
        return out[int(layout.base[0]):int(layout.base[0]) + h * w * 3].view(h, w, 3).cpu().numpy()


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
    args = p.parse_args()
    files = sorted(glob.glob(os.path.join(args.data, "**", "*.jpg"), recursive=True))[: args.batch * args.batches]
    if len(files) < args.batch:
        raise SystemExit(f"{args.data}: {len(files)} JPEGs, fewer than one batch of {args.batch}")
    datas = []
    for f in files:
        with open(f, "rb") as fh:
            datas.append(fh.read())
    decoder = HardwareDecoder(datas, args.batch)
    low, high = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-100)  # torch clamps to the device's range
    print(f"stream priorities: default {low.priority}, high {high.priority}")
    # the oracle, for both bitstream paths: fastdata's decode (libjpeg-turbo's IDCT and
    # upsampling differ from the engines' by a little)
    reference = np.asarray(fastdata.decode(datas[0])).astype(np.float64)
    for pinned in (False, True):
        decoder.batches[0][0].zero_()
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
    print(f"| decode stream, bitstreams | when | nvJPEG hardware decode img/s (batch {args.batch}, one thread) | "
          "load img/s (ResNet-18 fwd+bwd graph) |")
    print("|---|---|---:|---:|")
    for label, when, rate, load_rate in rows:
        print(f"| {label} | {when} | {'' if rate is None else f'{rate:,.0f}'} | "
              f"{'' if load_rate is None else f'{load_rate:,.0f}'} |")


if __name__ == "__main__":
    main()
