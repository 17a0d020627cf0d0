"""Writes the seed corpus for the libFuzzer targets in fuzz/ (see fuzz/README.md).

    python fuzz/make_seeds.py OUT_DIR

OUT_DIR/<target>/ gets one file per seed: small JPEGs of every kind the engine meets
(baseline and progressive in each subsampling, grayscale, CMYK, every EXIF orientation,
restart markers, odd sizes, optimized and missing Huffman tables, ICC), the files in
tests/assets, and for the plan and crop targets the same JPEGs behind a few parameter
blocks (the layout of fuzz_common.h's read_spec). Images are kept small (<= 64 px a side)
so each execution stays fast. Deterministic: the same files every run.
"""
from __future__ import annotations

import hashlib
import math
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import imagegen  # noqa: E402  (tests/imagegen.py: the test suite's image generator)
from PIL import Image  # noqa: E402


def jpeg_seeds() -> dict:
    """name -> JPEG bytes."""
    seeds = {}
    img = imagegen.photo_like(40, 56, index=3)
    for sub in ("4:4:4", "4:2:2", "4:2:0"):
        tag = sub.replace(":", "")
        seeds[f"base_{tag}"] = imagegen.encode_jpeg(img, subsampling=sub, quality=80)
        seeds[f"prog_{tag}"] = imagegen.encode_jpeg(img, subsampling=sub, quality=80, progressive=True)
        seeds[f"opt_{tag}"] = imagegen.encode_jpeg(img, subsampling=sub, quality=80, optimize=True)
    seeds["rst_blocks_420"] = imagegen.encode_jpeg(img, restart_blocks=2)
    seeds["rst_rows_444"] = imagegen.encode_jpeg(img, subsampling="4:4:4", restart_rows=1)
    seeds["prog_rst_420"] = imagegen.encode_jpeg(img, progressive=True, restart_rows=1)
    try:  # 4:4:0 and 4:1:1 need OpenCV (Pillow cannot write them); CI may lack it
        for sub in ("4:4:0", "4:1:1"):
            seeds[f"cv_{sub.replace(':', '')}"] = imagegen.opencv_jpeg(img, sub, quality=80)
    except Exception:  # noqa: BLE001 - any import or encoder failure: header surgery instead
        # 4:4:4 relabelled with a 1x2 luma: a 4:4:0 header whose scan then runs short (warns)
        seeds["sof_440"] = imagegen.patch_sof(seeds["base_444"], sampling=(0, 0x12))
    seeds["gray"] = imagegen.encode_jpeg(img.convert("L"), quality=80)
    seeds["gray_prog"] = imagegen.encode_jpeg(img.convert("L"), quality=80, progressive=True)
    seeds["cmyk"] = imagegen.encode_jpeg(img.convert("CMYK"), quality=80)
    seeds["cmyk_prog"] = imagegen.encode_jpeg(img.convert("CMYK"), quality=80, progressive=True)
    seeds["icc"] = imagegen.encode_jpeg(img, quality=80, icc_profile=imagegen.icc_profile_bytes()[:600])
    for o in range(1, 9):
        seeds[f"exif_o{o}"] = imagegen.encode_oriented(img, o, quality=75)
    seeds["exif_o6_prog"] = imagegen.encode_oriented(img, 6, quality=75, progressive=True)
    for h, w in ((1, 1), (9, 17), (64, 7), (33, 65)):
        seeds[f"odd_{h}x{w}"] = imagegen.encode_jpeg(imagegen.photo_like(h, w, index=1), quality=70)
    seeds["odd_prog_13x31"] = imagegen.encode_jpeg(imagegen.photo_like(13, 31), quality=70, progressive=True)
    # Without DHT segments: libjpeg-turbo then uses the standard tables.
    base = seeds["base_420"]
    seeds["no_dht"] = b"".join(base[pos:pos + 2 + length] if marker != 0xC4 else b""
                               for marker, pos, length in _segments_until_sos(base)) + base[imagegen.sos_offset(base):]
    seeds["sof1_12bit"] = imagegen.make_12bit(base)
    seeds["truncated"] = imagegen.truncate_scan(base, 0.6)
    seeds["corrupt"] = imagegen.corrupt_entropy(base, seed=1, count=8)
    for path in sorted((REPO / "tests" / "assets").rglob("*")):
        if path.is_file() and path.suffix.lower() in (".jpg", ".jpeg"):
            seeds["asset_" + path.stem] = path.read_bytes()
    return seeds


