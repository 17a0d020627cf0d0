"""The resampler's Triton kernels compile for Hopper (sm_90) without a GPU.

The interpreter (how the other tests run the kernels without CUDA) executes them as numpy and
lets through what the compiler rejects (types that change in a loop, unsupported ops). Triton
ships its own ptxas, so a fresh Python without TRITON_INTERPRET compiles the kernels to
cubin here, for int32 and int64 offsets and every output dtype, normalized or not, with
interleaved (NHWC) or strided (NCHW) stores, as a GPU would at the first batch; and the
normalized ones multiply, then add, without a fused multiply-add (the native threads' values).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from fastdata.decoders import resample_kernels as K

target = GPUTarget("cuda", 90, 32)
options = {"num_warps": 4, "enable_fp_fusion": False}
scalars = {"o_image": "i32", "o_y": "i32", "o_x": "i32", "o_ch": "i32", "s0": "fp32", "s1": "fp32", "s2": "fp32",
           "b0": "fp32", "b1": "fp32", "b2": "fp32"}
jobs = []
for meta in ("*i32", "*i64"):
    horizontal = {"src": "*u8", "stack": "*u8", "meta": meta, "block_start": "*i32", "first_x": "*i32",
                  "weights_x": "*i16", "num_images": "i32", "search_steps": "i32", "taps_x": "i32", "out_w": "i32",
                  "BITS": "constexpr", "BLOCK_R": "constexpr", "BLOCK_W": "constexpr"}
    jobs.append((K.horizontal_pass, horizontal, {"BITS": 14, "BLOCK_R": 8, "BLOCK_W": 128}))
    for out, normalize, interleaved in (("*fp32", False, True), ("*u8", False, True), ("*u8", False, False),
                                        ("*fp16", True, True), ("*fp16", True, False), ("*bf16", True, True),
                                        ("*bf16", True, False), ("*fp32", True, True), ("*fp32", True, False)):
        vertical = {"stack": "*u8", "out": out, "meta": meta, "first_y": "*i32", "weights_y": "*i16",
                    "taps_y": "i32", "out_h": "i32", "row_len": "i32", **scalars,
                    "BITS": "constexpr", "BLOCK_H": "constexpr", "BLOCK_C": "constexpr", "NORMALIZE": "constexpr",
                    "INTERLEAVED": "constexpr"}
        consts = {"NORMALIZE": normalize, "INTERLEAVED": interleaved}
        jobs.append((K.vertical_pass, vertical, {"BITS": 14, "BLOCK_H": 4, "BLOCK_C": 256, **consts}))
        place = {"src": "*u8", "out": out, "images": meta, "out_h": "i32", "row_len": "i32", **scalars,
                 "BLOCK_H": "constexpr", "BLOCK_C": "constexpr", "NORMALIZE": "constexpr", "INTERLEAVED": "constexpr"}
        jobs.append((K.place_rows, place, {"BLOCK_H": 4, "BLOCK_C": 256, **consts}))
for fn, sig, consts in jobs:
    compiled = triton.compile(triton.compiler.ASTSource(fn, sig, consts), target=target, options=options)
    if not compiled.asm.get("cubin"):
        raise SystemExit(f"{fn.__name__}: no cubin")
    # The normalize must multiply, then add (the native threads' arithmetic): no fused multiply-add.
    if consts.get("NORMALIZE") and "fma." in compiled.asm["ptx"]:
        raise SystemExit(f"{fn.__name__} {sig['out']}: fma in the normalize")
print("compiled")
"""


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]
