"""The CPU-dispatched paths and their baseline fallbacks produce the same bytes.

Every CPU must give the same output for the same (seed, epoch, index): a run with
FASTDATA_FORCE_SCALAR=1 (scalar resample loops, baseline x86-64 Huffman decoders) is compared
with the default (AVX2/SSSE3 resampling, the BMI2 Huffman decoders, where the CPU has them) in
two fresh processes, over baseline and progressive JPEGs.
"""
import os
import subprocess
import sys

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


def _digest(force_scalar: bool) -> str:
    env = dict(os.environ)
    env["FASTDATA_FORCE_SCALAR"] = "1" if force_scalar else "0"
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}): {done.stderr}")
    return done.stdout.strip()


def test_simd_and_scalar_resample_are_bit_identical():
    simd, scalar = _digest(False), _digest(True)
    assert len(simd) == 64
    assert simd == scalar
