"""The memory a multi-scan (progressive) decode may take (#16 item 8).

Progressive JPEGs decode through whole-image coefficient arrays: 128 bytes per 8x8 block of
every component, whatever the crop. A 2 KB progressive CMYK file whose header claims 9459x9459
(just under the pixel limit) made libjpeg allocate and fill ~700 MB per decode thread, and with
strict=False reported no failure. The budget is 64 MiB + 1024 x the file size: a complete
file codes every block's DC coefficient with at least one bit, so it never needs more.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata import _C

import imagegen

from repo import ROOT


def crafted(mode: str = "CMYK", size: int = 9459) -> bytes:
    """A tiny progressive image whose SOF claims ``size`` x ``size``: the scans hold 16x16."""
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (16, 16, len(mode)), dtype=np.uint8), mode)
    return imagegen.patch_sof(imagegen.encode_jpeg(im, progressive=True, quality=75), height=size, width=size)


def test_a_crafted_progressive_file_is_refused_in_decode_batch_and_decode():
    data = crafted()
    assert len(data) < 2200 and fastdata.DEFAULT_MAX_PIXELS > 9459 ** 2  # under the pixel limit
    info = fastdata.probe(data)
    assert (info.width, info.height, info.progressive, info.color_space) == (9459, 9459, True, "cmyk")
    for strict in (False, True):
        out, failures = fastdata.decode_batch([data] * 4, fastdata.RandomResizedCrop(224), threads=4,
                                              on_error="skip", strict=strict)
        assert [f.index for f in failures] == [0, 1, 2, 3]
        assert all("coefficient buffers" in f.reason and "truncated or crafted" in f.reason for f in failures)
        assert out.max() == 0
    with pytest.raises(fastdata.DecodeError, match=r"would need 683 MiB of whole-image coefficient buffers"):
        fastdata.decode(data, strict=False)


def test_the_transcoder_has_the_same_budget():
    with pytest.raises(_C.NativeDecodeError, match="coefficient buffers"):
        _C.transcode_to_baseline(crafted("RGB"), fastdata.DEFAULT_MAX_PIXELS)


def test_a_complete_flat_progressive_image_above_the_floor_still_decodes():
    """The least data per block a real encoder writes (a flat image: ~2 bits per block) is half
    the bound, so a complete file is never refused, however large."""
    im = Image.new("RGB", (4096, 4096), (120, 130, 140))
    data = imagegen.encode_jpeg(im, progressive=True, quality=90, subsampling="4:4:4")
    need = 3 * (4096 // 8) ** 2 * 128
    assert need > 64 << 20  # above the floor: the size-proportional part decides
    assert need / len(data) < 1024
    crop = fastdata.decode_batch([data], fastdata.RandomResizedCrop(64))  # raises if refused
    assert np.abs(crop.astype(int) - (120, 130, 140)).max() <= 2


PEAK_RSS = """
    import json, resource, sys
    import fastdata
    data = open(sys.argv[1], "rb").read()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out, failures = fastdata.decode_batch([data] * 2, fastdata.RandomResizedCrop(224), threads=2, on_error="skip")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"growth_mb": (after - before) / 1024, "failures": len(failures)}))
"""


def test_refusing_it_keeps_the_peak_memory_small(tmp_path):
    """Measured in a fresh process (ru_maxrss is a high-water mark): the old code grew by
    ~700 MB per thread; refused from the header, the decode allocates next to nothing."""
    path = tmp_path / "bomb.jpg"
    path.write_bytes(crafted())
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PEAK_RSS), str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["growth_mb"] < 150, result  # generous: the old code needed ~1400 here
    assert result["failures"] == 2
