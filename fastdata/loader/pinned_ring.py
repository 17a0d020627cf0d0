"""PinnedRing: the host batches a Loader writes into, allocated once and reused.

A slot is one batch: images [B, H, W, 3] (uint8, or the output's float type when the native
threads normalize) and labels int64 [B], pinned when CUDA is usable so host-to-device copies are
DMA transfers (~4x faster than pageable memory, and truly asynchronous).

A slot is handed out again only when nothing can still read it:

* a CUDA copy that reads it has finished (``reader`` event, recorded on the copy stream);
* nobody outside the ring holds its memory. CPU outputs *are* slots (the native threads
  write the tensor the user receives, no extra copy), so a user who keeps a batch keeps the
  slot's storage; the ring then forgets that slot and allocates a replacement rather than
  overwrite what the user holds. In steady state (the training loop drops each batch before
  asking for the next ``prefetch``) no allocation happens at all.

Pinned CPU outputs are the exception to recycling: a user may start
``x.cuda(non_blocking=True)`` and drop ``x`` at once, leaving a DMA in flight that no
reference count shows. Those slots come fresh from torch's caching host allocator for every
batch (what DataLoader's ``pin_memory`` does): it records an event for every asynchronous
copy out of a block and reuses the block only after it, and in steady state it serves every
request from its cache (no ``cudaHostAlloc``, no page faults).

Everything here runs on the Loader's producer thread, except ``close``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

# The ring's own references to a slot's storage: the slot tensor, plus the temporary Python
# storage object that asking for the count creates.
_RING_REFS = 2


def storage_refs(t: torch.Tensor) -> Optional[int]:
    """How many tensors/arrays share ``t``'s storage (``t`` included), or None when this torch
    does not expose the count (then callers must assume the storage is shared)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return None
    return int(use_count(t.untyped_storage()._cdata)) - (_RING_REFS - 1)


def engine_array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as the native engine's ``out`` (Engine.run): its numpy view, a bfloat16
    tensor's as its bits in uint16 (numpy has no bfloat16; torch.uint16 needs torch 2.3, so
    through int16)."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


@dataclass
class Slot:
    """One batch of host memory. ``images``: [B, H, W, 3] ``image_dtype``; ``labels``: int64 [B]."""

    index: int
    images: torch.Tensor
    labels: torch.Tensor
    reader: Any = None  # CUDA event after the last copy that reads this slot, or None

    def native_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of ``images`` as the native engine takes them (engine_array)."""
        return engine_array(self.images[start:stop])


class PinnedRing:
    """``n_slots`` batch buffers [batch_size, h, w, 3] of ``image_dtype`` plus int64 labels.

    ``acquire`` returns the next slot in round-robin order once it is safe to overwrite
    (see the module docstring). ``allocations`` counts buffers allocated since creation:
    ``n_slots`` at start, more only for handed-out slots: pinned ones every batch (from
    torch's host cache), pageable ones when the caller still holds the slot's tensors.
    """

    def __init__(self, n_slots: int, batch_size: int, hw: Tuple[int, int], *, image_dtype: torch.dtype = torch.uint8,
                 pin: Optional[bool] = None, handed_out: bool = False):
        if n_slots < 1 or batch_size < 1:
            raise ValueError(f"need n_slots >= 1 and batch_size >= 1, got {n_slots}, {batch_size}")
        if image_dtype not in (torch.uint8, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"image_dtype must be uint8, float32, float16 or bfloat16, got {image_dtype}")
        self.shape = (int(batch_size), int(hw[0]), int(hw[1]), 3)
        self.image_dtype = image_dtype
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        # handed_out: slots become the caller's outputs (CPU device), not private staging.
        self.handed_out = bool(handed_out)
        self.allocations = 0
        self._slots: List[Slot] = [self._new_slot(k) for k in range(n_slots)]
        self._next = 0

    def _new_slot(self, k: int) -> Slot:
        self.allocations += 1
        images = torch.empty(self.shape, dtype=self.image_dtype, pin_memory=self.pin)
        labels = torch.empty(self.shape[0], dtype=torch.int64, pin_memory=self.pin)
        return Slot(k, images, labels)

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def nbytes(self) -> int:
        """Host memory the ring holds now."""
        return sum(s.images.nbytes + s.labels.nbytes for s in self._slots)

    def acquire(self) -> Slot:
        """The next slot, safe to overwrite. Blocks (host) only on the slot's CUDA copy event."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.reader is not None:
            # The copy that reads this slot was enqueued prefetch batches ago; it is almost
            # always done, and this wait is on the producer thread, never the training thread.
            slot.reader.synchronize()
            slot.reader = None
        if self.handed_out and (self.pin or self._held_outside(slot)):
            slot = self._slots[slot.index] = self._new_slot(slot.index)
        return slot

    @staticmethod
    def _held_outside(slot: Slot) -> bool:
        refs = (storage_refs(slot.images), storage_refs(slot.labels))
        return any(r is None or r > 1 for r in refs)

    def close(self) -> None:
        """Drop the ring's buffers (tensors a caller still holds stay valid)."""
        for slot in self._slots:
            if slot.reader is not None:
                slot.reader.synchronize()
        self._slots = []
