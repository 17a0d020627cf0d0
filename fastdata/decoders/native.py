"""The native decoder: libjpeg-turbo on the engine's threads, straight into the batch's host slot.

It accepts every row, so it is the last decoder of every pipeline and the fallback of the
others. When it is the only decoder the batch is not read or planned in Python at all: the
engine reads paths, plans and decodes in one native call (the Loader's fast path).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..io.engine import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, BatchReport, Engine, EngineRun
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

    ``normalize=(mean, std)`` makes the threads write (x / 255 - mean) / std in the host
    array's float type (float32, float16, or bfloat16 as uint16 bits: the CPU output path);
    otherwise they write uint8. ``on_report`` receives each engine run's
    ``BatchReport`` (times, warnings, Pillow fallbacks, failures) for the loader's stats.

    The pipeline drives it directly (not through the GPU decoders' start/finish): ``start``
    queues a batch's rows on the engine's threads and ``finish`` waits for them, so batch
    n + 1 is decoding while the producer hands out batch n (``depth`` 2); ``decode`` and
    ``run`` decode at once, on the calling thread and the engine's pool.
    """

    name = "native"
    depth = 2

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

    def accepts(self, batch: PlannedBatch) -> np.ndarray:
        return np.ones(len(batch), bool)

    def start(self, batch: PlannedBatch, rows: List[int], host: np.ndarray) -> Tuple[List[int], EngineRun]:
        """Queue ``rows`` of ``batch`` into ``host`` (``len(rows)`` rows, untouched until ``finish``)."""
        items, indices, epoch, names = self._call(batch, rows)
        return rows, self.engine.start(items, self.transform, host, indices=indices, epoch=epoch, names=names,
                                       **self._options())

    def finish(self, handle: Tuple[List[int], EngineRun]) -> DecodedRows:
        """Wait for a started batch; ``seconds`` is its run's own time (the hybrid split's native rate)."""
        rows, run = handle
        return self._rows(rows, self._reported(run.finish()))

    def decode(self, batch: PlannedBatch, rows: List[int], host: np.ndarray) -> DecodedRows:
        """``rows`` of ``batch`` into ``host`` now."""
        items, indices, epoch, names = self._call(batch, rows)
        return self._rows(rows, self.run(items, indices, epoch, names, host))

    def run(self, items: Sequence[Any], indices: np.ndarray, epoch: int, names: Sequence[Optional[str]],
            out: np.ndarray) -> BatchReport:
        """One engine call now: ``items`` into ``out`` (failed rows zero-filled and reported)."""
        return self._reported(self.engine.run(items, self.transform, out, indices=indices, epoch=epoch, names=names,
                                              **self._options()))

    def _reported(self, report: BatchReport) -> BatchReport:
        if self._on_report is not None:
            self._on_report(report)
        return report

    @staticmethod
    def _rows(rows: List[int], report: BatchReport) -> DecodedRows:
        return DecodedRows(failures=[(rows[i], err) for i, err in zip(report.failed_rows, report.failures)],
                           seconds=report.wall_seconds)

    def _call(self, batch: PlannedBatch, rows: List[int]) -> Tuple[Sequence[Any], np.ndarray, int, Sequence[Any]]:
        """(items, indices, epoch, names) of ``rows``. Bytes already read for the plan are not
        read again; otherwise (and for a file that could not be read, so that the error is the
        engine's own) the engine reads paths."""
        items = batch.items
        if batch.datas is not None:
            items = [data if data.size else item for data, item in zip(batch.datas, batch.items)]
        if len(rows) == len(batch):  # every row, in order: no per-row Python
            return items, batch.indices, batch.epoch, batch.names
        return [items[r] for r in rows], batch.indices[rows], batch.epoch, _Subset(batch.names, rows)

    def _options(self) -> dict:
        return dict(seed=self.seed, strict=self.strict, max_pixels=self.max_pixels, roi=self.roi,
                    normalize=self.normalize, max_file_bytes=self.max_file_bytes)

    def discard(self, handle: Tuple[List[int], EngineRun]) -> None:
        """Wait for a started batch nobody will collect (its run writes into the caller's slot). Never raises."""
        try:
            handle[1].finish()
        except Exception:
            pass

    def close(self) -> None:
        pass  # the engine belongs to the pipeline
