"""fastdata's Huffman decoder (csrc/core/huffman.cpp) against libjpeg-turbo's own.

The oracle is libjpeg-turbo itself: the same file decoded with ``_C._set_fast_huffman(False)``.
Both produce the same DCT coefficients, so every pixel must be identical, for whole images,
fused crops and skipped rows, and for damaged data in non-strict mode. A counter shows where
the fast decoder took over (baseline scans, with or without restart markers) and where it
must not (progressive).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata import _C

import imagegen as ig


@pytest.fixture
def huffman_switch():
    """Yields a function decode_both(fn) -> (fast result, libjpeg result); restores the switch."""
    was = _C._set_fast_huffman(True)

    def both(fn):
        _C._set_fast_huffman(True)
        before = _C._fast_huffman_scans()
        fast = fn()
        used = _C._fast_huffman_scans() - before
        _C._set_fast_huffman(False)
        ref = fn()
        _C._set_fast_huffman(True)
        return fast, ref, used

    yield both
    _C._set_fast_huffman(was)


def _cases():
    photo = ig.photo_like(75, 97, index=3)
    for sub in ("4:4:4", "4:2:2", "4:2:0"):
        for q in (30, 90, 100):
            yield f"{sub}-q{q}", ig.encode_jpeg(photo, quality=q, subsampling=sub)
    yield "gray", ig.encode_jpeg(photo.convert("L"))
    yield "cmyk", ig.encode_jpeg(photo.convert("CMYK"))
    yield "optimized-tables", ig.encode_jpeg(photo, quality=95, optimize=True)
    yield "1x1", ig.encode_jpeg(ig.photo_like(1, 1))
    yield "odd-17x9", ig.encode_jpeg(ig.photo_like(9, 17), subsampling="4:2:0")
    # Noise at quality 100: long codes and large values, the table lookup's slow paths.
    noise = np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    yield "noise-q100", ig.encode_jpeg(Image.fromarray(noise), quality=100, subsampling="4:4:4")
    yield "ff-bytes", ig.encode_jpeg(Image.new("RGB", (64, 48), (255, 255, 255)), quality=100)
    # Restart markers (camera JPEGs): every MCU, every few MCUs, every MCU row; DC resets.
    yield "restart-1", ig.encode_jpeg(photo, restart_blocks=1, subsampling="4:4:4")
    yield "restart-3-420", ig.encode_jpeg(photo, restart_blocks=3, subsampling="4:2:0")
    yield "restart-rows", ig.encode_jpeg(photo, restart_rows=1, quality=100)
    yield "restart-gray", ig.encode_jpeg(photo.convert("L"), restart_blocks=5)


CASES = list(_cases())


@pytest.mark.parametrize("name,data", CASES, ids=[c[0] for c in CASES])
def test_full_decode_is_bit_identical(huffman_switch, name, data):
    fast, ref, used = huffman_switch(lambda: _C.decode_full(data, True, 0))
    assert used == 1, "the fast decoder should take baseline scans"
    np.testing.assert_array_equal(fast[0], ref[0])
    assert fast[1] == ref[1] == 0


@pytest.mark.parametrize("name,data", CASES, ids=[c[0] for c in CASES])
def test_fused_crops_are_bit_identical(huffman_switch, name, data):
    # Crops that start below the top row go through libjpeg's row skipping (decode_mcu(NULL)).
    datas = [data] * 16
    rrc = fastdata.RandomResizedCrop(32)

    def run():
        return fastdata.decode_batch(datas, rrc, seed=7, epoch=1, threads=2)

    fast, ref, used = huffman_switch(run)
    assert used == 16
    np.testing.assert_array_equal(fast, ref)


def test_not_used_for_progressive(huffman_switch):
    data = ig.encode_jpeg(ig.photo_like(64, 80), progressive=True)
    fast, ref, used = huffman_switch(lambda: _C.decode_full(data, True, 0))
    assert used == 0
    np.testing.assert_array_equal(fast[0], ref[0])


def _damaged():
    src = ig.encode_jpeg(ig.photo_like(96, 128, index=1), quality=92)
    for seed in range(12):
        yield f"corrupt-{seed}", ig.corrupt_entropy(src, seed=seed, count=4 + 6 * seed)
    for frac in (0.02, 0.3, 0.7, 0.97, 0.999):
        yield f"truncated-{frac}", ig.truncate_scan(src, frac)
    # A marker in the middle of the scan (an RST without a restart interval), then garbage
    # before EOI, and a file that ends right after its last entropy byte.
    start = ig.sos_offset(src)
    mid = start + (len(src) - start) // 2
    yield "stray-marker", src[:mid] + b"\xff\xd3" + src[mid:]
    yield "garbage-before-eoi", src[:-2] + b"\x12\x34\x56" + src[-2:]
    yield "no-eoi", src[:-2]
    # Restart markers: damage inside an interval, a lost marker, a wrong marker number, a
    # file cut mid-interval. libjpeg's own marker reader resynchronises in both decoders.
    rst, third = _restart_file()
    for seed in range(4):
        yield f"restart-corrupt-{seed}", ig.corrupt_entropy(rst, seed=seed, count=3 + 8 * seed)
    yield "restart-lost-marker", rst[:third] + rst[third + 2:]
    yield "restart-wrong-number", rst[:third + 1] + bytes([0xD0 + (rst[third + 1] - 0xD0 + 3) % 8]) + rst[third + 2:]
    yield "restart-truncated", ig.truncate_scan(rst, 0.5)


def _restart_file():
    """A JPEG with a restart marker every 4 MCUs, and the offset of one a third of the way in."""
    rst = ig.encode_jpeg(ig.photo_like(96, 128, index=5), quality=92, restart_blocks=4)
    at = [i for i in range(ig.sos_offset(rst), len(rst) - 1) if rst[i] == 0xFF and 0xD0 <= rst[i + 1] <= 0xD7]
    return rst, at[len(at) // 3]


DAMAGED = list(_damaged())


@pytest.mark.parametrize("name,data", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_damaged_data_decodes_like_libjpeg(huffman_switch, name, data):
    """Non-strict: the same pixels (or the same error), and a warning wherever libjpeg warns."""
    def run():
        try:
            return _C.decode_full(data, False, 0)
        except _C.NativeDecodeError as e:  # e.g. a byte stuffing 0x00 overwritten: a bad marker
            return None, str(e)

    fast, ref, _ = huffman_switch(run)
    if ref[0] is None:
        assert fast == ref
        return
    np.testing.assert_array_equal(fast[0], ref[0])
    assert (fast[1] > 0) == (ref[1] > 0), (fast[1], ref[1])


@pytest.mark.parametrize("name,data", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_damaged_data_strict_raises_like_libjpeg(huffman_switch, name, data):
    def run():
        try:
            _C.decode_full(data, True, 0)
            return "ok"
        except _C.NativeDecodeError:
            return "error"

    fast, ref, _ = huffman_switch(run)
    assert fast == ref


def test_valid_image_right_after_damaged_one(huffman_switch):
    """Per-thread decoder state (bit buffer, DC predictors, tables) does not leak."""
    good = ig.encode_jpeg(ig.photo_like(40, 56, index=9))
    bad = ig.truncate_scan(ig.encode_jpeg(ig.photo_like(40, 56, index=2), subsampling="4:4:4"), 0.4)

    def run():
        _C.decode_full(bad, False, 0)
        return _C.decode_full(good, True, 0)

    fast, ref, _ = huffman_switch(run)
    np.testing.assert_array_equal(fast[0], ref[0])


@pytest.mark.parametrize("extra", [1, 2, 7, 8])
def test_bytes_before_eoi_always_warn(huffman_switch, extra):
    """Bytes between the scan's last MCU and EOI are garbage. libjpeg notices them only when
    they lie past its bit buffer's read-ahead (so a file may or may not warn); fastdata gives
    back every whole byte it read ahead and did not use, so they always warn."""
    src = ig.encode_jpeg(ig.photo_like(48, 64, index=4))
    data = src[:-2] + bytes(range(1, extra + 1)) + src[-2:]
    _C._set_fast_huffman(True)
    pixels, warnings = _C.decode_full(data, False, 0)
    assert warnings >= 1
    np.testing.assert_array_equal(pixels, _C.decode_full(src, True, 0)[0])
    with pytest.raises(_C.NativeDecodeError, match="extraneous bytes"):
        _C.decode_full(data, True, 0)


def test_bytes_before_restart_marker_always_warn(huffman_switch):
    """The same rule at a restart marker: libjpeg drops whole bytes left in its bit buffer
    there without a word; fastdata hands them to libjpeg's marker reader, which warns."""
    rst, third = _restart_file()
    data = rst[:third] + b"\x01\x02\x03" + rst[third:]
    fast, ref, used = huffman_switch(lambda: _C.decode_full(data, False, 0))
    assert used == 1
    np.testing.assert_array_equal(fast[0], ref[0])
    assert fast[1] >= 1
    with pytest.raises(_C.NativeDecodeError, match="extraneous bytes"):
        _C.decode_full(data, True, 0)


