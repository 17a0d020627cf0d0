"""The writer's error type (readers raise fastdata.cache.format.CacheFormatError)."""
from __future__ import annotations


class ConvertError(RuntimeError):
    """The conversion stopped; the message names the file or the problem."""
