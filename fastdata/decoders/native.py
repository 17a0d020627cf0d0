"""The native decoder: libjpeg-turbo on the engine's threads, straight into the batch's host slot.

It accepts every row, so it is the last decoder of every pipeline and the fallback of the
others. When it is the only decoder the batch is not read or planned in Python at all: the
engine reads paths, plans and decodes in one native call (the Loader's fast path).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..io.engine import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, BatchReport, Engine
from ..io.transforms import Transform
from .base import DecodedRows, PlannedBatch


class _Subset:
    """``seq[rows[i]]`` for i, without touching the other rows (names may be lazy)."""

    def __init__(self, seq: Sequence[Any], rows: List[int]):
        self._seq, self._rows = seq, rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> Any:
        return self._seq[self._rows[i]]


class NativeDecoder:
    """Decode + crop + resize + flip rows on ``engine``'s native threads into host memory.

    ``normalize=(mean, std)`` makes the threads write float32 (x / 255 - mean) / std (the
    CPU output path); otherwise they write uint8. ``on_report`` receives each engine run's
    ``BatchReport`` (times, warnings, Pillow fallbacks, failures) for the loader's stats.
    """

    name = "native"
    depth = 1

    def __init__(self, engine: Engine, transform: Transform, *, seed: int, strict: bool = False,
                 max_pixels: int = DEFAULT_MAX_PIXELS, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 roi: bool = True,
                 normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
                 on_report: Optional[Callable[[BatchReport], None]] = None):
        self.engine = engine
        self.transform = transform
        self.seed = int(seed)
        self.strict = bool(strict)
        self.max_pixels = int(max_pixels)
        self.max_file_bytes = int(max_file_bytes)
        self.roi = bool(roi)
        self.normalize = normalize
        self._on_report = on_report

    def accepts(self, batch: PlannedBatch, row: int) -> bool:
        return True

    def start(self, batch: PlannedBatch, rows: List[int]) -> Tuple[PlannedBatch, List[int]]:
        return batch, rows  # decodes in finish, straight into the slot it is given there

    def finish(self, handle: Tuple[PlannedBatch, List[int]], host: Optional[np.ndarray]) -> DecodedRows:
        batch, rows = handle
        if host is None:
            raise RuntimeError("internal: the native decoder writes into host memory")
        # Bytes already read for the plan are not read again; otherwise (and for a file that
        # could not be read, so that the error is the engine's own) the engine reads paths.
        items = batch.items
        if batch.datas is not None:
            items = [data if data.size else item for data, item in zip(batch.datas, batch.items)]
        if len(rows) == len(batch):  # every row, in order: no per-row Python
            report = self.run(items, batch.indices, batch.epoch, batch.names, host)
        else:
            report = self.run([items[r] for r in rows], batch.indices[rows], batch.epoch,
                              _Subset(batch.names, rows), host)
        return DecodedRows(failures=[(rows[i], err) for i, err in zip(report.failed_rows, report.failures)])

    def run(self, items: Sequence[Any], indices: np.ndarray, epoch: int, names: Sequence[Optional[str]],
            out: np.ndarray) -> BatchReport:
        """One engine call: ``items`` into ``out`` (failed rows zero-filled and reported)."""
        report = self.engine.run(items, self.transform, out, seed=self.seed, epoch=epoch, indices=indices,
                                 strict=self.strict, max_pixels=self.max_pixels, names=names, roi=self.roi,
                                 normalize=self.normalize, max_file_bytes=self.max_file_bytes)
        if self._on_report is not None:
            self._on_report(report)
        return report

    def discard(self, handle: Any) -> None:
        pass  # nothing was queued

    def close(self) -> None:
        pass  # the engine belongs to the pipeline
