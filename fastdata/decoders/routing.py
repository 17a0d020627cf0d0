"""Routing: which decoder takes each row of a batch, decided from the headers.

``plan_batch`` reads the batch's bytes (paths on the native engine's threads) and asks the
native header reader for every sample's crop box, flip, size and orientation, keyed by
(seed, epoch, index): the crops are the native engine's whichever decoder runs a row. (Hybrid
reads only the rows up to the GPU's share of the batch: the pipeline's ``_plan_gpu_share``.)
``route`` then gives each row to the first decoder that ``accepts`` it (each decoder answers
for the whole batch at once from the plan's arrays; only the EOI check reads each row); the native decoder
comes last and takes the rest (non-JPEG, CMYK/YCCK, 12-bit, truncated files, and anything a
GPU decoder rejects later), so a batch is never lost.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DecodeError
from ..io.engine import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, CropPlan, Engine
from ..io.transforms import Transform
from .base import Decoder, Item, PlannedBatch


def ends_with_eoi(data: Union[bytes, memoryview, np.ndarray]) -> bool:
    """True when the JPEG ends with its EOI marker (trailing zero padding allowed).

    A file without EOI (the common truncation) goes to the native decoder: GPU decoders do
    not report libjpeg's corrupt-data warnings (strict mode) and DALI fails whole batches.
    """
    # The usual file ends in FF D9: two reads, no view (routing asks this of every GPU row).
    if getattr(data, "itemsize", 1) == 1 and len(data) >= 2 and data[-2] == 0xFF and data[-1] == 0xD9:
        return True
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    end = len(view)
    limit = max(0, end - 4096)
    while end > limit and view[end - 1] == 0:
        end -= 1
    return end >= 2 and view[end - 2] == 0xFF and view[end - 1] == 0xD9


def read_items(items: Sequence[Item], engine: Engine,
               max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Tuple[List[np.ndarray], List[Optional[str]]]:
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
        arrays, errors = engine.read_files([items[i] for i in rows], max_file_bytes)
        for i, array, error in zip(rows, arrays, errors):
            datas[i] = array
            reasons[i] = error if error is not None else ("empty file" if array.size == 0 else None)
    for i, it in enumerate(items):
        if isinstance(it, DecodeError):  # the source found the sample bad (an LMDB record failing its checksum)
            datas[i], reasons[i] = np.empty(0, np.uint8), it.reason
        elif datas[i] is None:
            datas[i] = np.frombuffer(it, dtype=np.uint8).copy()
            if datas[i].size == 0:
                reasons[i] = "empty buffer"
    return datas, reasons  # type: ignore[return-value]


def plan_batch(items: Sequence[Item], indices: np.ndarray, epoch: int, names: Sequence[Optional[str]],
               engine: Engine, transform: Transform, *, seed: int,
               max_pixels: int = DEFAULT_MAX_PIXELS, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
               datas: Optional[List[np.ndarray]] = None) -> PlannedBatch:
    """Read ``items`` and plan their crops; rows whose bytes or header cannot be read are
    ``unplanned``, non-JPEGs ``not_jpeg``.

    ``datas``: the bytes of the first ``len(datas)`` rows, read by the caller (``read_items``),
    who needs no more: the rows after them are neither read nor planned. They are ``unplanned``
    (their ``datas`` empty), so routing gives them to the native decoder, which reads them itself.
    """
    n = len(items)
    if datas is None:
        datas, _ = read_items(items, engine, max_file_bytes)
    elif len(datas) > n:
        raise ValueError(f"{len(datas)} rows of bytes for a batch of {n}")
    m = len(datas)
    plan = engine.plan(datas, transform, seed=seed, epoch=epoch, indices=indices[:m], max_pixels=max_pixels)
    unplanned = set(plan.failed_rows)
    if m < n:
        plan = _padded(plan, n)
        unplanned.update(range(m, n))
        datas = list(datas) + [_UNREAD] * (n - m)
    return PlannedBatch(items, indices, epoch, names, datas=datas, plan=plan,
                        not_jpeg=frozenset(plan.not_jpeg_rows), unplanned=frozenset(unplanned))


# The bytes of a row plan_batch did not read (empty: the native decoder reads the item itself).
_UNREAD = np.empty(0, np.uint8)
_UNREAD.flags.writeable = False


def _padded(plan: CropPlan, n: int) -> CropPlan:
    """``plan`` with its per-row arrays grown to ``n`` rows of zeros (rows it did not plan)."""
    grown = {}
    for f in dataclasses.fields(plan):
        value = getattr(plan, f.name)
        if isinstance(value, np.ndarray):
            pad = np.zeros((n - value.shape[0],) + value.shape[1:], value.dtype)
            value = np.concatenate([value, pad])
        grown[f.name] = value
    return CropPlan(**grown)


def route(batch: PlannedBatch, decoders: Sequence[Decoder]) -> List[List[int]]:
    """Rows per decoder (sorted): each row goes to the first decoder that accepts it; the last
    decoder (the native one) must accept every row, and alone gets the ``unplanned`` rows: it
    names their failure exactly as it does without a plan."""
    if not decoders:
        raise RuntimeError("internal: no decoders to route to (the native decoder must come last)")
    n = len(batch)
    left = np.ones(n, bool)
    unplanned = sorted(batch.unplanned)
    left[unplanned] = False
    routes: List[List[int]] = []
    for k, decoder in enumerate(decoders):
        accepted = np.asarray(decoder.accepts(batch), dtype=bool)
        if accepted.shape != (n,):
            raise RuntimeError(f"internal: decoder {getattr(decoder, 'name', decoder)!r} answered accepts for "
                               f"{accepted.shape} rows, not ({n},)")
        if k == len(decoders) - 1:
            if not accepted[left].all():
                row = int(np.flatnonzero(left & ~accepted)[0])
                raise RuntimeError(f"internal: no decoder accepts row {row} (the native decoder must come last)")
            routes.append(sorted(np.flatnonzero(left).tolist() + unplanned))
        else:
            taken = left & accepted
            routes.append(np.flatnonzero(taken).tolist())
            left &= ~taken
    return routes


def gpu_decodable(batch: PlannedBatch) -> np.ndarray:
    """Per row (bool [len(batch)]), what nvJPEG and DALI's GPU decoder take: an 8-bit Huffman
    JPEG (baseline, extended or progressive) with 1 or 3 components, the 3 YCbCr-coded, that
    ends with its EOI marker.

    RGB-coded files (an Adobe marker's transform 0, or component IDs 'R', 'G', 'B': libjpeg
    reads them as RGB) decode natively: nvImageCodec's parser takes every three-component JPEG
    for YCbCr.

    Files without EOI (truncated) decode natively: libjpeg reports or grey-fills them as
    ``strict`` asks, while GPU decoders fail the whole batch or return garbage for them.
    """
    n = len(batch)
    if batch.datas is None or batch.plan is None:
        return np.zeros(n, bool)
    plan = batch.plan  # the header facts the native reader parsed: the markers are not walked again
    # 12-bit, CMYK/YCCK (often Adobe-inverted), arithmetic coding: the native decoder.
    ok = ((np.asarray(plan.precisions) == 8) & np.isin(plan.components, (1, 3))
          & ~np.asarray(plan.arithmetic, dtype=bool) & ~np.asarray(plan.rgb_coded, dtype=bool))
    ok[sorted(batch.not_jpeg | batch.unplanned)] = False
    rows = np.flatnonzero(ok).tolist()
    ok[rows] = [ends_with_eoi(batch.datas[row]) for row in rows]
    return ok
