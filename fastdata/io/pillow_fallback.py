"""Decoding of non-JPEG images (PNG, WebP, GIF, BMP, TIFF, PPM/PGM) with Pillow.

Runs on the Python side because native threads never call Python; the pixels then go
through the same native crop/resize/flip as JPEGs.

Only the raster formats in ``FALLBACK_FORMATS`` are opened. Pillow knows many more, and
some run other programs on the sample's bytes (EPS/PS through Ghostscript's ``gs`` found on
PATH) or are rarely exercised plugins (DDS, ...): a dataset file or a crafted cache record
must never reach them. Anything else is "not a supported image format".
"""
from __future__ import annotations

import io
import warnings
from typing import Union

import numpy as np
from PIL import Image, ImageOps

from ..errors import DecodeError

# Pillow format names: plain raster formats decoded in-process by Pillow's own or its
# bundled libraries (PPM covers .ppm/.pgm, which torchvision's ImageFolder lists).
FALLBACK_FORMATS = ("PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM")


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
            im_file = Image.open(io.BytesIO(data), formats=FALLBACK_FORMATS)
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
        raise DecodeError("not a supported image format (JPEG, or one of "
                          f"{', '.join(FALLBACK_FORMATS)} through Pillow)") from None
    except Exception as e:  # noqa: BLE001 - any plugin failure (even NotImplementedError) is this sample's
        raise DecodeError(f"Pillow could not decode it: {type(e).__name__}: {e}") from None
    if arr.ndim != 3 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise DecodeError(f"decoded to an empty image {arr.shape}")
    return np.ascontiguousarray(arr)
