"""check_header, the fast tar header check of the shard reader, agrees with tarfile."""
from __future__ import annotations

import tarfile

import numpy as np
import pytest

from fastdata.sources.shard_stream import check_header


def header(fmt: int, name: str = "n01440764_10026.jpg", size: int = 110735) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(fmt, "utf-8", "surrogateescape")[-512:]  # the member's own header block


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_valid_headers_pass_and_sizes_are_checked(fmt: int) -> None:
    block = header(fmt)
    check_header(block, 110735)
    with pytest.raises(ValueError, match="says a 110735-byte file"):
        check_header(block, 110736)


def test_every_single_byte_corruption_is_caught_like_tarfile() -> None:
    block = header(tarfile.USTAR_FORMAT)
    rng = np.random.default_rng(0)
    for pos in range(512):
        bad = bytearray(block)
        bad[pos] ^= int(rng.integers(1, 256))
        try:
            info = tarfile.TarInfo.frombuf(bytes(bad), "utf-8", "surrogateescape")
            tar_ok = info.isfile() and info.size == 110735
        except tarfile.HeaderError:
            tar_ok = False
        try:
            check_header(bytes(bad), 110735)
            ours = True
        except ValueError:
            ours = False
        assert ours == tar_ok, pos


def test_signed_checksum_variant_and_non_files() -> None:
    block = bytearray(header(tarfile.USTAR_FORMAT, name="\u00e9t\u00e9.jpg"))  # bytes > 127 in the name
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)
    block[148:156] = b"%06o\0 " % signed
    check_header(bytes(block), 110735)
    with pytest.raises(ValueError, match="not a regular file"):
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        check_header(d.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"), 0)
    with pytest.raises(ValueError, match="cut off"):
        check_header(header(tarfile.USTAR_FORMAT)[:100], 110735)
