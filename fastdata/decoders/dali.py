"""DALI decoder: our sampler and sources feed a DALI pipeline through ``external_source``.

Per batch we feed encoded bytes plus our own crop windows (from the native engine's plan,
so crops equal the native path's for the same (seed, epoch, index)); the pipeline does
``decoders.image_slice`` (ROI decode; ``device="mixed"`` on a GPU, ``"cpu"`` without one)
-> ``resize`` (antialiased bilinear, with a sub-pixel ROI for the fused resize + center crop)
-> ``crop_mirror_normalize`` (our flips; uint8 HWC out: the Loader's pipeline normalizes every
decoder's rows in one place). Order, sharding and resume stay with the Loader because DALI
never chooses a sample.

DALI applies EXIF orientation (``adjust_orientation=True``) and takes the slice window in
oriented coordinates — the same coordinates as our plan (checked in the tests).

The pipeline runs asynchronously (DALI's default executor; ``prefetch_queue_depth=1`` so each
``schedule_run`` runs exactly the batch just fed): ``start`` feeds a batch and schedules it,
``finish`` takes the outputs in the same order, on the current (the pipeline's) CUDA stream
without a host synchronization. The Loader keeps ``depth`` batches in flight, so reading files
and planning crops for the next batches overlap DALI's decoding of this one.

DALI is optional: ``dali_available()`` says whether ``nvidia.dali`` imports.
"""
from __future__ import annotations

import importlib.util
from collections import deque
from typing import Any, Deque, List, Optional, Tuple

import numpy as np
import torch

from ..io.engine import CropPlan
from ..io.transforms import RandomResizedCrop, Transform
from .base import DecodedRows, PlannedBatch
from .gpu_resize import filter_reach
from .routing import gpu_decodable