@pytest.mark.parametrize("fill", [1, 3])
def test_fill_bytes_before_restart_marker_are_not_data(huffman_switch, fill):
    """0xFF fill bytes may precede any marker (JPEG B.1.1.2): libjpeg's marker reader skips
    them without a warning. FastHuffman takes the expected RSTn itself when nothing but the
    marker follows an interval's data; fill bytes must not change that, nor the pixels."""
    rst, third = _restart_file()
    data = rst[:third] + b"\xff" * fill + rst[third:]
    fast, ref, used = huffman_switch(lambda: _C.decode_full(data, True, 0))
    assert used == 1
    np.testing.assert_array_equal(fast[0], ref[0])
    np.testing.assert_array_equal(fast[0], _C.decode_full(rst, True, 0)[0])
    assert fast[1] == ref[1] == 0


@pytest.mark.parametrize("restart_rows", [0, 1])
def test_missing_eoi_fails_a_strict_crop_only_if_libjpeg_does(huffman_switch, restart_rows):
    """A file cut right before EOI: this reader looks further ahead than libjpeg's, but the
    end of the data counts only where libjpeg itself reads on to it, so a strict crop that
    stops short of the end never fails where libjpeg's decoder would have passed it."""
    src = ig.encode_jpeg(ig.photo_like(120, 160, index=3), quality=75, subsampling="4:2:0",
                         restart_rows=restart_rows)
    data = src[:-2]
    rrc = fastdata.RandomResizedCrop(32)

    def failed_seeds():
        return {seed for seed in range(60)
                if fastdata.decode_batch([data], rrc, seed=seed, strict=True, on_error="skip", threads=1)[1]}

    fast, ref, used = huffman_switch(failed_seeds)
    assert used > 0
    assert ref, "some crops reach the end of the data"
    assert fast <= ref
    lenient = huffman_switch(lambda: fastdata.decode_batch([data] * 8, rrc, seed=3, strict=False, threads=1))
    np.testing.assert_array_equal(lenient[0], lenient[1])


