"""Shard names as WebDataset writes them: ``train-{000000..001023}.tar`` (a numeric range,
zero-padded when either end is), ``{a,b}`` lists, and several patterns joined by ``::``."""
from __future__ import annotations

import os
import re
from typing import Iterable, List, Union

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


def expand_braces(pattern: str) -> List[str]:
    """Every name ``pattern`` stands for, in order (the leftmost brace varies slowest)."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[:m.start()], m.group(1), pattern[m.end():]
    rng = _RANGE.fullmatch(body)
    if rng is not None:
        lo_s, hi_s = rng.groups()
        lo, hi = int(lo_s), int(hi_s)
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in (lo_s, hi_s))
        width = max(len(lo_s), len(hi_s)) if padded else 0
        step = 1 if hi >= lo else -1
        choices = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    else:
        choices = body.split(",")
    return [head + c + rest for c in choices for rest in expand_braces(tail)]


def expand_urls(urls: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]]) -> List[str]:
    """A list of shard URLs/paths from a pattern (``::``-joined patterns allowed) or a list."""
    if isinstance(urls, (str, os.PathLike)):
        patterns = os.fspath(urls).split("::")
    else:
        patterns = [os.fspath(u) for u in urls]
    out = [name for p in patterns if p for name in expand_braces(p)]
    if not out:
        raise ValueError(f"no shard URLs in {urls!r}")
    return out


def is_local(url: str) -> bool:
    """A plain path or ``file://`` URL (read with the OS, no fsspec filesystem needed)."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def join_url(base: str, name: str) -> str:
    """``name`` relative to the folder of ``base`` (a path or URL); absolute names unchanged."""
    if "://" in name or os.path.isabs(name):
        return name
    if is_local(base):
        return os.path.join(os.path.dirname(os.path.abspath(local_path(base))), name)
    return base.rsplit("/", 1)[0] + "/" + name
