"""Shard name patterns as WebDataset writes them (the ``braceexpand`` rules it uses)."""
from __future__ import annotations

import pytest

from fastdata.sources.shard_urls import expand_braces, expand_urls, join_url


def test_numeric_range_keeps_zero_padding() -> None:
    assert expand_braces("train-{000000..000003}.tar") == [f"train-{i:06d}.tar" for i in range(4)]
    assert expand_braces("s{8..11}.tar") == ["s8.tar", "s9.tar", "s10.tar", "s11.tar"]
    assert expand_braces("s{09..11}") == ["s09", "s10", "s11"]
    assert expand_braces("s{3..1}") == ["s3", "s2", "s1"]


def test_lists_nesting_and_joined_patterns() -> None:
    assert expand_braces("{a,b}-{0..1}.tar") == ["a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"]
    assert expand_urls("x-{0..1}.tar::y.tar") == ["x-0.tar", "x-1.tar", "y.tar"]
    assert expand_urls(["a.tar", "b-{0..1}.tar"]) == ["a.tar", "b-0.tar", "b-1.tar"]
    with pytest.raises(ValueError, match="no shard URLs"):
        expand_urls([])


def test_join_url_relative_to_index() -> None:
    assert join_url("http://h:1/d/index.json", "t-0.tar") == "http://h:1/d/t-0.tar"
    assert join_url("/data/set/index.json", "t-0.tar") == "/data/set/t-0.tar"
    assert join_url("http://h/d/index.json", "s3://b/t.tar") == "s3://b/t.tar"
