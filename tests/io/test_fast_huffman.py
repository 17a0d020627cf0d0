"""fastdata's Huffman decoder (csrc/core/huffman.cpp, huffman_progressive.cpp) against
libjpeg-turbo's own.

The oracle is libjpeg-turbo itself: the same file decoded with ``_C._set_fast_huffman(False)``.
Both produce the same DCT coefficients, so every pixel must be identical, for whole images,
fused crops and skipped rows, and for damaged data in non-strict mode. Counters show where
the fast decoder took over: baseline scans (with or without restart markers), and every scan
of a progressive file (whatever its scan script: libjpeg's own encoder writes the scripts,
``_C._encode_progressive``).
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


def _scans(data: bytes) -> int:
    """SOS markers: entropy-coded data never holds FF DA (an FF there is followed by 00 or an
    RSTn), nor do these test files' headers."""
    return data.count(b"\xff\xda")


def _script(components: int, *bands):
    """A scan script: DC of every component interleaved, then each (Ss, Se, Ah, Al) band for
    each component; a band with Ss == 0 is a DC refinement (interleaved)."""
    out = []
    for ss, se, ah, al in bands:
        if ss == 0:
            out.append((list(range(components)), 0, 0, ah, al))
        else:
            out.extend(([c], ss, se, ah, al) for c in range(components))
    return out


def _progressive_cases():
    photo = ig.photo_like(75, 97, index=3)
    for sub in ("4:4:4", "4:2:2", "4:2:0"):
        for q in (30, 90, 100):
            yield f"pillow-{sub}-q{q}", ig.encode_jpeg(photo, quality=q, subsampling=sub, progressive=True)
    yield "pillow-gray", ig.encode_jpeg(photo.convert("L"), progressive=True)
    yield "pillow-cmyk", ig.encode_jpeg(photo.convert("CMYK"), progressive=True)  # four components
    yield "pillow-1x1", ig.encode_jpeg(ig.photo_like(1, 1), progressive=True)
    yield "pillow-odd-17x9", ig.encode_jpeg(ig.photo_like(9, 17), progressive=True)
    noise = np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    yield "pillow-noise-q100", ig.encode_jpeg(Image.fromarray(noise), quality=100, subsampling="4:4:4",
                                              progressive=True)
    yield "pillow-restart-3", ig.encode_jpeg(photo, progressive=True, restart_blocks=3)
    yield "pillow-restart-rows", ig.encode_jpeg(photo, progressive=True, restart_rows=1)
    rgb = np.asarray(photo)
    gray = np.asarray(photo.convert("L"))[:, :, None]
    # Scan scripts Pillow does not write, from libjpeg's own encoder: spectral selection
    # alone; successive approximation three bits deep in DC and AC; a band split with
    # refinements; DC refined per component; restart intervals of 1 and 2 MCUs; gray.
    spectral = [([0, 1, 2], 0, 0, 0, 0)] + _script(3, (1, 5, 0, 0), (6, 20, 0, 0), (21, 63, 0, 0))[1:]
    deep = [([0, 1, 2], 0, 0, 0, 3)] + _script(3, (1, 63, 0, 3))[1:] + [([0, 1, 2], 0, 0, 3, 2)] + \
        _script(3, (1, 63, 3, 2))[1:] + [([0, 1, 2], 0, 0, 2, 1)] + _script(3, (1, 63, 2, 1))[1:] + \
        [([0, 1, 2], 0, 0, 1, 0)] + _script(3, (1, 63, 1, 0))[1:]
    split = [([0, 1, 2], 0, 0, 0, 1), ([0], 1, 9, 0, 2), ([0], 10, 63, 0, 1), ([1], 1, 63, 0, 0),
             ([2], 1, 63, 0, 0), ([0], 1, 9, 2, 1), ([0], 1, 63, 1, 0), ([0, 1, 2], 0, 0, 1, 0)]
    dc_apart = [([0], 0, 0, 0, 1), ([1], 0, 0, 0, 1), ([2], 0, 0, 0, 1), ([0], 1, 63, 0, 1), ([1], 1, 63, 0, 0),
                ([2], 1, 63, 0, 0), ([0], 0, 0, 1, 0), ([1, 2], 0, 0, 1, 0), ([0], 1, 63, 1, 0)]
    for name, script in (("spectral", spectral), ("deep", deep), ("split", split), ("dc-apart", dc_apart)):
        for q in (50, 95):
            yield f"script-{name}-q{q}", _C._encode_progressive(rgb, q, script)
    yield "script-deep-restart-1", _C._encode_progressive(rgb, 90, deep, restart_interval=1)
    yield "script-split-restart-2", _C._encode_progressive(rgb, 90, split, restart_interval=2)
    yield "script-gray-deep", _C._encode_progressive(gray, 90, [([0], 0, 0, 0, 2), ([0], 1, 63, 0, 2),
                                                               ([0], 0, 0, 2, 1), ([0], 1, 63, 2, 1),
                                                               ([0], 0, 0, 1, 0), ([0], 1, 63, 1, 0)])
    yield "script-noise-deep", _C._encode_progressive(noise, 100, deep)


