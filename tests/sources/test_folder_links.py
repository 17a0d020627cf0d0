"""ImageFolder scans with symbolic link loops: each folder walked once, no duplicate samples,
the skipped links reported in one warning (#16 item 6). Without the check, ``ln -s . loop``
turned 2 files into 42 samples and two such links made the scan run for minutes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder as TVImageFolder

import fastdata

from repo import ROOT as REPO


def _jpeg(path: Path, i: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(path)


def _tree(root: Path) -> Path:
    _jpeg(root / "a" / "x.jpg", 1)
    _jpeg(root / "a" / "sub" / "y.jpg", 2)
    _jpeg(root / "b" / "z.jpg", 3)
    return root


def test_loops_walked_once_and_reported_once(tmp_path: Path) -> None:
    root = _tree(tmp_path / "data")
    os.symlink(".", root / "a" / "loop")  # a loop (one only: without the check, two never end)
    os.symlink("sub", root / "a" / "alias")  # a second path to a folder of the same class
    os.symlink("../../b", root / "a" / "sub" / "tob")  # another class's folder: walked once in class a
    with pytest.warns(RuntimeWarning, match=r"skipped 2 folder\(s\)") as record:
        folder = fastdata.ImageFolder(str(root))
    assert len(record) == 1
    real = [(os.path.realpath(p), label) for p, label in folder.samples]
    assert len(set(real)) == len(real)  # no file twice within a class
    assert sorted(os.path.relpath(p, root) for p, lab in folder.samples if lab == 0) == \
        ["a/alias/tob/z.jpg", "a/alias/y.jpg", "a/x.jpg"]
    assert [os.path.relpath(p, root) for p, lab in folder.samples if lab == 1] == ["b/z.jpg"]


def test_two_loops_scan_quickly_in_a_child(tmp_path: Path) -> None:
    """Two self-links made torchvision-style walking explode; here the child finishes at once."""
    root = _tree(tmp_path / "data")
    os.symlink(".", root / "a" / "loop1")
    os.symlink(".", root / "a" / "loop2")
    code = ("import sys, warnings, fastdata; warnings.simplefilter('ignore'); "
            "print(len(fastdata.ImageFolder(sys.argv[1]).samples))")
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr[-2000:]


def test_without_links_order_equals_torchvision(tmp_path: Path) -> None:
    root = _tree(tmp_path / "data")
    _jpeg(root / "a" / "sub" / "deeper" / "w.jpg", 4)
    _jpeg(root / "a" / "sub2" / "v.jpg", 5)
    os.symlink(root / "b", root / "c")  # a linked class folder is a class, as in torchvision
    assert fastdata.ImageFolder(str(root)).samples == TVImageFolder(str(root)).samples
