"""The package layout is the architecture: imports only point down the layers, and the
decode layer (fastdata.io) never imports torch.

    cli  ->  loader, cache.build  ->  decoders, sources, diagnostics  ->  io, cache  ->  errors, _C

(cache is the format the reader in sources and the writer share; cache.build, the writer,
decodes through io and scans folders through sources, so it sits above both.)

Every import statement of every module is checked (module level and inside functions).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional, Tuple

import fastdata

PACKAGE = Path(fastdata.__file__).resolve().parent

# Lower numbers are lower layers; a module may import its own subpackage and lower layers.
LAYERS = {"errors": 0, "_C": 0, "io": 1, "cache": 1, "decoders": 2, "sources": 2, "diagnostics": 2,
          "loader": 3, "cache.build": 3, "cli": 4}


def modules() -> Iterator[Tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(["fastdata"] + parts), path


def imported(module: str, path: Path) -> Iterator[Tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or target in ("fastdata",):  # "from . import x": x may be a module
                for alias in node.names:
                    yield node.lineno, f"{target}.{alias.name}"
            else:
                yield node.lineno, target


def layer_of(module: str) -> Optional[str]:
    """The layer of a fastdata module: the longest entry of LAYERS that names its subpackage
    (cache.build inside cache), else its top subpackage; None for fastdata itself."""
    parts = module.split(".")
    if parts[0] != "fastdata" or len(parts) < 2:
        return None
    if ".".join(parts[1:3]) in LAYERS:
        return ".".join(parts[1:3])
    return parts[1]


def _is_module(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists()


def test_every_module_belongs_to_a_layer():
    unknown = {layer_of(m) for m, _ in modules()} - set(LAYERS) - {None}
    assert not unknown, f"modules outside the layer table: {unknown}"


def test_imports_point_down():
    upward = []
    for module, path in modules():
        here = layer_of(module)
        if here is None:
            continue  # fastdata/__init__.py: the public names, imported lazily
        for line, target in imported(module, path):
            there = layer_of(target)
            if target == "fastdata.__version__":
                continue  # a constant of the package (whose names are imported lazily)
            if target == "fastdata" or (there is not None and there not in LAYERS and not _is_module(there)):
                there = "cli"  # the public package (or a name in it) pulls in every layer: tools only
            if there is None or there == here:
                continue
            if there not in LAYERS or LAYERS[there] >= LAYERS[here]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}) imports {target}")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def test_io_never_imports_torch():
    for module, path in modules():
        if layer_of(module) != "io":
            continue
        for line, target in imported(module, path):
            assert target.split(".")[0] != "torch", f"{path}:{line} imports {target}"
    code = ("import sys, fastdata, fastdata.io.decoding, fastdata.io.engine, fastdata.io.pillow_fallback; "
            "fastdata.decode; fastdata.probe; fastdata.decode_batch; fastdata.RandomResizedCrop; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