PROGRESSIVE = list(_progressive_cases())


@pytest.fixture
def progressive_switch(huffman_switch):
    """As huffman_switch, counting the progressive scans the fast decoder took instead."""
    def both(fn):
        before = _C._fast_progressive_scans()
        fast, ref, _ = huffman_switch(fn)
        return fast, ref, _C._fast_progressive_scans() - before
    return both


def test_progressive_switch_leaves_baseline_scans_alone():
    """_set_fast_progressive(False), the A/B switch of the progressive decoder alone: libjpeg
    decodes progressive files (the same pixels), baseline scans keep the fast decoder."""
    progressive = ig.encode_jpeg(ig.photo_like(40, 56, index=1), progressive=True)
    baseline = ig.encode_jpeg(ig.photo_like(40, 56, index=1))
    was = _C._set_fast_progressive(False)
    try:
        p0, b0 = _C._fast_progressive_scans(), _C._fast_huffman_scans()
        off = _C.decode_full(progressive, True, 0)
        _C.decode_full(baseline, True, 0)
        assert _C._fast_progressive_scans() == p0
        assert _C._fast_huffman_scans() == b0 + 1
    finally:
        assert _C._set_fast_progressive(was) is False
    on = _C.decode_full(progressive, True, 0)
    assert _C._fast_progressive_scans() == p0 + _scans(progressive)
    np.testing.assert_array_equal(on[0], off[0])


def test_encoder_refuses_an_invalid_scan_script():
    with pytest.raises(ValueError, match="libjpeg refused"):
        _C._encode_progressive(np.zeros((8, 8, 3), np.uint8), 90, [([0], 1, 63, 0, 0)])  # AC before any DC


@pytest.mark.parametrize("name,data", PROGRESSIVE, ids=[c[0] for c in PROGRESSIVE])
def test_progressive_full_decode_is_bit_identical(progressive_switch, name, data):
    fast, ref, used = progressive_switch(lambda: _C.decode_full(data, True, 0))
    assert used == _scans(data), "the fast decoder should take every scan of a progressive file"
    np.testing.assert_array_equal(fast[0], ref[0])
    assert fast[1] == ref[1] == 0


@pytest.mark.parametrize("name,data", PROGRESSIVE, ids=[c[0] for c in PROGRESSIVE])
def test_progressive_fused_crops_are_bit_identical(progressive_switch, name, data):
    # Small outputs: DCT scaling (1/2 .. 1/8) on the larger crops, row skipping below the top.
    datas = [data] * 12
    for t in (fastdata.RandomResizedCrop(16), fastdata.CenterCrop(24)):
        fast, ref, used = progressive_switch(lambda: fastdata.decode_batch(datas, t, seed=5, epoch=2, threads=2))
        assert used == 12 * _scans(data)
        np.testing.assert_array_equal(fast, ref)


def test_progressive_transcode_is_byte_identical(progressive_switch):
    """fastdata-convert's progressive -> baseline rewrite reads the coefficients with the
    fast decoder too: the same output file, byte for byte."""
    data = _C._encode_progressive(np.asarray(ig.photo_like(75, 97, index=2)), 90,
                                  [([0, 1, 2], 0, 0, 0, 1), ([0], 1, 63, 0, 1), ([1], 1, 63, 0, 0),
                                   ([2], 1, 63, 0, 0), ([0, 1, 2], 0, 0, 1, 0), ([0], 1, 63, 1, 0)])
    fast, ref, used = progressive_switch(lambda: _C.transcode_to_baseline(data, 0))
    assert used == _scans(data)
    assert fast == ref


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


