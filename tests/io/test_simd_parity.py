"""The CPU-dispatched paths and their baseline fallbacks produce the same bytes.

Every CPU must give the same output for the same (seed, epoch, index): a run with
FASTDATA_FORCE_SCALAR=1 (scalar resample loops, baseline x86-64 Huffman decoders) is compared
with the default (AVX2/SSSE3 resampling, the BMI2 Huffman decoders, where the CPU has them) in
fresh processes, over baseline and progressive JPEGs; so is FASTDATA_SOFTWARE_BIT_DEPOSIT=1,
the progressive decoder's copy for AMD Zen 1/2 (BMI2 without its pdep). Each copy of the
progressive decoder also runs the libjpeg comparisons of test_fast_huffman.py in a child.
"""
import functools
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = r"""
import hashlib, io, fastdata
from PIL import Image
from fastdata.cli.demo import photo_like_jpeg
data = [photo_like_jpeg(5, i, 300 + 37 * i, 200 + 23 * i) for i in range(10)]
for i in range(4):  # progressive: the refinement scans' bit-deposit and portable versions
    buf = io.BytesIO()
    Image.open(io.BytesIO(data[i])).save(buf, "JPEG", quality=95, progressive=True, subsampling=i % 3)
    data.append(buf.getvalue())
h = hashlib.sha256()
for t in [fastdata.RandomResizedCrop(224), fastdata.RandomResizedCrop(97, scale=(0.01, 1.0)),
          fastdata.CenterCrop(64), fastdata.CenterCrop(301)]:
    h.update(fastdata.decode_batch(data, t, threads=2).tobytes())
print(h.hexdigest())
"""


# The environment that selects each copy of the progressive decoder, by its name.
COPIES = {
    "pdep": {},
    "software-deposit": {"FASTDATA_SOFTWARE_BIT_DEPOSIT": "1"},
    "portable": {"FASTDATA_FORCE_SCALAR": "1"},
}


def _child(args, env_extra, timeout=300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTDATA_FORCE_SCALAR", "FASTDATA_SOFTWARE_BIT_DEPOSIT")}
    env.update(env_extra)
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}): {done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout.strip()


def _copy_in_child(name: str) -> str:
    return _child(["-c", "from fastdata import _C; print(_C.jpeg_info()['progressive_decoder'])"], COPIES[name])


@functools.lru_cache(maxsize=None)
def _available_copies():
    """The copies this CPU can be made to run: all three where its default is pdep; without a
    fast pdep (AMD Zen 1/2) the software deposit and the portable one; without BMI2 the
    portable one alone."""
    default = _copy_in_child("pdep")
    if default == "portable":
        return ["portable"]
    # An AMD Zen 1/2 runs the software deposit by default (its pdep is microcode).
    return ["pdep", "software-deposit", "portable"] if default == "pdep" else ["software-deposit", "portable"]


def test_simd_and_scalar_resample_are_bit_identical():
    digests = {name: _child(["-c", SCRIPT], COPIES[name], timeout=120) for name in _available_copies()}
    assert all(len(d) == 64 for d in digests.values())
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("name", list(COPIES))
def test_each_progressive_copy_decodes_like_libjpeg(name):
    if name not in _available_copies():
        pytest.skip(f"this CPU cannot be made to run the {name!r} copy (its default: {_available_copies()[0]!r})")
    assert _copy_in_child(name) == name
    suite = pathlib.Path(__file__).with_name("test_fast_huffman.py")
    out = _child(["-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite), "-k", "progressive"], COPIES[name])
    summary = out.splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 100, summary  # the progressive cases all ran
