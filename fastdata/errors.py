"""Typed errors that cross from the native engine to users."""
from __future__ import annotations

from typing import Optional, Sequence


class DecodeError(ValueError):
    """An image could not be decoded.

    ``index`` is the sample's dataset index (or its position in the batch when no
    indices were given), ``name`` its path or cache key when known, and ``reason``
    the decoder's own message (libjpeg's, or Pillow's for the fallback).
    """

    def __init__(self, reason: str, index: Optional[int] = None, name: Optional[str] = None):
        self.reason = reason
        self.index = index
        self.name = name
        where = []
        if index is not None:
            where.append(f"sample {index}")
        if name:
            where.append(repr(name))
        super().__init__(f"{' '.join(where)}: {reason}" if where else reason)


class BatchDecodeError(DecodeError):
    """One or more samples of a batch failed; ``failures`` names every one of them."""

    def __init__(self, failures: Sequence[DecodeError]):
        self.failures = list(failures)
        listed = "; ".join(str(f) for f in self.failures[:8])
        more = f" (+{len(self.failures) - 8} more)" if len(self.failures) > 8 else ""
        super().__init__(f"{len(self.failures)} sample(s) failed to decode: {listed}{more}")
        self.index = self.failures[0].index if self.failures else None
        self.name = self.failures[0].name if self.failures else None