def dali_available() -> bool:
    """True when NVIDIA DALI can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # "nvidia" namespace missing or broken
        return False


class DaliDecoder:
    """Decode + crop + resize + flip in a DALI pipeline fed with our crop plan.

    device "cuda[:i]": mixed (nvJPEG + hardware JPEG decoder, ``hw_decoder_load`` of the work
    on the hardware engine); device "cpu": DALI's CPU pipeline (``device_id=None``).
    ``finish`` returns uint8 [k, H, W, 3] pixels on ``device``: DALI's outputs are copied into
    torch tensors on the current stream (device to device, no host copy); DALI's outputs,
    bound to that stream, are released in stream order once the copy is queued.
    ``prefetch``: batches in flight in the pipeline (the Loader's submit-ahead depth); 4 measured
    ~24% faster than 2 on the H200 box (backend loop, 256-image batches, 2026-12-01).
    """

    name = "dali"

    def __init__(self, transform: Transform, *, device: torch.device, threads: int, hw_decoder_load: float = 0.65,
                 batch_size: int = 0, prefetch: int = 4) -> None:
        self.transform = transform
        self.out_hw = transform.output_size
        self.device = torch.device(device)
        self.threads = int(threads)
        try:
            import nvidia.dali.fn as fn
            import nvidia.dali.types as types
            from nvidia.dali import pipeline_def
        except ImportError as e:
            from . import DALI_MISSING
            raise ImportError(DALI_MISSING) from e
        if not 0.0 <= hw_decoder_load <= 1.0:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {hw_decoder_load}")
        self._fn, self._types, self._pipeline_def = fn, types, pipeline_def
        if int(prefetch) < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        self.hw_decoder_load = float(hw_decoder_load)
        self.depth = int(prefetch)
        self._max_batch = int(batch_size)
        self._pipe = None
        self._inflight: Deque[_Ticket] = deque()  # scheduled on a pipeline, outputs not taken yet
        self._retired: Deque[Any] = deque(maxlen=4)  # failed pipelines, destroyed late (see _lose)
        self._crop_only = isinstance(transform, RandomResizedCrop)

    # -- the pipeline -------------------------------------------------------------------
    def _build(self, max_batch: int) -> None:
        fn, types = self._fn, self._types
        gpu = self.device.type == "cuda"
        h, w = self.out_hw
        decoder_args = {"device": "mixed", "hw_decoder_load": self.hw_decoder_load} if gpu else {"device": "cpu"}

        @self._pipeline_def(batch_size=max_batch, num_threads=self.threads,
                            device_id=(self.device.index or 0) if gpu else None,
                            prefetch_queue_depth=1, exec_async=True, exec_pipelined=True,
                            exec_dynamic=True)  # needed by outputs(cuda_stream=...)
        def pipeline():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            anchor = fn.external_source(name="anchor", dtype=types.INT32)   # (x, y) of the decoded window
            shape = fn.external_source(name="shape", dtype=types.INT32)     # (w, h)
            roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT)  # (y, x) inside the window
            roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT)
            mirror = fn.external_source(name="mirror", dtype=types.INT32)
            images = fn.decoders.image_slice(encoded, anchor, shape, normalized_anchor=False,
                                             normalized_shape=False, output_type=types.RGB,
                                             adjust_orientation=True, **decoder_args)
            images = fn.resize(images, resize_x=float(w), resize_y=float(h), roi_start=roi_start,
                               roi_end=roi_end, roi_relative=False, antialias=True,
                               interp_type=types.INTERP_LINEAR, subpixel_scale=False)
            return fn.crop_mirror_normalize(images, mirror=mirror, mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0],
                                            dtype=types.UINT8, output_layout="HWC")

        pipe = pipeline()
        pipe.build()
        self._pipe = pipe
        self._max_batch = max_batch

    def _windows(self, plan: CropPlan, rows: List[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Integer decode windows (anchor, shape) and the exact float box inside each window.

        RandomResizedCrop: the window is the (integer) box, as Pillow's crop + resize.
        CenterCrop: the box is fractional and the filter may read around it, so the window
        is the box widened by the filter's reach, clipped to the image.
        """
        sel = np.asarray(rows, np.int64)
        boxes = plan.boxes[sel]
        ih = plan.sizes[sel, 0].astype(np.float64)
        iw = plan.sizes[sel, 1].astype(np.float64)
        if self._crop_only:
            # Clipped: a box edge computed in floating point can lie a hair past the image
            # (459.00000000000006 for a 459-row image), and its ceiling one pixel past it.
            # DALI rejects such a window and fails the whole batch (issue 14's crash began so).
            x0, y0 = np.maximum(0, np.floor(boxes[:, 0])), np.maximum(0, np.floor(boxes[:, 1]))
            x1, y1 = np.minimum(iw, np.ceil(boxes[:, 2])), np.minimum(ih, np.ceil(boxes[:, 3]))
        else:
            h, w = self.out_hw
            rx = filter_reach((boxes[:, 2] - boxes[:, 0]) / w)
            ry = filter_reach((boxes[:, 3] - boxes[:, 1]) / h)
            x0 = np.maximum(0, np.floor(boxes[:, 0] - rx))
            y0 = np.maximum(0, np.floor(boxes[:, 1] - ry))
            x1 = np.minimum(iw, np.ceil(boxes[:, 2] + rx))
            y1 = np.minimum(ih, np.ceil(boxes[:, 3] + ry))
        anchor = np.stack([x0, y0], 1).astype(np.int32)
        shape = np.stack([x1 - x0, y1 - y0], 1).astype(np.int32)
        roi_start = np.stack([boxes[:, 1] - y0, boxes[:, 0] - x0], 1).astype(np.float32)
        roi_end = np.stack([boxes[:, 3] - y0, boxes[:, 2] - x0], 1).astype(np.float32)
        return anchor, shape, roi_start, roi_end

    # -- the decoder interface (fastdata.decoders.base) -----------------------------------
    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        return gpu_decodable(batch)

    def start(self, batch: PlannedBatch, rows: List[int]) -> "_Ticket":
        datas, plan = batch.datas, batch.plan
        n = len(rows)
        if self._pipe is None or n > self._max_batch:
            self._drain()  # batches in flight on the old pipeline keep their outputs
            self._build(max(n, self._max_batch))
        anchor, shape, roi_start, roi_end = self._windows(plan, rows)
        mirror = np.ascontiguousarray(plan.flips[np.asarray(rows, np.int64)], dtype=np.int32)
        pipe = self._pipe
        ticket = _Ticket(pipe, list(rows))
        try:
            # Fixed-size inputs go in as one dense array each (outer dimension = the batch):
            # DALI converts a list element by element in Python; py-spy on the H200 box showed
            # the Loader's producer thread spending most of its time there (2026-12-01).
            pipe.feed_input("encoded", [datas[r] for r in rows])
            pipe.feed_input("anchor", anchor)
            pipe.feed_input("shape", shape)
            pipe.feed_input("roi_start", roi_start)
            pipe.feed_input("roi_end", roi_end)
            pipe.feed_input("mirror", mirror)
            pipe.schedule_run()
        except (RuntimeError, IndexError):  # what DALI raises for data it cannot take
            self._lose(pipe)
            ticket.lost = ticket.done = True
            return ticket
        except Exception:
            # Anything else may have left the inputs half fed (one batch's bytes paired with
            # another's windows later): never use this pipeline again.
            self._lose(pipe)
            raise
        self._inflight.append(ticket)
        return ticket

    def finish(self, ticket: "_Ticket", host: Optional[np.ndarray] = None) -> DecodedRows:
        while not ticket.done:
            if not self._inflight:
                raise RuntimeError("internal: a DALI batch was collected twice or out of order")
            self._take_oldest()
        if ticket.lost:
            return DecodedRows(rejected=list(ticket.rows))
        out, ticket.result = ticket.result, None
        return DecodedRows(pixels=out)

    def discard(self, ticket: "_Ticket") -> None:
        """Take and drop a started batch's outputs, keeping the pipeline's queue in step."""
        try:
            self.finish(ticket)
        except Exception:  # the batch's errors no longer matter
            pass

    def _take_oldest(self) -> None:
        """Outputs of the oldest batch in flight, copied into a tensor of our own."""
        ticket = self._inflight[0]  # dequeued only once its outputs are taken, or its pipeline lost
        try:
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            (out,) = ticket.pipe.outputs(cuda_stream=stream) if stream is not None else ticket.pipe.outputs()
            ticket.result = self._to_torch(out, len(ticket.rows))
        except (RuntimeError, IndexError):
            # DALI fails the whole batch for one bad sample: this batch and every other one in
            # flight on that pipeline go to the native path (which decodes and names each
            # sample), and the next batch builds a new pipeline.
            ticket.lost = True
            self._lose(ticket.pipe)
        except Exception:
            self._lose(ticket.pipe)
            raise
        else:
            self._inflight.popleft()
        ticket.done = True

    def _lose(self, pipe: Any) -> None:
        """``pipe`` failed: its batches in flight are lost (native fallback); never use it again."""
        for t in self._inflight:
            if t.pipe is pipe:
                t.lost = t.done = True
        self._inflight = deque(t for t in self._inflight if t.pipe is not pipe)
        if self._pipe is pipe:
            self._pipe = None
        # Destroying a pipeline right after its critical error segfaulted DALI 2.4's worker
        # threads (still inside the mixed ImageDecoder; H200 box, 2026-12-01): keep the failed
        # pipeline alive until a few later ones have failed too, by when its threads are idle.
        self._retired.append(pipe)

    def _drain(self) -> None:
        while self._inflight:
            self._take_oldest()

    def _to_torch(self, out: Any, n: int) -> torch.Tensor:
        """DALI TensorList -> torch uint8 [n, H, W, 3]."""
        h, w = self.out_hw
        shape = (n, h, w, 3)
        if self.device.type == "cuda":
            from nvidia.dali.plugin.pytorch import feed_ndarray
            dst = torch.empty(shape, dtype=torch.uint8, device=self.device)
            # A device-to-device copy on our stream, ordered after DALI's work,
            # so the tensors handed out are plain torch memory
            # whose lifetime the caching allocator and record_stream manage.
            feed_ndarray(out.as_tensor(), dst, cuda_stream=torch.cuda.current_stream(self.device))
        else:
            dst = torch.from_numpy(np.array(out.as_tensor()))
        return dst

    def close(self) -> None:
        self._inflight.clear()
        self._pipe = None


class _Ticket:
    """A batch scheduled on a DALI pipeline: its GPU rows, then its result once taken."""

    __slots__ = ("pipe", "rows", "result", "done", "lost")

    def __init__(self, pipe: Any, rows: List[int]) -> None:
        self.pipe = pipe
        self.rows = rows
        self.result: Optional[torch.Tensor] = None
        self.done = False
        self.lost = False  # the pipeline failed: decode these rows natively
