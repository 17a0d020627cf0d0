"""CenterCrop(size, resize) vs torchvision's Resize(resize) + CenterCrop(size) on PIL images.

torchvision on PIL resizes with Pillow's BILINEAR (antialiased when reducing). The issue's
bar is PSNR >= 30 dB; measured 50-85 dB (inf for exact sizes). Sizes include a 1600x1200
photo whose 224-of-256 crop spans ~1050 source pixels (>= 2x the output: the engine decodes
at a DCT-reduced scale), upscaling (source smaller than 256), odd sizes and EXIF rotation.
"""
from __future__ import annotations

import numpy as np
import pytest
from torchvision import transforms as T

import fastdata
from imagegen import encode_jpeg, encode_other, photo_like, pillow_oriented, psnr

MIN_PSNR = 30.0


def reference(data: bytes, size, resize: int) -> np.ndarray:
    return np.asarray(T.CenterCrop(size)(T.Resize(resize)(pillow_oriented(data))))


@pytest.mark.parametrize("height,width,orientation", [
    (1200, 1600, None),  # DCT-scaled decode
    (1600, 1200, 6),     # same, stored landscape shown portrait
    (375, 500, None),
    (500, 375, 3),
    (300, 300, None),
    (150, 200, None),    # upscaling
    (97, 131, 8),        # odd, upscaling, rotated
    (256, 400, None),    # shorter side already 256
])
def test_matches_torchvision(height, width, orientation):
    data = encode_jpeg(photo_like(height, width, index=1), orientation=orientation)
    out = fastdata.decode_batch([data], fastdata.CenterCrop(224, resize=256))
    assert out.shape == (1, 224, 224, 3)
    p = psnr(out[0], reference(data, 224, 256))
    assert p >= MIN_PSNR, f"{p:.1f} dB"


@pytest.mark.parametrize("size,resize", [((64, 96), 100), ((96, 64), 100), (56, 64), (32, 160)])
def test_other_sizes(size, resize):
    # non-square crops (torchvision: size=(h, w)); a crop much smaller than the resize
    items = [encode_jpeg(photo_like(h, w, index=i)) for i, (h, w) in enumerate([(240, 320), (320, 240), (111, 333)])]
    out = fastdata.decode_batch(items, fastdata.CenterCrop(size, resize=resize))
    for row, data in enumerate(items):
        p = psnr(out[row], reference(data, size, resize))
        assert p >= MIN_PSNR, f"row {row}: {p:.1f} dB"


def test_default_resize_is_imagenet_ratio():
    assert fastdata.CenterCrop(224).resize_to == 256
    assert fastdata.CenterCrop(224, resize=232).resize_to == 232
    assert fastdata.CenterCrop(224).output_size == (224, 224)
    data = encode_jpeg(photo_like(300, 400))
    a = fastdata.decode_batch([data], fastdata.CenterCrop(224))
    b = fastdata.decode_batch([data], fastdata.CenterCrop(224, resize=256))
    assert np.array_equal(a, b)


def test_no_randomness():
    items = [encode_jpeg(photo_like(200, 260, index=i)) for i in range(3)]
    cc = fastdata.CenterCrop(64, resize=80)
    a = fastdata.decode_batch(items, cc, seed=0, epoch=0)
    for kw in (dict(seed=5), dict(epoch=9), dict(indices=[10, 11, 12])):
        assert np.array_equal(fastdata.decode_batch(items, cc, **kw), a)


def test_fallback_png():
    data = encode_other(photo_like(180, 240, index=2), "PNG")
    out = fastdata.decode_batch([data], fastdata.CenterCrop(128, resize=144))
    assert psnr(out[0], reference(data, 128, 144)) >= MIN_PSNR


def test_spec_validation():
    with pytest.raises(ValueError):
        fastdata.CenterCrop(0)
    with pytest.raises(ValueError):
        fastdata.CenterCrop(224, resize=0)
    with pytest.raises(ValueError):
        fastdata.CenterCrop((224, 224, 3))


@pytest.mark.parametrize("height,width", [(375, 500), (1200, 1600)])
def test_closer_to_exact_crop_than_shifted(height, width):
    # 30 dB alone would accept a crop placed one pixel off; the exact placement must win.
    data = encode_jpeg(photo_like(height, width, index=3))
    out = fastdata.decode_batch([data], fastdata.CenterCrop(224, resize=256))[0]
    resized = np.asarray(T.Resize(256)(pillow_oriented(data)))
    top, left = int(round((resized.shape[0] - 224) / 2)), int(round((resized.shape[1] - 224) / 2))
    exact = psnr(out, resized[top:top + 224, left:left + 224])
    for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        shifted = psnr(out, resized[top + dy:top + dy + 224, left + dx:left + dx + 224])
        assert exact > shifted, f"exact {exact:.1f} dB, shifted by {(dy, dx)} {shifted:.1f} dB"
