"""fastdata: image training input fast enough that the GPU never waits.

Heavy modules (torch, lmdb) load on first use, so ``import fastdata`` stays cheap and
``fastdata.decode`` works without torch.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "DecodeError": "fastdata.errors",
    "BatchDecodeError": "fastdata.errors",
    "RandomResizedCrop": "fastdata.io.transforms",
    "CenterCrop": "fastdata.io.transforms",
    "ImageInfo": "fastdata.io.decoding",
    "probe": "fastdata.io.decoding",
    "decode": "fastdata.io.decoding",
    "decode_batch": "fastdata.io.decoding",
    "DEFAULT_MAX_PIXELS": "fastdata.io.decoding",
    "DEFAULT_MAX_FILE_BYTES": "fastdata.io.decoding",
    "Engine": "fastdata.io.engine",
    "Source": "fastdata.sources.base",
    "ImageFolder": "fastdata.sources.folder",
    "FileList": "fastdata.sources.folder",
    "BytesSource": "fastdata.sources.folder",
    "LMDBSource": "fastdata.sources.lmdb",
    "RAMCache": "fastdata.sources.ram",
    "TarShards": "fastdata.sources.tar_shards",
    "ShardSampleError": "fastdata.sources.shard_stream",
    "RAMBudgetError": "fastdata.sources.ram",
    "CacheFormatError": "fastdata.cache.format",
    "Loader": "fastdata.loader.loader",
    "IMAGENET_MEAN": "fastdata.io.normalization",
    "IMAGENET_STD": "fastdata.io.normalization",
    "StallMeter": "fastdata.diagnostics.stall",
    "profile": "fastdata.diagnostics.stall",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return __all__
