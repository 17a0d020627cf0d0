"""The GPU decoders the tests run, each skipped where its package is missing (importable as
``gpu_params`` from any test, like ``imagegen``)."""
from __future__ import annotations

import pytest

from fastdata.decoders.dali import dali_available
from fastdata.decoders.nvimgcodec import gpu_extra_installed

needs_dali = pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed (pip install fastdata[dali])")
needs_gpu_extra = pytest.mark.skipif(not gpu_extra_installed(),
                                     reason="nvImageCodec is not installed (pip install fastdata[gpu])")

# Decoders that take every row they accept (the hybrid split is tested on its own).
GPU_BACKENDS = ["nvjpeg", pytest.param("dali", marks=needs_dali), pytest.param("gpu", marks=needs_gpu_extra)]
