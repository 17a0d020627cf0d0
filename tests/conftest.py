"""Shared test setup: GPU tests skip themselves without CUDA; a few common fixtures.

Test images and Pillow oracles live in tests/imagegen.py (importable as ``imagegen`` because pytest
puts this directory on sys.path for the tests below it).
"""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

ASSETS = Path(__file__).parent / "assets"


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests when no CUDA device is usable."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # torch is imported only when a GPU test was collected (it is slow to import)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def assets_dir() -> Path:
    """tests/assets: small checked-in regression files."""
    return ASSETS


@pytest.fixture(scope="session")
def damaged_dir() -> Path:
    """tests/assets/damaged: tiny damaged files (see its README.txt)."""
    return ASSETS / "damaged"
