"""What an encoded image is to fastdata: a path or a buffer of bytes, and how a JPEG starts.

No dependency on the native extension, so sources and tools can use it without ``_C``.
"""
from __future__ import annotations

from typing import Union

import numpy as np

__all__ = ["Item", "JPEG_SIGNATURE", "is_jpeg"]

# One encoded image: a file path (read by the native threads without the GIL) or the encoded
# bytes in anything with the buffer protocol (uint8 numpy arrays included).
Item = Union[str, bytes, bytearray, memoryview, np.ndarray]

# SOI marker plus the first byte of the next marker: what csrc/core/decoder.h
# (looks_like_jpeg) takes for a JPEG; anything else goes to the Pillow fallback.
JPEG_SIGNATURE = b"\xff\xd8\xff"


def is_jpeg(data: Union[bytes, bytearray, memoryview]) -> bool:
    """True when ``data`` starts with the JPEG signature (the native decoder's test)."""
    return bytes(data[:3]) == JPEG_SIGNATURE
