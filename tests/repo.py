"""The repository as tests see it: its root, and its example scripts as modules.

Tests import ``ROOT`` instead of counting parent directories, so a test file can move.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_example(name: str) -> ModuleType:
    """examples/<name>.py loaded as a module (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"fastdata_example_{name}", ROOT / "examples" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load examples/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
