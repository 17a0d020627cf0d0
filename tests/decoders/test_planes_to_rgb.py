"""gpu_resize.planes_to_rgb: the JPEG engines' planar YCbCr to RGB, against libjpeg itself.

The oracle: libjpeg's own component planes of a file (``_C._decode_planes``, raw data out) go
through the kernel, and the result must equal libjpeg's RGB of the same file (``fastdata.decode``:
fancy upsampling, ISLOW, fixed-point color conversion) byte for byte, at every subsampling the
conversion takes, odd sizes included. Runs on CUDA, else under Triton's interpreter.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import _C
from fastdata.decoders.gpu_resize import ImageLayout, planar_bytes, planes_to_rgb
from fastdata.cli.demo import photo_like_jpeg

from imagegen import opencv_jpeg

CODE = {name: code for code, name in enumerate(_C.SUBSAMPLING_NAMES)}  # subsampling name -> plan code

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def jpeg(subsampling: str, width: int, height: int, seed: int) -> bytes:
    img = Image.open(io.BytesIO(photo_like_jpeg(seed, seed, max(8, width), max(8, height)))).convert("RGB")
    img = img.resize((width, height))
    # Saturated corners: the conversion's clipping at 0 and 255 is exercised too.
    a = np.asarray(img).copy()
    a[: max(1, height // 4), : max(1, width // 4)] = (255, 0, 255)
    a[-max(1, height // 4):, -max(1, width // 4):] = (0, 255, 0)
    img = Image.fromarray(a)
    if subsampling == "gray":
        buf = io.BytesIO()
        img.convert("L").save(buf, "JPEG", quality=90)
        return buf.getvalue()
    if subsampling == "4:4:0":
        return opencv_jpeg(img, "4:4:0")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


def packed_planes(datas, subsamplings):
    """Every file's libjpeg planes packed one after another (planar_bytes each, 64-byte aligned
    starts), their offsets, and the files' sizes."""
    chunks, bases, sizes, at = [], [], [], 0
    for data, sub in zip(datas, subsamplings):
        planes = _C._decode_planes(data)
        assert len(planes) == (1 if sub == "gray" else 3)
        h, w = planes[0].shape
        flat = np.concatenate([p.reshape(-1) for p in planes])
        assert flat.size == planar_bytes([h], [w], [CODE[sub]])[0], (sub, [p.shape for p in planes])
        pad = -at % 64
        chunks += [np.zeros(pad, np.uint8), flat]
        bases.append(at + pad)
        at += pad + flat.size
        sizes.append((h, w))
    return np.concatenate(chunks), np.asarray(bases, np.int64), sizes


CASES = [("4:2:0", 64, 48), ("4:2:0", 33, 17), ("4:2:2", 47, 31), ("4:4:4", 40, 24), ("4:4:0", 35, 29),
         ("gray", 37, 21), ("4:2:0", 127, 93),
         # chroma 1 or 2 samples wide, where libjpeg replicates instead of filtering, and 3 wide
         ("4:2:0", 1, 1), ("4:2:0", 2, 3), ("4:2:2", 1, 5), ("4:2:2", 4, 6), ("4:2:0", 5, 7), ("4:2:0", 6, 9),
         ("4:4:0", 5, 1)]


def test_equals_libjpeg_rgb_at_each_subsampling_and_odd_size():
    cases, datas = [], []
    for k, (sub, w, h) in enumerate(CASES):
        try:
            datas.append(jpeg(sub, w, h, k))
        except ImportError:  # no OpenCV to write 4:4:0 files: the other cases still run
            continue
        cases.append((sub, w, h))
    assert len(cases) >= len(CASES) - 3
    subs = [sub for sub, _, _ in cases]
    assert [fastdata.probe(d).subsampling for d in datas] == subs
    planes, bases, sizes = packed_planes(datas, subs)
    layout = ImageLayout.packed(sizes, chw=False, align=256)
    rgb = torch.full((layout.nbytes(),), 7, dtype=torch.uint8, device=DEVICE)
    planes_to_rgb(torch.from_numpy(planes).to(DEVICE), bases, rgb, layout, [CODE[s] for s in subs])
    got = rgb.cpu().numpy()
    for k, data in enumerate(datas):
        h, w = sizes[k]
        want = np.asarray(fastdata.decode(data))
        image = got[layout.base[k]: layout.base[k] + h * w * 3].reshape(h, w, 3)
        assert np.array_equal(image, want), (cases[k], int(np.abs(image.astype(int) - want).max()),
                                             int((image != want).sum()))


def test_a_wrong_chroma_filter_is_caught():
    # The oracle can fail: the same 4:2:0 planes converted as if 4:2:2 (other filter, other plane
    # sizes) give other RGB.
    data = jpeg("4:2:0", 64, 48, 3)
    planes, bases, sizes = packed_planes([data], ["4:2:0"])
    layout = ImageLayout.packed(sizes, chw=False)
    rgb = torch.zeros(layout.nbytes(), dtype=torch.uint8, device=DEVICE)
    planes = torch.from_numpy(np.concatenate([planes, np.zeros(4096, np.uint8)])).to(DEVICE)
    planes_to_rgb(planes, bases, rgb, layout, [CODE["4:2:2"]])
    assert not np.array_equal(rgb.cpu().numpy().reshape(48, 64, 3), np.asarray(fastdata.decode(data)))


def test_refuses_what_it_cannot_convert():
    layout = ImageLayout.packed([(4, 4)], chw=False)
    rgb = torch.zeros(layout.nbytes(), dtype=torch.uint8, device=DEVICE)
    planes = torch.zeros(24, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="4:1:1"):
        planes_to_rgb(planes, [0], rgb, layout, [CODE["4:1:1"]])
    with pytest.raises(ValueError, match="outside the planes"):
        planes_to_rgb(planes[:10], [0], rgb, layout, [CODE["4:2:0"]])
    with pytest.raises(ValueError, match="packed HWC"):
        planes_to_rgb(planes, [0], torch.zeros(64, dtype=torch.uint8, device=DEVICE),
                      ImageLayout.packed([(4, 4)], chw=True), [CODE["4:2:0"]])
    with pytest.raises(ValueError, match="subsamplings"):
        planes_to_rgb(planes, [0, 0], rgb, layout, [CODE["4:2:0"]])