def _damaged_progressive():
    """Progressive files damaged where each scan kind reads: cut at many points (libjpeg's
    block smoothing then works from the scans that are complete, and from where the data ran
    out: the fast decoder keeps libjpeg's out-of-data flag for it), bytes overwritten, stray
    and lost markers, garbage between scans."""
    photo = ig.photo_like(80, 112, index=7)
    plain = ig.encode_jpeg(photo, quality=92, progressive=True)
    restart = ig.encode_jpeg(photo, quality=92, progressive=True, restart_blocks=2)
    deep = _C._encode_progressive(np.asarray(photo), 95, [([0, 1, 2], 0, 0, 0, 2)] + _script(3, (1, 63, 0, 2))[1:] +
                                  [([0, 1, 2], 0, 0, 2, 1)] + _script(3, (1, 63, 2, 1))[1:] +
                                  [([0, 1, 2], 0, 0, 1, 0)] + _script(3, (1, 63, 1, 0))[1:])
    for name, src in (("plain", plain), ("restart", restart), ("deep", deep)):
        for frac in (0.01, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95, 0.999):
            yield f"{name}-truncated-{frac}", ig.truncate_scan(src, frac)
        for seed in range(6):
            yield f"{name}-corrupt-{seed}", ig.corrupt_entropy(src, seed=seed, count=2 + 5 * seed)
        sos = [i for i in range(len(src) - 1) if src[i] == 0xFF and src[i + 1] == 0xDA]
        mid_scan = sos[len(sos) // 2]
        yield f"{name}-garbage-before-a-scan", src[:mid_scan] + b"\x01\x02\x03" + src[mid_scan:]
        yield f"{name}-stray-marker", src[:mid_scan - 40] + b"\xff\xd5" + src[mid_scan - 40:]
        yield f"{name}-scan-lost", src[:mid_scan] + src[sos[len(sos) // 2 + 1]:]
        yield f"{name}-eoi-early", src[:mid_scan - 20] + b"\xff\xd9"
    rst = [i for i in range(ig.sos_offset(restart), len(restart) - 1)
           if restart[i] == 0xFF and 0xD0 <= restart[i + 1] <= 0xD7]
    for at in (rst[len(rst) // 4], rst[len(rst) // 2], rst[3 * len(rst) // 4]):
        yield f"restart-lost-marker-{at}", restart[:at] + restart[at + 2:]
        yield f"restart-renumbered-{at}", restart[:at + 1] + bytes([0xD0 + (restart[at + 1] - 0xD0 + 3) % 8]) + \
            restart[at + 2:]


DAMAGED_PROGRESSIVE = list(_damaged_progressive())


def _lenient_strict_and_crops(data: bytes):
    """(whole lenient decode: (pixels, warnings) or (None, the error), "ok" or "error" for a
    strict one, six fused crops with on_error="skip", their errors as text)."""
    try:
        lenient = _C.decode_full(data, False, 0)
    except _C.NativeDecodeError as e:
        lenient = (None, str(e))
    try:
        _C.decode_full(data, True, 0)
        strict = "ok"
    except _C.NativeDecodeError:
        strict = "error"
    crops, failed = fastdata.decode_batch([data] * 6, fastdata.RandomResizedCrop(24), seed=1, strict=False,
                                          on_error="skip", threads=1)
    return lenient, strict, crops, [str(e) for e in failed]


def _assert_decoded_like_libjpeg(fast, ref, may_warn_more: bool) -> None:
    """_lenient_strict_and_crops of both decoders: the same pixels or the same error, whole
    and cropped; warned alike (may_warn_more: fastdata warned at least where libjpeg did, and a
    strict decode may fail where it warned)."""
    if ref[0][0] is None:
        assert fast[0] == ref[0]
    else:
        np.testing.assert_array_equal(fast[0][0], ref[0][0])
        if may_warn_more:
            assert fast[0][1] > 0 or ref[0][1] == 0, (fast[0][1], ref[0][1])
        else:
            assert (fast[0][1] > 0) == (ref[0][1] > 0)
    strict_failed_on_a_warning = may_warn_more and fast[1] == "error" and ref[0][0] is not None and fast[0][1] > 0
    assert fast[1] == ref[1] or strict_failed_on_a_warning
    np.testing.assert_array_equal(fast[2], ref[2])
    assert fast[3] == ref[3]


@pytest.mark.parametrize("name,data", DAMAGED_PROGRESSIVE, ids=[c[0] for c in DAMAGED_PROGRESSIVE])
def test_damaged_progressive_decodes_like_libjpeg(progressive_switch, name, data):
    """Non-strict: the same pixels (or the same error), whole and cropped; a warning wherever
    libjpeg warns (and maybe more: bytes between a scan's last block and the next marker always
    warn here, see test_bytes_before_the_next_scan_always_warn); strict decodes fail wherever
    libjpeg's do."""
    fast, ref, used = progressive_switch(lambda: _lenient_strict_and_crops(data))
    assert used > 0
    _assert_decoded_like_libjpeg(fast, ref, may_warn_more=True)


def test_bytes_before_the_next_scan_always_warn(progressive_switch):
    """As at EOI (test_bytes_before_eoi_always_warn): garbage between a progressive scan's last
    block and the next marker warns, whether or not libjpeg's read-ahead swallowed it."""
    src = ig.encode_jpeg(ig.photo_like(48, 64, index=4), progressive=True)
    second_sos = [i for i in range(len(src) - 1) if src[i] == 0xFF and src[i + 1] == 0xDA][1]
    before = src.rfind(b"\xff", 0, second_sos)  # the DHT (or SOS) that follows the first scan
    data = src[:before] + b"\x01\x02" + src[before:]
    fast, ref, used = progressive_switch(lambda: _C.decode_full(data, False, 0))
    assert used == _scans(src)
    np.testing.assert_array_equal(fast[0], ref[0])
    np.testing.assert_array_equal(fast[0], _C.decode_full(src, True, 0)[0])
    assert fast[1] >= 1
    with pytest.raises(_C.NativeDecodeError, match="extraneous bytes"):
        _C.decode_full(data, True, 0)


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
    fast, ref, used = huffman_switch(lambda: _lenient_strict_and_crops(data))
    assert used > 0
    _assert_decoded_like_libjpeg(fast, ref, may_warn_more=False)


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
