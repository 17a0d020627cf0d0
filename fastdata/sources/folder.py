"""File-backed sources: ImageFolder, FileList (also from a ``path,label`` list file), and
in-memory encoded bytes. Folder sources hand file paths to the engine, whose native
threads read the files (no GIL, no Python per sample).
"""
from __future__ import annotations

import io
import os
import warnings
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively as torchvision does.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def scan_image_folder(root: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """torchvision's ImageFolder order: sorted class folders -> 0..C-1, then sorted
    ``os.walk`` (links followed) and sorted file names. Returns (classes, [(path, label)]).

    Unlike torchvision, a folder reached again inside one class (a symbolic link loop such
    as ``ln -s . loop``, or a second link to the same folder) is walked once: its files are
    not repeated, and the links skipped are reported in one RuntimeWarning.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: no such folder")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{root}: no class folders found")
    samples: List[Tuple[str, int]] = []
    empty = []
    skipped_links: List[str] = []
    for label, cls in enumerate(classes):
        before = len(samples)
        for dirpath, fnames in _walk_once(os.path.join(root, cls), skipped_links):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), label))
        if len(samples) == before:
            empty.append(cls)
    if skipped_links:
        listed = ", ".join(skipped_links[:8]) + (f" (+{len(skipped_links) - 8} more)" if len(skipped_links) > 8 else "")
        warnings.warn(f"{root}: skipped {len(skipped_links)} folder(s) already scanned through another path "
                      f"(symbolic link loops or repeated links; their images are not repeated): {listed}",
                      RuntimeWarning, stacklevel=3)
    if empty:
        raise FileNotFoundError(f"{root}: no image files ({', '.join(IMG_EXTENSIONS)}) in class folder(s) {empty}")
    return classes, samples


def _walk_once(top: str, skipped_links: List[str]) -> List[Tuple[str, List[str]]]:
    """``sorted(os.walk(top, followlinks=True))`` as (dirpath, filenames), except that a folder
    whose real path was already walked is not entered again (its path goes to ``skipped_links``)."""
    visited = {os.path.realpath(top)}
    found = []
    for dirpath, dirnames, fnames in os.walk(top, followlinks=True):
        keep = []
        for d in sorted(dirnames):
            real = os.path.realpath(os.path.join(dirpath, d))
            if real in visited:
                skipped_links.append(os.path.join(dirpath, d))
            else:
                visited.add(real)
                keep.append(d)
        dirnames[:] = keep  # os.walk (top-down) enters only these
        found.append((dirpath, fnames))
    return sorted(found)


def read_file_list(list_path: str) -> List[Tuple[str, int]]:
    """``path,label`` per line, label an int >= 0; relative paths are relative to the list
    file's folder; blank lines and ``#`` comments are ignored."""
    root = os.path.dirname(os.path.abspath(list_path))
    items: List[Tuple[str, int]] = []
    with open(list_path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{list_path}: not a 'path,label' list file (not UTF-8 text: byte {data[exc.start]:#04x} "
                         f"at offset {exc.start}); pass an ImageFolder root or a list file") from None
    for lineno, line in enumerate(io.StringIO(text, newline=None), 1):  # newlines as open() reads them
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
