"""Decoding of non-JPEG images (PNG, WebP, GIF, BMP, ...) with Pillow.

Runs on the Python side because native threads never call Python; the pixels then go
through the same native crop/resize/flip as JPEGs.
"""
from __future__ import annotations

import io
import warnings
from typing import Union

import numpy as np
from PIL import Image, ImageOps

from ..errors import DecodeError


def decode_with_pillow(data: Union[bytes, memoryview, np.ndarray], max_pixels: int) -> np.ndarray:
    """uint8 RGB [H, W, 3] with EXIF orientation applied; DecodeError on anything wrong.

    ``data`` is the encoded bytes: files are read by the engine (fastdata.io.engine.read_file's
    rules), never opened here."""
    if isinstance(data, str):
        raise TypeError("decode_with_pillow takes encoded bytes, not a path")
    data = bytes(memoryview(data).cast("B"))
    if not data:
        raise DecodeError("empty input (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Our own max_pixels governs; Pillow's 1x-limit warning would only repeat it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im_file = Image.open(io.BytesIO(data))
        with im_file as im:
            if max_pixels and im.width * im.height > max_pixels:
                raise DecodeError(f"image is {im.width}x{im.height} = {im.width * im.height} pixels, above the "
                                  f"limit of {max_pixels} (decompression bomb guard; raise max_pixels to allow it)")
            im = ImageOps.exif_transpose(im)
            rgb = im.convert("RGB")
            arr = np.asarray(rgb)
    except DecodeError:
        raise
    except Image.UnidentifiedImageError:
        raise DecodeError("not a recognised image format (neither JPEG nor any format Pillow reads)") from None
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise DecodeError(f"Pillow could not decode it: {e}") from None
    if arr.ndim != 3 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise DecodeError(f"decoded to an empty image {arr.shape}")
    return np.ascontiguousarray(arr)
