"""What a conversion reads: an ImageFolder tree or a ``path,label`` list file, as a Plan
(input paths and labels in output order), and the check that DST is not inside SRC."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from ...sources.folder import read_file_list, scan_image_folder
from .. import format as cf
from ..errors import ConvertError


@dataclass
class Plan:
    """What to convert: ``items[k] = (path relative to root, label)`` in output order."""

    root: str
    kind: str  # "folder" | "list"
    classes: List[str]
    items: List[Tuple[str, int]]

    def abspath(self, k: int) -> str:
        return os.path.join(self.root, self.items[k][0])

    def fingerprint(self, options: Dict[str, Any]) -> str:
        h = hashlib.sha256(cf.dumps({"classes": self.classes, "kind": self.kind, "options": options}))
        for rel, label in self.items:
            h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + str(label).encode() + b"\n")
        return h.hexdigest()


def scan_folder(root: str) -> Plan:
    """ImageFolder order (fastdata.sources.folder.scan_image_folder), paths relative to root."""
    try:
        classes, samples = scan_image_folder(root)
    except FileNotFoundError as e:
        raise ConvertError(str(e)) from None
    items = [(os.path.relpath(path, root), label) for path, label in samples]
    return Plan(root=os.path.abspath(root), kind="folder", classes=classes, items=items)


def read_list(list_path: str) -> Plan:
    """A ``path,label`` list file (fastdata.sources.folder.read_file_list); classes "0".."max"."""
    root = os.path.dirname(os.path.abspath(list_path))
    try:
        entries = read_file_list(list_path)
    except ValueError as e:
        raise ConvertError(str(e)) from None
    items = [(os.path.relpath(p, root), lab) for p, lab in entries]
    classes = [str(k) for k in range(max(lab for _, lab in items) + 1)]
    return Plan(root=root, kind="list", classes=classes, items=items)


def scan(src: str) -> Plan:
    if os.path.isdir(src):
        return scan_folder(src)
    if os.path.isfile(src):
        return read_list(src)
    raise ConvertError(f"{src}: no such folder or list file")


def check_destination(src: str, dst: str) -> None:
    """Refuse a DST inside the SRC folder: the cache would become a class folder of SRC (no
    images in it), after which ImageFolder(SRC) and every later conversion of SRC fail."""
    if not os.path.isdir(src):
        return
    src_real, dst_real = os.path.realpath(src), os.path.realpath(dst)
    if os.path.commonpath([src_real, dst_real]) == src_real:
        raise ConvertError(f"{dst}: the destination is inside the source folder {src}; "
                           f"write the cache outside it")
