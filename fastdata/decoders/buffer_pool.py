"""Spare byte buffers of finished batches, handed to later ones (the GPU decoder's image
buffers on the device).

Batches' byte counts vary (the hybrid split, image sizes), and a caching allocator left to
itself let free device memory fall 67-78 MB from a Loader's second epoch to its third (batch 32,
H200), so the decoder keeps a few buffers of its own and reuses them: the smallest spare one
that fits, else a new one with ``headroom`` to spare, rounded up to ``rounding`` bytes so that
later batches of about the same size fit into it.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional

import torch

__all__ = ["BufferPool"]


class BufferPool:
    """At most ``keep`` spare uint8 buffers of at most ``max_bytes`` together. Thread-safe."""

    def __init__(self, keep: int, max_bytes: int, headroom: float, rounding: int):
        self.keep, self.max_bytes, self.headroom, self.rounding = keep, max_bytes, headroom, rounding
        self._lock = threading.Lock()
        self._spare: List[torch.Tensor] = []

    @property
    def spare(self) -> List[torch.Tensor]:
        """The buffers kept now (a copy of the list)."""
        with self._lock:
            return list(self._spare)

    def take(self, nbytes: int, allocate: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """A buffer of at least ``nbytes``: the smallest spare one that fits, else
        ``allocate(size)`` of the rounded size with headroom."""
        with self._lock:
            # By position, never by ``list.remove``: that compares tensors with ==, element-wise.
            fitting = [k for k, b in enumerate(self._spare) if b.numel() >= nbytes]
            if fitting:
                return self._spare.pop(min(fitting, key=lambda k: self._spare[k].numel()))
        return allocate(-(-int(nbytes * self.headroom) // self.rounding) * self.rounding)

    def give(self, buffer: Optional[torch.Tensor]) -> None:
        """Keep a finished batch's buffer; beyond ``keep``, the smallest goes, and over
        ``max_bytes`` the largest (a rare huge batch must not stay reserved)."""
        if buffer is None:
            return
        with self._lock:
            self._spare.append(buffer)
            if len(self._spare) > self.keep:
                sizes = [b.numel() for b in self._spare]
                self._spare.pop(sizes.index(min(sizes)))
            while sum(b.numel() for b in self._spare) > self.max_bytes:
                sizes = [b.numel() for b in self._spare]
                self._spare.pop(sizes.index(max(sizes)))

    def clear(self) -> None:
        """Drop every spare buffer (their memory goes back to torch now)."""
        with self._lock:
            self._spare = []
