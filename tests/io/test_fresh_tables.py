"""Every image decodes as if by a fresh decoder: no DQT/DHT tables carried over.

libjpeg keeps quantization and Huffman tables from one image to the next on a reused
decompressor (its "abbreviated datastream" feature). fastdata reuses one decoder per
thread, so before the fix a file without DQT decoded with the previous image's tables,
and a file without DHT with the previous image's custom codes: the output depended on what
the thread had decoded before, hence on thread count and input order.

The oracle is a fresh decode (the first image a new engine sees) and, for the standard
Huffman tables, the original file they were stripped from.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastdata
from imagegen import encode_jpeg, photo_like, segments

WHOLE = fastdata.CenterCrop((48, 64), resize=48)


def strip_segments(data: bytes, marker: int) -> bytes:
    """``data`` without any header segment of this marker (DQT 0xDB, DHT 0xC4)."""
    cuts = [(pos, pos + 2 + length) for m, pos, length in segments(data) if m == marker]
    if not cuts:
        raise ValueError(f"no segment 0x{marker:02X} to strip")
    out, last = bytearray(), 0
    for start, end in cuts:
        out += data[last:start]
        last = end
    return bytes(out + data[last:])


@pytest.fixture(scope="module")
def standard_tables() -> bytes:
    """Baseline with the standard Huffman tables (Pillow without optimize)."""
    return encode_jpeg(photo_like(48, 64, index=3), quality=85)


@pytest.fixture(scope="module")
def custom_tables() -> bytes:
    """Another image, with its own Huffman tables and other quantization tables."""
    return encode_jpeg(photo_like(48, 64, index=9, seed=5), quality=30, optimize=True)


def test_missing_dqt_fails_after_another_image_too(standard_tables, custom_tables):
    no_dqt = strip_segments(standard_tables, 0xDB)
    with pytest.raises(fastdata.DecodeError, match="Quantization table"):
        fastdata.decode(no_dqt)
    fastdata.decode(custom_tables)
    with pytest.raises(fastdata.DecodeError, match="Quantization table"):
        fastdata.decode(no_dqt)
    with pytest.raises(fastdata.DecodeError, match="Quantization table"):
        fastdata.decode(no_dqt, strict=False)


def test_missing_dht_gets_the_standard_tables_after_another_image(standard_tables, custom_tables):
    no_dht = strip_segments(standard_tables, 0xC4)
    expected = fastdata.decode(standard_tables)
    np.testing.assert_array_equal(fastdata.decode(no_dht), expected)
    fastdata.decode(custom_tables)  # leaves its own Huffman tables on a reused decoder
    np.testing.assert_array_equal(fastdata.decode(no_dht), expected)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_batch_does_not_depend_on_order_or_threads(standard_tables, custom_tables, threads):
    """The adversarial test's case: the same inputs in other orders and thread counts."""
    no_dht = strip_segments(standard_tables, 0xC4)
    no_dqt = strip_segments(custom_tables, 0xDB)
    kinds = [custom_tables, no_dht, no_dqt, standard_tables] * 3
    # The oracle for each row: a batch of that one file alone, on a new engine's first decode.
    alone = {id(k): fastdata.decode_batch([k], WHOLE, threads=1, on_error="skip") for k in set(kinds)}
    for order in (kinds, kinds[::-1]):
        out, failures = fastdata.decode_batch(order, WHOLE, threads=threads, on_error="skip")
        failed = {f.index for f in failures}
        for i, item in enumerate(order):
            expected_out, expected_failures = alone[id(item)]
            assert (i in failed) == bool(expected_failures), f"row {i}"
            if item is no_dqt:
                assert i in failed, "a file without DQT must fail, whatever was decoded before"
            else:
                np.testing.assert_array_equal(out[i], expected_out[0])
