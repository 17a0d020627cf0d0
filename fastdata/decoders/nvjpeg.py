"""nvJPEG decoder: torchvision's batched GPU JPEG decode, then one batched GPU resample.

Per batch: encoded bytes (CPU tensors) -> ``decode_jpegs_cuda`` (one call for the batch;
stored orientation, CHW uint8 on the GPU) -> one ``torch.cat`` into a flat buffer ->
``resample_batch`` (crop + antialiased resize + flip, EXIF orientation folded into the
gather). Crops come from the native engine's plan, so they equal the native path's for the
same (seed, epoch, index). Rows nvJPEG cannot take go to the native decoder (routing.py);
the pipeline normalizes.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np
import torch

from ..io.transforms import RandomResizedCrop, Transform
from .base import DecodedRows, PlannedBatch, stored_sizes
from .gpu_resize import ImageLayout, resample_batch
from .routing import gpu_decodable


def _gpu_decoder() -> Callable[[List[torch.Tensor], torch.device], List[torch.Tensor]]:
    """torchvision's batched CUDA decoder, called as the op (skips a per-call deprecation warning)."""
    try:
        from torchvision.io.image import ImageReadMode, decode_jpeg  # loads torchvision's image ops
    except ImportError as e:
        raise ImportError("backend='nvjpeg' needs torchvision with GPU JPEG decoding (torchvision>=0.19)") from e
    rgb = ImageReadMode.RGB.value
    op = getattr(getattr(torch.ops, "image", None), "decode_jpegs_cuda", None)
    if op is not None:
        return lambda tensors, device: op(tensors, rgb, device)
    return lambda tensors, device: decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)


class NvjpegDecoder:
    """GPU decode with nvJPEG (through torchvision), crop/resize/flip batched on the GPU.

    ``finish`` returns float32 [k, H, W, 3] pixels (values 0..255) on ``device``, or, when the
    batch carries an output (``PlannedBatch.output``), has written them into it; queued on the
    current stream (the pipeline's). Needs a CUDA device.
    """

    name = "nvjpeg"
    depth = 1
    writes_output = True  # into PlannedBatch.output (base.BatchOutput), when given
    # Tests swap in torchvision's CPU decoder to check routing and assembly without a GPU.
    _allow_cpu = False

    def __init__(self, transform: Transform, *, device: torch.device) -> None:
        device = torch.device(device)
        if not self._allow_cpu:
            if device.type != "cuda":
                raise ValueError(f"backend='nvjpeg' decodes on a CUDA device; got device={device}. "
                                 "Use backend='native' for CPU output.")
            if not torch.cuda.is_available():
                raise RuntimeError("backend='nvjpeg' needs CUDA, but torch.cuda.is_available() is False")
        self.transform = transform
        self.out_hw = transform.output_size
        self.device = device
        self._decode_jpegs = _gpu_decoder()

    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        return gpu_decodable(batch)

    def start(self, batch: PlannedBatch, rows: List[int]) -> DecodedRows:
        return self._decode(batch, rows)  # synchronous: the work is queued on the stream already

    def finish(self, handle: DecodedRows, host: Optional[np.ndarray]) -> DecodedRows:
        return handle

    def discard(self, handle: DecodedRows) -> None:
        pass

    def close(self) -> None:
        pass

    def _decode(self, batch: PlannedBatch, rows: List[int]) -> DecodedRows:
        datas, plan = batch.datas, batch.plan
        tensors = [torch.from_numpy(datas[r]) for r in rows]
        rejected: List[int] = []
        try:
            decoded = list(self._decode_jpegs(tensors, self.device))
            kept = list(rows)
        except RuntimeError:
            # One sample spoiled the batched call: find it (rare path; one call per sample).
            decoded, kept = [], []
            for r, t in zip(rows, tensors):
                try:
                    decoded.append(self._decode_jpegs([t], self.device)[0])
                    kept.append(r)
                except RuntimeError:
                    rejected.append(r)
        # The decoded size must be the header's (oriented) size, else the plan's box is wrong.
        good_rows, good = [], []
        heights, widths = stored_sizes(plan, kept)
        for r, img, h, w in zip(kept, decoded, heights.tolist(), widths.tolist()):
            if img.dim() == 3 and img.shape[0] == 3 and (img.shape[1], img.shape[2]) == (h, w):
                good_rows.append(r)
                good.append(img)
            else:
                rejected.append(r)
        if not good:
            return DecodedRows(rejected=sorted(rejected))
        flat = torch.cat([img.reshape(-1) for img in good])
        layout = ImageLayout.packed([(img.shape[1], img.shape[2]) for img in good], chw=True)
        sel = np.asarray(good_rows, np.int64)
        into = batch.output  # the batch's output, where the pipeline gives one: the rows go straight there
        pixels = resample_batch(flat, layout, plan.boxes[sel], plan.flips[sel], plan.orientations[sel],
                                self.out_hw, clip_to_box=isinstance(self.transform, RandomResizedCrop),
                                into=into, rows=None if into is None else sel)
        if into is not None:
            return DecodedRows(rejected=sorted(rejected), written=True)
        return DecodedRows(pixels=pixels, rejected=sorted(rejected))