def _marker_every_mcu():
    """A JPEG with a restart marker after every MCU (as fastdata-convert writes them), the
    offsets of its markers, and of one in the middle."""
    rst = ig.encode_jpeg(ig.photo_like(64, 96, index=6), quality=92, restart_blocks=1, subsampling="4:2:0")
    at = [i for i in range(ig.sos_offset(rst), len(rst) - 1) if rst[i] == 0xFF and 0xD0 <= rst[i + 1] <= 0xD7]
    return rst, at, at[len(at) // 2]


def _damaged_near_markers():
    """Damage where the reader meets a marker, at every byte of its 8-byte read-ahead window:
    the refill that takes the data, the marker and the zeros after it in one step must do
    what the byte-by-byte reader (and libjpeg) does."""
    rst, at, mid = _marker_every_mcu()
    start = at[at.index(mid) - 1] + 2  # the interval that mid ends
    for back in range(0, min(20, mid - start)):  # a stray marker 0..19 bytes before the real one
        yield f"stray-marker-{back}", rst[:mid - back] + b"\xff\xd5" + rst[mid - back:]
    for cut in range(1, min(10, mid - start)):  # the interval cut short by 1..9 bytes
        yield f"interval-cut-{cut}", rst[:mid - cut] + rst[mid:]
    for back in (0, 1, 3, 6, 7):  # a stuffed 0xFF (data) or a fill byte close before the marker
        yield f"stuffed-{back}", rst[:mid - back] + b"\xff\x00" + rst[mid - back:]
        yield f"fill-{back}", rst[:mid - back] + b"\xff" + rst[mid - back:]
    yield "marker-lost", rst[:mid] + rst[mid + 2:]
    yield "marker-renumbered", rst[:mid + 1] + bytes([0xD0 + (rst[mid + 1] - 0xD0 + 5) % 8]) + rst[mid + 2:]
    yield "eoi-early", rst[:mid] + b"\xff\xd9"


NEAR_MARKERS = list(_damaged_near_markers())


@pytest.mark.parametrize("name,data", NEAR_MARKERS, ids=[c[0] for c in NEAR_MARKERS])
def test_damage_near_a_marker_every_mcu_decodes_like_libjpeg(huffman_switch, name, data):
    """Whole decodes and fused crops: libjpeg's pixels and warnings, or both fail; strict
    decodes fail where libjpeg's do (the message may name another count of extraneous bytes:
    fastdata counts every byte it read ahead and did not use, see the module docstring)."""
    def run():
        try:
            pixels, warnings = _C.decode_full(data, False, 0)
            lenient = (pixels, warnings > 0)
        except _C.NativeDecodeError as e:
            lenient = (None, str(e))
        try:
            _C.decode_full(data, True, 0)
            strict = "ok"
        except _C.NativeDecodeError:
            strict = "error"
        crops, failed = fastdata.decode_batch([data] * 6, fastdata.RandomResizedCrop(24), seed=1, strict=False,
                                              on_error="skip", threads=1)
        return lenient, strict, crops, list(failed)

    fast, ref, used = huffman_switch(run)
    assert used > 0
    if ref[0][0] is None:
        assert fast[0] == ref[0]
    else:
        np.testing.assert_array_equal(fast[0][0], ref[0][0])
        assert fast[0][1] == ref[0][1]
    assert fast[1] == ref[1]
    np.testing.assert_array_equal(fast[2], ref[2])
    assert fast[3] == ref[3]


def _scan_with_stuffed_ff(index_from: int = 0) -> Tuple[bytes, int]:
    """A baseline JPEG and the offset of a stuffed 0xFF (FF 00) inside its entropy-coded data."""
    for index in range(index_from, index_from + 50):
        data = ig.encode_jpeg(ig.photo_like(64, 96, index=index))
        sos = data.index(b"\xff\xda")
        start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
        at = data.find(b"\xff\x00", start)
        if 0 <= at < len(data) - 4:
            return data, at
    raise AssertionError("no stuffed 0xFF in 50 photo-like JPEGs")


@pytest.mark.parametrize("fill", [1, 5])
def test_fill_bytes_before_a_stuffed_zero_are_corrupt_data(huffman_switch, fill):
    """FF .. FF 00 inside the entropy-coded data is not valid JPEG (fill bytes go before
    markers only). FastHuffman reads the run as one data 0xFF, as libjpeg's byte reader does,
    and warns: libjpeg-turbo itself decoded such a run to pixels that match neither reading
    (the fuzz regression fill-bytes-before-stuffed-zero), so there is no reference to match,
    and strict mode fails the file. The same data with the single FF 00 decodes clean."""
    src, at = _scan_with_stuffed_ff()
    data = src[:at] + b"\xff" * fill + src[at:]
    _C._set_fast_huffman(True)
    pixels, warnings = _C.decode_full(data, False, 0)
    assert warnings >= 1
    np.testing.assert_array_equal(pixels, _C.decode_full(src, True, 0)[0])
    with pytest.raises(_C.NativeDecodeError, match=f"{fill} extraneous bytes before marker 0x00"):
        _C.decode_full(data, True, 0)
    assert _C.decode_full(src, True, 0)[1] == 0
