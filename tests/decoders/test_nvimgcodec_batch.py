"""fastdata's own nvImageCodec call (``_C.NvImageCodecBatch`` on an ``_C.NvImageCodecInstance``,
csrc/gpu/): its C ABI against the installed wheel's header, and its decodes against Pillow, on
nvImageCodec's CPU backend (the same code path as the hardware engines but for the buffer kind;
tests/gpu runs the engines)."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from fastdata import _C

nvimgcodec = pytest.importorskip("nvidia.nvimgcodec")

from fastdata.decoders.gpu_resize import ImageLayout  # noqa: E402
from fastdata.decoders.nvimgcodec import BACKEND_KINDS, IMAGE_ALIGN, nvimgcodec_library  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every field csrc/gpu/nvimgcodec_abi.h declares, by (our struct, the header's struct, fields).
STRUCTS = {
    ("Properties", "nvimgcodecProperties_t"): ["struct_type", "struct_size", "struct_next", "version",
                                              "cudart_version"],
    ("InstanceCreateInfo", "nvimgcodecInstanceCreateInfo_t"): [
        "struct_type", "struct_size", "struct_next", "load_builtin_modules", "load_extension_modules",
        "extension_modules_path", "create_debug_messenger", "debug_messenger_desc", "message_severity",
        "message_category"],
    ("BackendParams", "nvimgcodecBackendParams_t"): ["struct_type", "struct_size", "struct_next", "load_hint",
                                                     "load_hint_policy"],
    ("Backend", "nvimgcodecBackend_t"): ["struct_type", "struct_size", "struct_next", "kind", "params"],
    ("ExecutionParams", "nvimgcodecExecutionParams_t"): [
        "struct_type", "struct_size", "struct_next", "device_allocator", "pinned_allocator", "max_num_cpu_threads",
        "executor", "device_id", "pre_init", "skip_pre_sync", "num_backends", "backends"],
    ("Orientation", "nvimgcodecOrientation_t"): ["struct_type", "struct_size", "struct_next", "rotated", "flip_x",
                                                 "flip_y"],
    ("ImagePlaneInfo", "nvimgcodecImagePlaneInfo_t"): ["struct_type", "struct_size", "struct_next", "width",
                                                       "height", "row_stride", "num_channels", "sample_type",
                                                       "precision"],
    ("ImageInfo", "nvimgcodecImageInfo_t"): ["struct_type", "struct_size", "struct_next", "codec_name",
                                             "color_spec", "chroma_subsampling", "sample_format", "orientation",
                                             "num_planes", "plane_info", "buffer", "buffer_kind", "cuda_stream"],
    ("DecodeParams", "nvimgcodecDecodeParams_t"): ["struct_type", "struct_size", "struct_next",
                                                   "apply_exif_orientation"],
}
CONSTANTS = {
    "kInstanceCreateInfo": "NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO",
    "kDecodeParams": "NVIMGCODEC_STRUCTURE_TYPE_DECODE_PARAMS",
    "kOrientation": "NVIMGCODEC_STRUCTURE_TYPE_ORIENTATION",
    "kImageInfo": "NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO",
    "kImagePlaneInfo": "NVIMGCODEC_STRUCTURE_TYPE_IMAGE_PLANE_INFO",
    "kBackend": "NVIMGCODEC_STRUCTURE_TYPE_BACKEND",
    "kBackendParams": "NVIMGCODEC_STRUCTURE_TYPE_BACKEND_PARAMS",
    "kExecutionParams": "NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS",
    "kProperties": "NVIMGCODEC_STRUCTURE_TYPE_PROPERTIES",
    "kStatusSuccess": "NVIMGCODEC_STATUS_SUCCESS",
    "kProcessingSuccess": "NVIMGCODEC_PROCESSING_STATUS_SUCCESS",
    "kDeviceCpuOnly": "NVIMGCODEC_DEVICE_CPU_ONLY",
    "kBackendCpuOnly": "NVIMGCODEC_BACKEND_KIND_CPU_ONLY",
    "kBackendGpuOnly": "NVIMGCODEC_BACKEND_KIND_GPU_ONLY",
    "kBackendHybridCpuGpu": "NVIMGCODEC_BACKEND_KIND_HYBRID_CPU_GPU",
    "kBackendHwGpuOnly": "NVIMGCODEC_BACKEND_KIND_HW_GPU_ONLY",
    "kLoadHintPolicyFixed": "NVIMGCODEC_LOAD_HINT_POLICY_FIXED",
    "kColorSpecSrgb": "NVIMGCODEC_COLORSPEC_SRGB",
    "kSamplingNone": "NVIMGCODEC_SAMPLING_NONE",
    "kSampleFormatInterleavedRgb": "NVIMGCODEC_SAMPLEFORMAT_I_RGB",
    "kSampleUint8": "NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8",
    "kBufferStridedDevice": "NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE",
    "kBufferStridedHost": "NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST",
    "kMaxCodecName": "NVIMGCODEC_MAX_CODEC_NAME_SIZE",
    "kMaxPlanes": "NVIMGCODEC_MAX_NUM_PLANES",
}


def abi_check_source() -> str:
    lines = ["#include <cstddef>", "#include <nvimgcodec.h>", '#include "gpu/nvimgcodec_abi.h"',
             "namespace a = fastdata::nvimgcodec_abi;"]
    for (ours, theirs), fields in STRUCTS.items():
        lines.append(f"static_assert(sizeof(a::{ours}) == sizeof({theirs}), \"size of {ours}\");")
        for f in fields:
            lines.append(f"static_assert(offsetof(a::{ours}, {f}) == offsetof({theirs}, {f}), \"{ours}.{f}\");")
            lines.append(f"static_assert(sizeof(a::{ours}::{f}) == sizeof({theirs}::{f}), \"size of {ours}.{f}\");")
    for ours, theirs in CONSTANTS.items():
        lines.append(f"static_assert(static_cast<long long>(a::{ours}) == static_cast<long long>({theirs}), "
                     f"\"{ours}\");")
    lines.append("int main() { return 0; }")
    return "\n".join(lines) + "\n"


def test_abi_declarations_match_the_installed_header(tmp_path):
    # csrc/gpu/nvimgcodec_abi.h writes out the layouts fastdata passes to the library: a field
    # or constant that differs from the wheel's nvimgcodec.h would corrupt a call, so every one
    # is compared by the compiler. The header needs cudaStream_t only from CUDA: a stand-in.
    include = os.path.join(os.path.dirname(nvimgcodec.__file__), "include")
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "the build needs a C++ compiler, and so does this check"
    assert os.path.exists(os.path.join(include, "nvimgcodec.h")), "the wheel ships its header"
    (tmp_path / "cuda_runtime_api.h").write_text("#include <stddef.h>\ntypedef struct CUstream_st* cudaStream_t;\n")
    src = tmp_path / "abi_check.cpp"
    src.write_text(abi_check_source())
    done = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", f"-I{tmp_path}", f"-I{include}",
                           f"-I{os.path.join(REPO, 'csrc')}", str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


def test_abi_check_catches_a_drifted_field(tmp_path):
    # The check above fails when a declaration drifts: a copy of the header with a field moved.
    include = os.path.join(os.path.dirname(nvimgcodec.__file__), "include")
    with open(os.path.join(include, "nvimgcodec.h")) as f:
        text = f.read()
    drifted = text.replace("        int pre_init;", "        int pre_init;\n        int added_field;", 1)
    assert drifted != text
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "nvimgcodec.h").write_text(drifted)
    shutil.copy(os.path.join(include, "nvimgcodec_version.h"), fake / "nvimgcodec_version.h")
    (fake / "cuda_runtime_api.h").write_text("#include <stddef.h>\ntypedef struct CUstream_st* cudaStream_t;\n")
    src = tmp_path / "abi_check.cpp"
    src.write_text(abi_check_source())
    done = subprocess.run([shutil.which("g++") or "c++", "-std=c++17", "-fsyntax-only", f"-I{fake}",
                           f"-I{os.path.join(REPO, 'csrc')}", str(src)], capture_output=True, text=True)
    assert done.returncode != 0 and "ExecutionParams" in done.stderr


def cpu_batch() -> "_C.NvImageCodecBatch":
    return _C.NvImageCodecBatch(_C.NvImageCodecInstance(nvimgcodec_library()), None, 1,
                                [BACKEND_KINDS["CPU_ONLY"]], "")


def jpeg(h: int, w: int, seed: int, subsampling: int = 2, progressive: bool = False) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // max(1, w - 1), yy * 255 // max(1, h - 1), (xx + yy) % 256], -1)
    img = np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(img).save(out, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return out.getvalue()


def packed(shapes):
    """Aligned offsets and the buffer size, as the gpu decoder lays a batch out."""
    layout = ImageLayout.packed(shapes, chw=False, align=IMAGE_ALIGN)
    return layout.base, layout.nbytes()


def test_batch_decodes_every_sampling_and_size_as_pillow_does():
    # 4:4:4, 4:2:2, 4:2:0, odd sizes and a progressive file, into one buffer at aligned
    # offsets: each image equals Pillow's decode (the same libjpeg-turbo, fancy upsampling).
    cases = [(37, 53, 0, False), (64, 64, 1, False), (101, 77, 2, False), (1, 1, 2, False), (17, 300, 2, True)]
    datas = [jpeg(h, w, i, s, p) for i, (h, w, s, p) in enumerate(cases)]
    shapes = [(h, w) for h, w, _, _ in cases]
    offsets, total = packed(shapes)
    out = np.full(total, 7, np.uint8)
    status = cpu_batch().decode(datas, out.ctypes.data, total, offsets, np.array([s[0] for s in shapes]),
                                np.array([s[1] for s in shapes]), 0)
    assert status.tolist() == [0] * len(cases)
    for data, (h, w), off in zip(datas, shapes, offsets):
        got = out[off:off + h * w * 3].reshape(h, w, 3)
        assert np.array_equal(got, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_rows_it_cannot_take_are_named_and_others_still_decode():
    good = jpeg(40, 30, 5)
    truncated = good[: len(good) // 2]
    datas = [b"not an image at all", good, good, truncated, b""]
    shapes = [(8, 8), (40, 30), (41, 30), (40, 30), (8, 8)]  # row 2's planned size is wrong
    offsets, total = packed(shapes)
    out = np.zeros(total, np.uint8)
    status = cpu_batch().decode(datas, out.ctypes.data, total, offsets, np.array([s[0] for s in shapes]),
                                np.array([s[1] for s in shapes]), 0)
    assert status[0] == 2 and status[4] == 2  # no header nvImageCodec can read
    assert status[1] == 0 and status[2] == 3  # decoded; a size other than the plan's is not decoded
    assert status[3] == 2  # truncated: nvImageCodec 0.9's parser refuses it (routing keeps these native anyway)
    ref = np.asarray(Image.open(io.BytesIO(good)).convert("RGB"))
    assert np.array_equal(out[offsets[1]:offsets[1] + 40 * 30 * 3].reshape(40, 30, 3), ref)
    assert not out[offsets[2]:offsets[2] + 41 * 30 * 3].any()  # row 2's slot untouched


def test_bad_arguments_raise_before_anything_is_written():
    data = jpeg(16, 16, 1)
    out = np.zeros(1024, np.uint8)
    batch = cpu_batch()
    one = np.array([16])
    with pytest.raises(ValueError, match="outside the output buffer"):
        batch.decode([data], out.ctypes.data, 700, np.array([0]), one, one, 0)  # 768 bytes needed
    with pytest.raises(ValueError, match="outside the output buffer"):
        batch.decode([data], out.ctypes.data, 1024, np.array([-1]), one, one, 0)
    with pytest.raises(ValueError, match="one length"):
        batch.decode([data, data], out.ctypes.data, 1024, np.array([0]), one, one, 0)
    with pytest.raises(ValueError, match="not a JPEG's"):
        batch.decode([data], out.ctypes.data, 1024, np.array([0]), np.array([0]), one, 0)
    with pytest.raises(ValueError, match="null address"):
        batch.decode([data], 0, 1024, np.array([0]), one, one, 0)
    with pytest.raises(TypeError):
        batch.decode(["a path is not bytes"], out.ctypes.data, 1024, np.array([0]), one, one, 0)
    assert not out.any()
    assert batch.decode([], out.ctypes.data, 0, np.zeros(0, np.int64), np.zeros(0, np.int64),
                        np.zeros(0, np.int64), 0).tolist() == []


def test_construction_errors_name_the_problem():
    with pytest.raises(RuntimeError, match="cannot load"):
        _C.NvImageCodecInstance("/nonexistent/libnvimgcodec.so.0")
    instance = _C.NvImageCodecInstance(nvimgcodec_library())
    with pytest.raises(ValueError, match="unknown nvImageCodec backend kind"):
        _C.NvImageCodecBatch(instance, None, 1, [9], "")
    with pytest.raises(ValueError, match="CPU-only backend"):
        _C.NvImageCodecBatch(instance, 0, 1, [BACKEND_KINDS["CPU_ONLY"]], "")
    with pytest.raises(ValueError, match="at least 1"):
        _C.NvImageCodecBatch(instance, None, 0, [1], "")
    with pytest.raises(ValueError, match="needs an nvImageCodec instance"):
        _C.NvImageCodecBatch(None, None, 1, [1], "")
    assert instance.library_version // 100 == 9 and cpu_batch().host_buffers


def test_decoders_share_an_instance_that_lives_as_long_as_they_do():
    # Several decoders on one instance, called from threads at once, decode what each alone does;
    # the instance lives on in its decoders after the caller drops it.
    instance = _C.NvImageCodecInstance(nvimgcodec_library())
    batches = [_C.NvImageCodecBatch(instance, None, 1, [BACKEND_KINDS["CPU_ONLY"]], "") for _ in range(4)]
    assert all(b.instance is instance for b in batches) and instance.create_seconds > 0
    del instance
    datas = [jpeg(48 + 8 * k, 64 - 4 * k, seed=k, subsampling=k % 3) for k in range(8)]
    expected = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in datas]

    def decode_all(batch):
        outs = []
        for _ in range(5):
            out = np.zeros(sum(e.nbytes for e in expected), np.uint8)
            offsets = np.cumsum([0] + [e.nbytes for e in expected[:-1]]).astype(np.int64)
            heights = np.array([e.shape[0] for e in expected], np.int64)
            widths = np.array([e.shape[1] for e in expected], np.int64)
            statuses = batch.decode(datas, out.ctypes.data, out.nbytes, offsets, heights, widths, 0)
            outs.append((statuses.tolist(), [out[o:o + e.nbytes].reshape(e.shape) for o, e in zip(offsets, expected)]))
        return outs

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(batches)) as pool:
        results = list(pool.map(decode_all, batches))
    alone = decode_all(batches[0])[0]
    assert alone[0] == [0] * len(datas)
    for got, want in zip(alone[1], expected):
        assert np.array_equal(got, want)  # nvImageCodec's CPU backend decodes as Pillow does
    for outs in results:
        for statuses, images in outs:
            assert statuses == alone[0]
            assert all(np.array_equal(a, b) for a, b in zip(images, alone[1]))


def test_the_decoder_loads_the_library_without_importing_the_python_api():
    # Importing nvidia.nvimgcodec makes an nvImageCodec instance of its own with every codec
    # extension loaded (making one took 1.03 s on an H100). The gpu decoder needs only the library's path: made in a
    # fresh process, it decodes as Pillow does with the Python API never imported.
    script = textwrap.dedent("""
        import io, sys
        import numpy as np, torch
        from PIL import Image
        from fastdata import RandomResizedCrop
        from fastdata.decoders.nvimgcodec import NvImageCodecDecoder, nvimgcodec_library

        class Cpu(NvImageCodecDecoder):
            _allow_cpu = True

        decoder = Cpu(RandomResizedCrop(32), device=torch.device("cpu"), backend_kinds=("CPU_ONLY",))
        rng = np.random.default_rng(3)
        img = rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        data = np.frombuffer(buf.getvalue(), np.uint8)
        out = np.zeros(24 * 40 * 3, np.uint8)
        one = np.array([0], np.int64)
        status = decoder._decoders[0].decode([data], out.ctypes.data, out.nbytes, one,
                                             np.array([24]), np.array([40]), 0)
        want = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
        print(status.tolist(), np.array_equal(out.reshape(24, 40, 3), want), decoder.instance_total,
              nvimgcodec_library().endswith("nvidia/nvimgcodec/libnvimgcodec.so.0"),
              sorted(m for m in sys.modules if m.startswith("nvidia.nvimgcodec")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[0] True 1 True []"
