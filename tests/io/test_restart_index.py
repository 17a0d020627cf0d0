"""Restart-indexed JPEGs (csrc/core/restart_index.*, FastHuffman::use_restart_index).

``transcode_restart_indexed`` rewrites a JPEG losslessly with restart markers and an APP15
index of where each restart interval starts; a crop decode of such a file entropy-decodes
only the intervals the crop needs. The oracle for every crop is the same restart-marked
file with the index segment removed: libjpeg's sequential path (today's decode), which
reads every interval from the top. Pixels must be identical, and the interior of a region
must equal the full decode's pixels (the region's one-pixel border is where libjpeg's own
crop edge handling may differ from a full decode, with or without the index).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

import fastdata
from fastdata import _C

import imagegen as ig

INTERVALS = [0, 1, 2, 4]  # 0: one restart interval per MCU row


def strip_index(data: bytes) -> bytes:
    """The same file without fastdata's APP15 restart index (restart markers kept)."""
    for marker, pos, length in ig.segments(data):
        if marker == 0xEF and data[pos + 4:pos + 17] == b"fastdata-rst\0":
            return data[:pos] + data[pos + 2 + length:]
    raise AssertionError("no restart index segment")


def index_segment(data: bytes) -> tuple:
    """(offset of the segment's 0xFF, its length field)."""
    for marker, pos, length in ig.segments(data):
        if marker == 0xEF:
            return pos, length
    raise AssertionError("no restart index segment")


def source(sub: str, h: int, w: int, index: int = 3) -> bytes:
    img = ig.photo_like(h, w, index=index)
    if sub == "gray":
        return ig.encode_jpeg(img.convert("L"))
    if sub == "4:4:0":
        pytest.importorskip("cv2")
        return ig.opencv_jpeg(img, sub)
    return ig.encode_jpeg(img, subsampling=sub)


SUBSAMPLINGS = ["4:4:4", "4:2:2", "4:2:0", "4:4:0", "gray"]
SIZES = [(75, 97), (129, 211), (17, 9), (8, 8), (1, 1)]


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("sub", SUBSAMPLINGS)
def test_rewrite_is_lossless_and_indexed(sub, interval):
    for h, w in SIZES:
        src = source(sub, h, w)
        out = _C.transcode_restart_indexed(src, 0, interval)
        assert fastdata.probe(out).restart_indexed
        assert not fastdata.probe(src).restart_indexed
        assert fastdata.probe(out).subsampling == fastdata.probe(src).subsampling
        np.testing.assert_array_equal(fastdata.decode(out), fastdata.decode(src))
        # Restart markers are in the data: one fewer than the index has intervals.
        rst = sum(1 for i in range(ig.sos_offset(out), len(out) - 1)
                  if out[i] == 0xFF and 0xD0 <= out[i + 1] <= 0xD7)
        count = struct.unpack("<I", out[index_segment(out)[0] + 4 + 16:][:4])[0]
        assert rst == count - 1


