"""The native engine behind the backend interface: CPU decode into pinned memory, upload, normalize.

The Loader has its own pinned ring for this path; this class exists so that benchmarks and
tests can drive every backend through the same ``run`` call.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import List, Sequence, Tuple

import torch

from ..errors import DecodeError
from .common import BatchBackend, Item


class NativeBackend(BatchBackend):
    """libjpeg-turbo on the engine's native threads for every sample (paths read natively)."""

    name = "native"

    def run(self, items: Sequence[Item], indices: Sequence[int],
            epoch: int) -> Tuple[torch.Tensor, List[DecodeError], List[int]]:
        """Same contract as ``BatchBackend.run``."""
        n = len(items)
        index_arr = self._check_batch(items, indices, epoch)
        names = [it if isinstance(it, str) else None for it in items]
        rows = list(range(n))
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            pixels, fail_rows, failures = self._native(items, names, index_arr, rows, epoch)
            self.stats["native_fallbacks"] += n
            self.stats["batches"] += 1
            out = self._assemble(n, [], None, rows, pixels)
        return out, failures, fail_rows
