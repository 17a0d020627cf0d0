"""File-backed sources: ImageFolder, FileList (also from a ``path,label`` list file), and
in-memory encoded bytes. Folder sources hand file paths to the engine, whose native
threads read the files (no GIL, no Python per sample).
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively as torchvision does.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def scan_image_folder(root: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """torchvision's ImageFolder order: sorted class folders -> 0..C-1, then sorted
    ``os.walk`` (links followed) and sorted file names. Returns (classes, [(path, label)])."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: no such folder")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{root}: no class folders found")
    samples: List[Tuple[str, int]] = []
    empty = []
    for label, cls in enumerate(classes):
        before = len(samples)
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), label))
        if len(samples) == before:
            empty.append(cls)
    if empty:
        raise FileNotFoundError(f"{root}: no image files ({', '.join(IMG_EXTENSIONS)}) in class folder(s) {empty}")
    return classes, samples


def read_file_list(list_path: str) -> List[Tuple[str, int]]:
    """``path,label`` per line, label an int >= 0; relative paths are relative to the list
    file's folder; blank lines and ``#`` comments are ignored."""
    root = os.path.dirname(os.path.abspath(list_path))
    items: List[Tuple[str, int]] = []
    with open(list_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            path, sep, label = line.rpartition(",")
            try:
                value = int(label)
            except ValueError:
                value = -1
            if not sep or not path or value < 0:
                raise ValueError(f"{list_path}:{lineno}: expected 'path,label' with an integer label >= 0, got {line!r}")
            items.append((path if os.path.isabs(path) else os.path.normpath(os.path.join(root, path)), value))
    if not items:
        raise ValueError(f"{list_path}: no entries")
    return items


def _check_labels(labels: Sequence[int]) -> np.ndarray:
    arr = np.asarray(labels, dtype=np.int64)
    if arr.ndim != 1 or (len(arr) and arr.min() < 0):
        raise ValueError("labels must be a 1-D sequence of non-negative integers")
    return arr


class FileList:
    """Images at ``paths`` with integer ``labels``; ``classes`` default to "0".."max"."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int], classes: Optional[Sequence[str]] = None):
        if len(paths) != len(labels):
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        self.paths: List[str] = [os.fspath(p) for p in paths]
        self._labels = _check_labels(labels)
        n_classes = int(self._labels.max()) + 1 if len(self._labels) else 0
        self.classes: List[str] = list(classes) if classes is not None else [str(k) for k in range(n_classes)]
        if len(self.classes) < n_classes:
            raise ValueError(f"{len(self.classes)} class names for labels up to {n_classes - 1}")

    @classmethod
    def from_csv(cls, list_path: str) -> "FileList":
        """Read a ``path,label`` list file (see read_file_list)."""
        items = read_file_list(list_path)
        return cls([p for p, _ in items], [lab for _, lab in items])

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def name(self, index: int) -> str:
        return self.paths[index]

    def fetch(self, indices: Sequence[int]) -> List[str]:
        paths = self.paths
        return [paths[i] for i in indices]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} images, {len(self.classes)} classes)"


class ImageFolder(FileList):
    """torchvision.datasets.ImageFolder's samples, classes and labels, read natively.

    ``.samples`` is [(path, label)], ``.classes`` the sorted class folder names,
    ``.class_to_idx`` their labels.
    """

    def __init__(self, root: Union[str, os.PathLike]):
        self.root = os.fspath(root)
        classes, samples = scan_image_folder(self.root)
        super().__init__([p for p, _ in samples], [lab for _, lab in samples], classes)
        self.samples = samples
        self.class_to_idx = {c: k for k, c in enumerate(classes)}


class BytesSource:
    """Encoded images already in memory (bytes, memoryview or uint8 arrays)."""

    def __init__(self, buffers: Sequence[Union[bytes, memoryview, np.ndarray]], labels: Sequence[int],
                 classes: Optional[Sequence[str]] = None):
        if len(buffers) != len(labels):
            raise ValueError(f"{len(buffers)} buffers but {len(labels)} labels")
        self.buffers = list(buffers)
        self._labels = _check_labels(labels)
        n_classes = int(self._labels.max()) + 1 if len(self._labels) else 0
        self.classes: List[str] = list(classes) if classes is not None else [str(k) for k in range(n_classes)]

    def __len__(self) -> int:
        return len(self.buffers)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def name(self, index: int) -> str:
        return f"<bytes #{index}>"

    def fetch(self, indices: Sequence[int]) -> list:
        buffers = self.buffers
        return [buffers[i] for i in indices]