def _regions(H: int, W: int, rng: np.random.Generator):
    """Regions touching every edge, every start row near the MCU row boundaries, and random ones."""
    yield 0, 0, W, H
    yield 0, 0, W, 1
    yield 0, H - 1, W, H
    yield 0, 0, 1, H
    yield W - 1, 0, W, H
    for y0 in range(0, H, max(1, H // 40)):
        yield W // 3, y0, W, H
        yield 0, y0, max(1, W // 2), min(H, y0 + 5)
    for _ in range(25):
        x0, y0 = int(rng.integers(0, W)), int(rng.integers(0, H))
        yield x0, y0, int(rng.integers(x0 + 1, W + 1)), int(rng.integers(y0 + 1, H + 1))


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("sub", SUBSAMPLINGS)
def test_region_decode_matches_sequential_decode(sub, interval):
    rng = np.random.default_rng(hash((sub, interval)) % 2**32)
    jumps = _C._restart_index_jumps()
    for h, w in SIZES[:3]:
        indexed = _C.transcode_restart_indexed(source(sub, h, w), 0, interval)
        plain = strip_index(indexed)
        for denom in (1, 2, 4, 8):
            full = _C._decode_region(plain, denom, 0, 0, 1 << 20, 1 << 20, True)[0]
            H, W = full.shape[:2]
            for x0, y0, x1, y1 in _regions(H, W, rng):
                got, warnings = _C._decode_region(indexed, denom, x0, y0, x1, y1, True)
                ref = _C._decode_region(plain, denom, x0, y0, x1, y1, True)[0]
                assert warnings == 0
                np.testing.assert_array_equal(got, ref, err_msg=f"{h}x{w} 1/{denom} region {(x0, y0, x1, y1)}")
                np.testing.assert_array_equal(got[1:-1, 1:-1], full[y0 + 1:y1 - 1, x0 + 1:x1 - 1])
    assert _C._restart_index_jumps() > jumps, "the indexed path was never taken"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_fused_crops_match_for_every_orientation(orientation):
    oriented = ig.photo_like(150, 203, index=orientation)
    for sub in ("4:2:0", "4:4:4"):
        src = ig.encode_oriented(oriented, orientation, subsampling=sub)
        indexed = _C.transcode_restart_indexed(src, 0, 2)
        assert fastdata.probe(indexed).orientation == orientation
        plain = strip_index(indexed)
        for transform in (fastdata.RandomResizedCrop(48), fastdata.RandomResizedCrop(160),
                          fastdata.CenterCrop(64, resize=80)):
            jumps = _C._restart_index_jumps()
            got = fastdata.decode_batch([indexed] * 24, transform, seed=orientation, indices=range(24), threads=2)
            used = _C._restart_index_jumps() - jumps
            ref = fastdata.decode_batch([plain] * 24, transform, seed=orientation, indices=range(24), threads=2)
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_array_equal(
                ref, fastdata.decode_batch([src] * 24, transform, seed=orientation, indices=range(24), threads=2))
            if isinstance(transform, fastdata.RandomResizedCrop):
                assert used > 0


def _as_version_1(data: bytes) -> bytes:
    """A stride-1 index rewritten in version 1's layout (no stride field), as caches written
    before version 2 hold it."""
    pos, length = index_segment(data)
    body = data[pos + 4:pos + 2 + length]
    assert body[13] == 2 and struct.unpack("<H", body[24:26])[0] == 1
    v1 = body[:13] + b"\x01" + body[14:24] + body[26:]
    return data[:pos] + b"\xff\xef" + struct.pack(">H", len(v1) + 2) + v1 + data[pos + 2 + length:]


@pytest.mark.parametrize("interval", [1, 2, 3])
@pytest.mark.parametrize("stride", [1, 3, 8, 1000, "version-1"])
def test_every_index_stride_gives_the_sequential_pixels(interval, stride):
    """The index gives every stride-th interval's start; a jump to one in between reads the
    restart markers from the indexed start before it. Version 1's dense layout still reads."""
    rng = np.random.default_rng(interval)
    src = source("4:2:0", 129, 211)
    indexed = _C.transcode_restart_indexed(src, 0, interval, 1 if stride == "version-1" else stride)
    if stride == "version-1":
        indexed = _as_version_1(indexed)
    assert fastdata.probe(indexed).restart_indexed
    plain = strip_index(indexed)
    jumps = _C._restart_index_jumps()
    for x0, y0, x1, y1 in _regions(129, 211, rng):
        got, warnings = _C._decode_region(indexed, 1, x0, y0, x1, y1, True)
        assert warnings == 0
        np.testing.assert_array_equal(got, _C._decode_region(plain, 1, x0, y0, x1, y1, True)[0],
                                      err_msg=f"stride {stride} region {(x0, y0, x1, y1)}")
    assert _C._restart_index_jumps() > jumps


def test_sparse_index_is_smaller():
    src = source("4:2:0", 129, 211)
    sizes = {stride: index_segment(_C.transcode_restart_indexed(src, 0, 1, stride))[1] for stride in (1, 8)}
    # 126 intervals: 125 varints densely, 15 with an entry every 8; 26 bytes of fixed fields.
    assert sizes[8] - 26 < (sizes[1] - 26) / 3, sizes
    with pytest.raises(ValueError, match="index_stride"):
        _C.transcode_restart_indexed(src, 0, 1, 0)


def test_full_decode_reads_every_interval():
    src = source("4:2:0", 129, 211)
    indexed = _C.transcode_restart_indexed(src, 0, 1)
    jumps = _C._restart_index_jumps()
    np.testing.assert_array_equal(fastdata.decode(indexed), fastdata.decode(src))
    assert _C._restart_index_jumps() == jumps


def test_rewrite_replaces_an_existing_index():
    once = _C.transcode_restart_indexed(source("4:2:0", 75, 97), 0, 1)
    twice = _C.transcode_restart_indexed(once, 0, 4)
    assert sum(1 for m, _, _ in ig.segments(twice) if m == 0xEF) == 1
    np.testing.assert_array_equal(fastdata.decode(twice), fastdata.decode(once))


# ---- damaged records: a DecodeError or libjpeg's own behaviour, never a crash or other pixels ----

def _indexed_with_offsets():
    indexed = _C.transcode_restart_indexed(source("4:2:0", 129, 211), 0, 1)
    scan = ig.sos_offset(indexed)
    rst = [i for i in range(scan, len(indexed) - 1) if indexed[i] == 0xFF and 0xD0 <= indexed[i + 1] <= 0xD7]
    return indexed, scan, rst


def _crop_bottom(data: bytes):
    """A crop of the lower right part: every interval above it is jumped over."""
    return _C._decode_region(data, 1, 150, 100, 211, 129, False)


def _damaged_records():
    indexed, scan, rst = _indexed_with_offsets()
    pos, length = index_segment(indexed)
    deltas = pos + 4 + 13 + 1 + 2 + 4 + 4 + 2  # first varint delta (version 2: after the stride)
    # A wrong offset: the first delta one byte longer (the others shift with it).
    b = bytearray(indexed)
    b[deltas] = (b[deltas] & 0x80) | ((b[deltas] & 0x7F) + 1) % 128
    yield "wrong-offset", bytes(b)
    # A truncated interval: bytes cut out of the middle of the scan (offsets after it are off).
    mid = rst[len(rst) // 3] - 20
    yield "truncated-interval", indexed[:mid] + indexed[mid + 7:]
    # A missing restart marker.
    at = rst[len(rst) // 2]
    yield "missing-marker", indexed[:at] + indexed[at + 2:]

    # A wrong marker number (rst[j] ends interval j). The index gives every 8th interval's
    # start; _crop_bottom jumps to the first cropped MCU of MCU rows 6..8 (column 150 // 16,
    # 14 MCUs a row, one MCU an interval), reading the markers from the indexed start before.
    def renumbered(j):
        return indexed[:rst[j] + 1] + bytes([0xD0 + (indexed[rst[j] + 1] - 0xD0 + 3) % 8]) + indexed[rst[j] + 2:]
    assert len(rst) + 1 == 14 * 9
    yield "wrong-marker-number", renumbered(8 * 13 - 1)  # before an indexed start: the index check sees it
    yield "wrong-marker-on-jump-path", renumbered(6 * 14 + 9 - 2)  # read on the way to the row-6 jump
    yield "wrong-marker-unread", renumbered(20)  # in row 1, which the crop never reads
    # The record cut short: the scan ends before the index says.
    yield "cut-short", indexed[:rst[-5] + 5]
    # The index's count or scan size wrong.
    b = bytearray(indexed)
    b[pos + 4 + 16] += 1
    yield "wrong-count", bytes(b)
    b = bytearray(indexed)
    b[pos + 4 + 20] ^= 0x04
    yield "wrong-scan-size", bytes(b)


DAMAGED = list(_damaged_records())
# Damage the index check sees: the crop fails. The others make the segment unreadable, so
# the file decodes as a plain restart-marked one (libjpeg's path).
MUST_FAIL = {"wrong-offset", "truncated-interval", "missing-marker", "wrong-marker-number",
             "wrong-marker-on-jump-path", "cut-short"}
# Damage in bytes the crop never reads: the crop is the undamaged record's.
UNREAD = {"wrong-marker-unread"}


@pytest.mark.parametrize("name,data", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_index_or_record_fails_cleanly(name, data):
    try:
        pixels = _crop_bottom(data)[0]
    except _C.NativeDecodeError as e:
        assert "restart index" in str(e)
        pixels = None
    good, _, _ = _indexed_with_offsets()
    if name in MUST_FAIL:
        assert pixels is None, f"{name}: a damaged indexed record must fail its crop decode"
    elif name in UNREAD:
        assert fastdata.probe(data).restart_indexed
        np.testing.assert_array_equal(pixels, _crop_bottom(strip_index(good))[0])
    elif pixels is not None:
        assert not fastdata.probe(data).restart_indexed
        np.testing.assert_array_equal(pixels, _crop_bottom(strip_index(data) if fastdata.probe(data).restart_indexed
                                                           else data)[0])
    # The next record on the same thread decodes exactly: nothing carries over.
    np.testing.assert_array_equal(_crop_bottom(good)[0], _crop_bottom(strip_index(good))[0])
    # A full decode never uses the index: libjpeg's own behaviour on the damaged data.
    try:
        _C.decode_full(data, False, 0)
    except _C.NativeDecodeError:
        pass


def test_damaged_record_in_a_batch_is_that_sample_error():
    good, _, _ = _indexed_with_offsets()
    bad = dict(DAMAGED)["missing-marker"]
    rrc = fastdata.RandomResizedCrop(32, scale=(0.05, 0.1))  # never the whole image: the index is used
    with pytest.raises(fastdata.DecodeError, match="restart index"):
        fastdata.decode_batch([good, bad], rrc, threads=2)
    out = fastdata.decode_batch([good, good], rrc, threads=2)
    np.testing.assert_array_equal(out, fastdata.decode_batch([strip_index(good)] * 2, rrc, threads=2))


def test_malformed_index_segment_is_ignored():
    indexed, _, _ = _indexed_with_offsets()
    pos, length = index_segment(indexed)
    b = bytearray(indexed)
    b[pos + 4 + 13] = 99  # an unknown version: not fastdata's index, libjpeg decodes as ever
    data = bytes(b)
    assert not fastdata.probe(data).restart_indexed
    jumps = _C._restart_index_jumps()
    np.testing.assert_array_equal(_crop_bottom(data)[0], _crop_bottom(strip_index(indexed))[0])
    assert _C._restart_index_jumps() == jumps


def test_libjpeg_huffman_ignores_the_index():
    indexed, _, _ = _indexed_with_offsets()
    was = _C._set_fast_huffman(False)
    try:
        jumps = _C._restart_index_jumps()
        got = _crop_bottom(indexed)[0]
        assert _C._restart_index_jumps() == jumps
    finally:
        _C._set_fast_huffman(was)
    np.testing.assert_array_equal(got, _crop_bottom(indexed)[0])


def _dht_segments(data: bytes) -> list:
    return [data[pos:pos + 2 + length] for m, pos, length in ig.segments(data) if m == 0xC4]


def test_standard_tables_are_kept_and_optimized_ones_rewritten():
    # Sources with libjpeg's standard tables keep them (records share their lookup tables);
    # a source with its own tables gets optimized ones. Pixels are the source's either way.
    a = _C.transcode_restart_indexed(ig.encode_jpeg(ig.photo_like(75, 97, index=1)), 0, 4)
    b = _C.transcode_restart_indexed(ig.encode_jpeg(ig.photo_like(129, 211, index=2)), 0, 4)
    assert _dht_segments(a) == _dht_segments(b)
    src = ig.encode_jpeg(ig.photo_like(75, 97, index=1), optimize=True)
    c = _C.transcode_restart_indexed(src, 0, 4)
    assert _dht_segments(c) != _dht_segments(a)
    np.testing.assert_array_equal(fastdata.decode(c), fastdata.decode(src))
    plain = strip_index(c)
    for region in [(10, 20, 60, 70), (50, 40, 97, 75)]:
        np.testing.assert_array_equal(_C._decode_region(c, 1, *region, True)[0],
                                      _C._decode_region(plain, 1, *region, True)[0])