def _segments_until_sos(data: bytes):
    """(marker, pos, length) of the segments before SOS, SOI included as a 0-length one."""
    yield 0xD8, 0, 0
    for marker, pos, length in imagegen.segments(data):
        if marker == 0xDA:
            return
        yield marker, pos, length


def _u16_of(value: float) -> int:
    """fuzz_common.h positive_double's inverse for finite values in [2^-16, 2^16]."""
    return max(2, min(0xFFFC, round(2048 * math.log2(value) + 32768)))


def param_block(*, kind: int = 0, roi: bool = True, strict: bool = False, out=(16, 16), scale=(0.08, 1.0),
                ratio=(3 / 4, 4 / 3), hflip: float = 0.5, resize: int = 20, seed: int = 0, index: int = 0,
                size=(40, 56), orientation: int = 1) -> bytes:
    flags = kind | ((0 if roi else 1) << 1) | (int(strict) << 2)
    block = struct.pack("<BHHHHHHBIIBHHHB", flags, out[0] - 1, out[1] - 1, _u16_of(scale[0]), _u16_of(scale[1]),
                        _u16_of(ratio[0]), _u16_of(ratio[1]), round(hflip * 255), resize, seed, 0, index,
                        size[1] - 1, size[0] - 1, orientation - 1)
    return block.ljust(32, b"\0")


PARAMS = {
    "rrc16": param_block(),
    "rrc_wide": param_block(out=(7, 31), scale=(0.5, 1.0), ratio=(0.2, 5.0), hflip=1.0, seed=7),
    "rrc_tiny_crop": param_block(out=(24, 24), scale=(0.001, 0.01), index=3),
    "center": param_block(kind=1, out=(12, 16), resize=14),
    "center_strict_noroi": param_block(kind=1, roi=False, strict=True, out=(8, 8), resize=9),
    "rrc_down8": param_block(out=(3, 4), scale=(0.9, 1.0), seed=5),  # 1/8 DCT scaling
}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    jpegs = jpeg_seeds()
    files = {t: {} for t in ("probe", "decode", "transcode", "plan", "crop")}
    for name, data in jpegs.items():
        for target in ("probe", "decode", "transcode"):
            files[target][name] = data
        for pname, block in PARAMS.items():
            files["crop"][f"{name}.{pname}"] = block + data
        files["plan"][f"{name}.rrc16"] = PARAMS["rrc16"] + data
        files["plan"][f"{name}.center"] = PARAMS["center"] + data
    # Plan seeds without JPEG bytes: large sizes and every orientation.
    for o in range(1, 9):
        for h, w in ((3000, 4000), (1, 65535), (9459, 9459)):
            files["plan"][f"size_{h}x{w}_o{o}"] = param_block(out=(224, 224), size=(h, w), orientation=o)[:32]
            files["plan"][f"size_{h}x{w}_o{o}_center"] = param_block(kind=1, out=(224, 224), resize=256,
                                                                     size=(h, w), orientation=o)[:32]
    for target, entries in files.items():
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in entries.items():
            (d / name).write_bytes(data)
    digest = hashlib.sha256(b"".join(jpegs[k] for k in sorted(jpegs))).hexdigest()[:12]
    print(f"{sum(len(e) for e in files.values())} seed files in {out} (JPEG set {digest}, {len(jpegs)} images)")


if __name__ == "__main__":
    main()
