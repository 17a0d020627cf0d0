"""Shared test setup: the ``gpu`` marker decides which tests need CUDA; a few common fixtures.

Without CUDA, Triton kernels run under Triton's interpreter (TRITON_INTERPRET=1, set below).
Test images and Pillow oracles live in tests/imagegen.py (importable as ``imagegen`` because pytest
puts this directory on sys.path for the tests below it).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import List

import pytest

ASSETS = Path(__file__).parent / "assets"


def _cuda_available() -> bool:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return False  # no NVIDIA GPU here: spare every test run torch's slow import
    import torch

    return torch.cuda.is_available()


# Without CUDA, the GPU resampler's Triton kernels (fastdata/decoders/resample_kernels.py) run
# on CPU tensors under Triton's interpreter. Triton reads the variable when a kernel is
# defined, so it is set here, before any test module imports fastdata.
if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"


GPU_DIR = Path(__file__).parent / "gpu"


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """The one place that decides GPU tests: ``@pytest.mark.gpu`` (one CUDA device) or
    ``@pytest.mark.gpu(n)`` (n devices) is skipped where fewer are usable. Tests skip for
    nothing else about CUDA, and every test under tests/gpu must carry the marker."""
    unmarked = [item.nodeid for item in items
                if GPU_DIR in Path(item.path).parents and item.get_closest_marker("gpu") is None]
    if unmarked:
        raise pytest.UsageError(f"tests under tests/gpu need @pytest.mark.gpu: {unmarked}")
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # torch is imported only when a GPU test was collected (it is slow to import)
    import torch

    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in gpu_items:
        marker = item.get_closest_marker("gpu")
        needed = int(marker.args[0]) if marker.args else 1
        if devices < needed:
            reason = "needs a CUDA device" if needed == 1 else f"needs {needed} CUDA devices, found {devices}"
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def assets_dir() -> Path:
    """tests/assets: small checked-in regression files."""
    return ASSETS


@pytest.fixture(scope="session")
def damaged_dir() -> Path:
    """tests/assets/damaged: tiny damaged files (see its README.txt)."""
    return ASSETS / "damaged"
