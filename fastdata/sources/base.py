"""The source protocol: how the Loader gets encoded images and labels.

A source is random access by dataset index. ``fetch`` returns, per index, either a
file path (``str``, read by the native threads without the GIL) or a buffer of encoded
bytes (anything with the buffer protocol: bytes, memoryview, numpy uint8). Returned
buffers must stay valid while the caller holds the returned sequence.
"""
from __future__ import annotations

from typing import List, Protocol, Sequence, runtime_checkable

import numpy as np

from ..io.encoded import Item


@runtime_checkable
class Source(Protocol):
    classes: List[str]
    """Class names; label ``k`` is ``classes[k]``."""

    def __len__(self) -> int: ...

    @property
    def labels(self) -> np.ndarray:
        """int64 array [len(self)] of class indices."""
        ...

    def name(self, index: int) -> str:
        """Path or cache key of sample ``index``, for error messages."""
        ...

    def fetch(self, indices: Sequence[int]) -> Sequence[Item]:
        """Encoded images (paths or buffers) for ``indices``, in that order."""
        ...
