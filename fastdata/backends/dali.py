"""DALI backend: our sampler and sources feed a DALI pipeline through ``external_source``.

Per batch we feed encoded bytes plus our own crop windows (from the native engine's plan,
so crops equal the native path's for the same (seed, epoch, index)); the pipeline does
``decoders.image_slice`` (ROI decode; ``device="mixed"`` on a GPU, ``"cpu"`` without one)
-> ``resize`` (antialiased bilinear, with a sub-pixel ROI for the fused resize + center crop)
-> ``crop_mirror_normalize`` (our flips; mean/std; float16/float32; HWC or CHW). Order,
sharding and resume stay with the Loader because DALI never chooses a sample.

DALI applies EXIF orientation (``adjust_orientation=True``) and takes the slice window in
oriented coordinates — the same coordinates as our plan (checked in the tests).

DALI is optional: ``dali_available()`` says whether ``nvidia.dali`` imports.
"""
from __future__ import annotations

import importlib.util
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from ..engine import CropPlan
from ..transforms import RandomResizedCrop
from .common import BatchBackend


def dali_available() -> bool:
    """True when NVIDIA DALI can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # "nvidia" namespace missing or broken
        return False


class DaliBackend(BatchBackend):
    """Decode + crop + resize + flip + normalize in a DALI pipeline fed with our crop plan.

    device "cuda[:i]": mixed (nvJPEG + hardware JPEG decoder, ``hw_decoder_load`` of the work
    on the hardware engine); device "cpu": DALI's CPU pipeline (``device_id=None``).
    Output as BatchBackend.run. DALI's outputs are copied into torch tensors on
    ``self.stream`` (device to device, no host copy); DALI reuses its buffers afterwards.
    """

    name = "dali"

    def __init__(self, transform, *, hw_decoder_load: float = 0.65, batch_size: int = 0, prefetch: int = 1,
                 **config: Any) -> None:
        super().__init__(transform, **config)
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
        self.hw_decoder_load = float(hw_decoder_load)
        self.prefetch = int(prefetch)
        self._max_batch = int(batch_size)
        self._pipe = None
        self._crop_only = isinstance(transform, RandomResizedCrop)

    # -- the pipeline -------------------------------------------------------------------
    def _build(self, max_batch: int) -> None:
        fn, types = self._fn, self._types
        gpu = self.device.type == "cuda"
        h, w = self.out_hw
        if self.dtype is None:
            cmn_dtype, mean, std = types.UINT8, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
        else:
            cmn_dtype = types.FLOAT16 if self.dtype == torch.float16 else types.FLOAT
            mean = [255.0 * m for m in self.mean]
            std = [255.0 * s for s in self.std]
        layout = "HWC" if (self.channels_last or self.dtype is None) else "CHW"
        decoder_args = {"device": "mixed", "hw_decoder_load": self.hw_decoder_load} if gpu else {"device": "cpu"}

        @self._pipeline_def(batch_size=max_batch, num_threads=self.threads,
                            device_id=(self.device.index or 0) if gpu else None,
                            prefetch_queue_depth=self.prefetch, exec_async=False, exec_pipelined=False)
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
            return fn.crop_mirror_normalize(images, mirror=mirror, mean=mean, std=std, dtype=cmn_dtype,
                                            output_layout=layout)

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
            x0, y0 = np.floor(boxes[:, 0]), np.floor(boxes[:, 1])
            x1, y1 = np.ceil(boxes[:, 2]), np.ceil(boxes[:, 3])
        else:
            h, w = self.out_hw
            rx = np.ceil(np.maximum((boxes[:, 2] - boxes[:, 0]) / w, 1.0)) + 1
            ry = np.ceil(np.maximum((boxes[:, 3] - boxes[:, 1]) / h, 1.0)) + 1
            x0 = np.maximum(0, np.floor(boxes[:, 0] - rx))
            y0 = np.maximum(0, np.floor(boxes[:, 1] - ry))
            x1 = np.minimum(iw, np.ceil(boxes[:, 2] + rx))
            y1 = np.minimum(ih, np.ceil(boxes[:, 3] + ry))
        anchor = np.stack([x0, y0], 1).astype(np.int32)
        shape = np.stack([x1 - x0, y1 - y0], 1).astype(np.int32)
        roi_start = np.stack([boxes[:, 1] - y0, boxes[:, 0] - x0], 1).astype(np.float32)
        roi_end = np.stack([boxes[:, 3] - y0, boxes[:, 2] - x0], 1).astype(np.float32)
        return anchor, shape, roi_start, roi_end

    def _decode(self, datas: List[np.ndarray], plan: CropPlan, rows: List[int],
                epoch: int) -> Tuple[Optional[torch.Tensor], List[int]]:
        n = len(rows)
        if self._pipe is None or n > self._max_batch:
            self._build(max(n, self._max_batch))
        anchor, shape, roi_start, roi_end = self._windows(plan, rows)
        mirror = plan.flips[np.asarray(rows, np.int64)].astype(np.int32)
        pipe = self._pipe
        try:
            pipe.feed_input("encoded", [datas[r] for r in rows])
            pipe.feed_input("anchor", list(anchor))
            pipe.feed_input("shape", list(shape))
            pipe.feed_input("roi_start", list(roi_start))
            pipe.feed_input("roi_end", list(roi_end))
            pipe.feed_input("mirror", [np.array(m, np.int32) for m in mirror])
            (out,) = pipe.run()
        except RuntimeError:
            # DALI fails the whole batch for one bad sample and its pipeline state is then
            # undefined: rebuild it, and let the native path decode (and name) every sample.
            self._pipe = None
            return None, list(rows)
        return self._to_torch(out, n), []

    def _to_torch(self, out: Any, n: int) -> torch.Tensor:
        """DALI TensorList -> torch [n, H, W, 3] in the output dtype (NHWC memory)."""
        h, w = self.out_hw
        nhwc = self.channels_last or self.dtype is None
        if self.dtype is None:
            tdtype = torch.uint8
        else:
            tdtype = torch.float16 if self.dtype == torch.float16 else torch.float32
        shape = (n, h, w, 3) if nhwc else (n, 3, h, w)
        if self.device.type == "cuda":
            from nvidia.dali.plugin.pytorch import feed_ndarray
            dst = torch.empty(shape, dtype=tdtype, device=self.device)
            # A device-to-device copy on our stream, ordered after DALI's work; DALI reuses
            # its output buffers on the next run, so tensors handed out must be our own.
            feed_ndarray(out.as_tensor(), dst, cuda_stream=torch.cuda.current_stream(self.device))
        else:
            dst = torch.from_numpy(np.array(out.as_tensor()))
        if self.dtype == torch.bfloat16:
            dst = dst.to(torch.bfloat16)
        if not nhwc:
            dst = dst.permute(0, 2, 3, 1)  # BatchBackend assembles NHWC; run() makes it contiguous NCHW again
        return dst

    def close(self) -> None:
        self._pipe = None
        super().close()
