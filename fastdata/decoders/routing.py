"""Routing: which decoder takes each row of a batch, decided from the headers.

``plan_batch`` reads the batch's bytes (paths on the native engine's threads) and asks the
native header reader for every sample's crop box, flip, size and orientation, keyed by
(seed, epoch, index): the crops are the native engine's whichever decoder runs a row.
``route`` then gives each row to the first decoder that ``accepts`` it; the native decoder
comes last and takes the rest (non-JPEG, CMYK/YCCK, 12-bit, truncated files, and anything a
GPU decoder rejects later), so a batch is never lost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..io.engine import DEFAULT_MAX_PIXELS, Engine
from ..io.transforms import Transform
from .base import Decoder, Item, PlannedBatch

_SOF_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


@dataclass(frozen=True)
class FrameInfo:
    """A JPEG frame header: sample precision (bits), components and SOF marker."""

    precision: int
    components: int
    marker: int

    @property
    def progressive(self) -> bool:
        return self.marker in _SOF_PROGRESSIVE

    @property
    def baseline_like(self) -> bool:
        """8-bit Huffman DCT (baseline, extended or progressive) with 1 or 3 components:
        what nvJPEG and DALI's GPU decoder take. 4 components (CMYK/YCCK, often Adobe-
        inverted), 12-bit, lossless and arithmetic-coded frames go to the native decoder."""
        return self.precision == 8 and self.components in (1, 3) and self.marker in (0xC0, 0xC1, 0xC2)


def frame_info(data: Union[bytes, memoryview, np.ndarray]) -> Optional[FrameInfo]:
    """Walk the JPEG markers up to the frame header (a few segments; no pixel data read).

    Returns None when no frame header is found (not a JPEG, or damaged headers).
    ``fastdata.probe`` says the same but costs ~40 us per image; this costs a few.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(view)
    if n < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if view[i] != 0xFF:
            return None
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # segments without a length
            i += 2
            continue
        length = (view[i + 2] << 8) | view[i + 3]
        if marker in _SOF:
            if i + 10 > n:
                return None
            return FrameInfo(precision=view[i + 4], components=view[i + 9], marker=marker)
        if marker in (0xDA, 0xD9) or length < 2:  # scan or end before any frame header
            return None
        i += 2 + length
    return None


def ends_with_eoi(data: Union[bytes, memoryview, np.ndarray]) -> bool:
    """True when the JPEG ends with its EOI marker (trailing zero padding allowed).

    A file without EOI (the common truncation) goes to the native decoder: GPU decoders do
    not report libjpeg's corrupt-data warnings (strict mode) and DALI fails whole batches.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    end = len(view)
    limit = max(0, end - 4096)
    while end > limit and view[end - 1] == 0:
        end -= 1
    return end >= 2 and view[end - 2] == 0xFF and view[end - 1] == 0xD9


def read_items(items: Sequence[Item], engine: Engine) -> Tuple[List[np.ndarray], List[Optional[str]]]:
    """Encoded bytes of each item as a writable uint8 numpy array, and why it could not be
    read (None when it was).

    Paths are read by the engine's native threads (GIL released, no Python per file: a
    Python thread pool cost ~125 us per file on the 2-core box, more than the read); buffers are copied
    once so the result owns its memory (torch refuses read-only arrays, and LMDB views die
    with their transaction). An unreadable or empty item gives an empty array.
    """
    datas: List[Optional[np.ndarray]] = [None] * len(items)
    reasons: List[Optional[str]] = [None] * len(items)
    rows = [i for i, it in enumerate(items) if isinstance(it, str)]
    if rows:
        arrays, errors = engine.read_files([items[i] for i in rows])
        for i, array, error in zip(rows, arrays, errors):
            datas[i] = array
            reasons[i] = error if error is not None else ("empty file" if array.size == 0 else None)
    for i, it in enumerate(items):
        if datas[i] is None:
            datas[i] = np.frombuffer(it, dtype=np.uint8).copy()
            if datas[i].size == 0:
                reasons[i] = "empty buffer"
    return datas, reasons  # type: ignore[return-value]


def plan_batch(items: Sequence[Item], indices: np.ndarray, epoch: int, names: Sequence[Optional[str]],
               engine: Engine, transform: Transform, *, seed: int,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> PlannedBatch:
    """Read ``items`` and plan their crops; rows whose bytes or header cannot be read are
    ``unplanned``, non-JPEGs ``not_jpeg``."""
    datas, _ = read_items(items, engine)
    plan = engine.plan(datas, transform, seed=seed, epoch=epoch, indices=indices, max_pixels=max_pixels)
    return PlannedBatch(items, indices, epoch, names, datas=datas, plan=plan,
                        not_jpeg=frozenset(plan.not_jpeg_rows), unplanned=frozenset(plan.failed_rows))


def route(batch: PlannedBatch, decoders: Sequence[Decoder]) -> List[List[int]]:
    """Rows per decoder (sorted): each row goes to the first decoder that accepts it; the last
    decoder (the native one) must accept every row, and alone gets the ``unplanned`` rows: it
    names their failure exactly as it does without a plan."""
    routes: List[List[int]] = [[] for _ in decoders]
    for row in range(len(batch)):
        if row in batch.unplanned:
            routes[-1].append(row)
            continue
        for rows, decoder in zip(routes, decoders):
            if decoder.accepts(batch, row):
                rows.append(row)
                break
        else:
            raise RuntimeError(f"internal: no decoder accepts row {row} (the native decoder must come last)")
    return routes


def gpu_decodable(batch: PlannedBatch, row: int) -> bool:
    """What nvJPEG and DALI's GPU decoder take: an 8-bit Huffman JPEG (baseline, extended or
    progressive) with 1 or 3 components that ends with its EOI marker.

    Files without EOI (truncated) decode natively: libjpeg reports or grey-fills them as
    ``strict`` asks, while GPU decoders fail the whole batch or return garbage for them.
    """
    if batch.datas is None or row in batch.not_jpeg:
        return False
    data = batch.datas[row]
    info = frame_info(data)
    return info is not None and info.baseline_like and ends_with_eoi(data)
