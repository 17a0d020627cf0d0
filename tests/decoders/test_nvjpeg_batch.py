"""fastdata's nvJPEG batch call (``_C.NvJpegBatch``, csrc/gpu/nvjpeg_batch.cpp) and the gpu
decoder with ``ENGINE_CALLS = "nvjpeg"``, without a GPU.

A stand-in library (fake_nvjpeg.c, built here with the system's libjpeg) takes nvJPEG's and the
CUDA runtime's place: it decodes into host memory with libjpeg, fails a whole batch call for one
bad row as nvJPEG does, and counts how it is called (a decode state reused before the previous
call's work was waited for, the wait's event kind). So what runs here is fastdata's side: the
rows' checks, offsets and pitches, the row-by-row retry, errors, and the decoder's assembly and
routing against the native backend. The declarations fastdata writes out are compared with the
installed nvjpeg.h and CUDA runtime headers. tests/gpu/test_gpu_hybrid.py runs the call on the
hardware engines.
"""
from __future__ import annotations

import ctypes
import io
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import _C
from fastdata.decoders import nvimgcodec as gpu
from fastdata.decoders.gpu_resize import ImageLayout
from fastdata.loader.pipeline import make_backend
from imagegen import hard_case_folder, photo_like, photo_like_jpeg, psnr
from repo import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
nvidia = pytest.importorskip("nvidia")


def cuda_include() -> str:
    """The folder of nvjpeg.h (the nvidia-nvjpeg wheel) and the CUDA runtime's headers
    (nvidia-cuda-runtime, which CUDA builds of torch bring)."""
    for base in nvidia.__path__:
        include = os.path.join(base, "cu13", "include")
        if os.path.exists(os.path.join(include, "nvjpeg.h")):
            return include
    raise AssertionError("nvjpeg.h is not installed: the test extra brings nvidia-nvjpeg")


CONSTANTS = {
    "kStatusSuccess": "NVJPEG_STATUS_SUCCESS",
    "kStatusNotInitialized": "NVJPEG_STATUS_NOT_INITIALIZED",
    "kStatusInvalidParameter": "NVJPEG_STATUS_INVALID_PARAMETER",
    "kStatusBadJpeg": "NVJPEG_STATUS_BAD_JPEG",
    "kStatusJpegNotSupported": "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
    "kStatusAllocatorFailure": "NVJPEG_STATUS_ALLOCATOR_FAILURE",
    "kStatusExecutionFailed": "NVJPEG_STATUS_EXECUTION_FAILED",
    "kStatusArchMismatch": "NVJPEG_STATUS_ARCH_MISMATCH",
    "kStatusInternalError": "NVJPEG_STATUS_INTERNAL_ERROR",
    "kStatusImplementationNotSupported": "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
    "kStatusIncompleteBitstream": "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
    "kBackendHardware": "NVJPEG_BACKEND_HARDWARE",
    "kOutputRgbi": "NVJPEG_OUTPUT_RGBI",
    "kCss444": "NVJPEG_CSS_444",
    "kFlagsUpsamplingWithInterpolation": "NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION",
    "kMaxComponent": "NVJPEG_MAX_COMPONENT",
    "kCudaSuccess": "cudaSuccess",
    "kEventBlockingSync": "cudaEventBlockingSync",
    "kEventDisableTiming": "cudaEventDisableTiming",
}
# Each function fastdata loads, by (its pointer type in nvjpeg_abi.h, the library's function): the
# check compares the result's and every parameter's type after one normalization, since
# nvjpeg_abi.h writes C enums as int32_t and opaque handles (pointers to structures) as void*.
FUNCTIONS = {
    "CreateExFn": "nvjpegCreateEx", "DestroyFn": "nvjpegDestroy",
    "GetHardwareDecoderInfoFn": "nvjpegGetHardwareDecoderInfo", "JpegStateCreateFn": "nvjpegJpegStateCreate",
    "JpegStateDestroyFn": "nvjpegJpegStateDestroy", "JpegStreamCreateFn": "nvjpegJpegStreamCreate",
    "JpegStreamDestroyFn": "nvjpegJpegStreamDestroy", "JpegStreamParseHeaderFn": "nvjpegJpegStreamParseHeader",
    "JpegStreamGetFrameDimensionsFn": "nvjpegJpegStreamGetFrameDimensions",
    "DecodeBatchedSupportedFn": "nvjpegDecodeBatchedSupported",
    "DecodeBatchedPreAllocateFn": "nvjpegDecodeBatchedPreAllocate",
    "DecodeBatchedInitializeFn": "nvjpegDecodeBatchedInitialize", "DecodeBatchedFn": "nvjpegDecodeBatched",
    "EventCreateWithFlagsFn": "cudaEventCreateWithFlags", "EventRecordFn": "cudaEventRecord",
    "EventSynchronizeFn": "cudaEventSynchronize", "EventDestroyFn": "cudaEventDestroy",
    "StreamSynchronizeFn": "cudaStreamSynchronize", "GetErrorStringFn": "cudaGetErrorString",
}


def abi_check_source() -> str:
    lines = ["#include <cstddef>", "#include <type_traits>", "#include <nvjpeg.h>", "#include <cuda_runtime_api.h>",
             '#include "gpu/nvjpeg_abi.h"', "namespace a = fastdata::nvjpeg_abi;",
             # the types as nvjpeg_abi.h writes them: an enum as int32_t, a pointer to a structure
             # (or to void) as void*, pointers to those pointers accordingly; const dropped
             "template <typename T> struct Norm;",
             "template <typename T> using norm_t = typename Norm<std::remove_cv_t<T>>::type;",
             "template <typename T, bool = std::is_enum_v<T>> struct Norm0 { using type = T; };",
             "template <typename T> struct Norm0<T, true> {",
             "  static_assert(sizeof(T) == 4, \"an enum of 4 bytes\");",
             "  using type = int32_t;",
             "};",
             "template <typename T> struct Norm : Norm0<T> {};",
             "template <typename T, bool = std::is_class_v<std::remove_cv_t<T>> || std::is_void_v<std::remove_cv_t<T>>>",
             "struct Pointee { using type = norm_t<T>*; };",
             "template <typename T> struct Pointee<T, true> { using type = void*; };",
             "template <typename T> struct Norm<T*> { using type = typename Pointee<T>::type; };",
             "template <typename A, typename B> struct Same : std::false_type {};",
             "template <typename R1, typename R2, typename... P1, typename... P2>",
             "struct Same<R1 (*)(P1...), R2 (*)(P2...)> {",
             "  static constexpr bool value = sizeof...(P1) == sizeof...(P2) && std::is_same_v<norm_t<R1>, norm_t<R2>> &&",
             "                               (std::is_same_v<norm_t<P1>, norm_t<P2>> && ...);",
             "};"]
    for ours, theirs in CONSTANTS.items():
        lines.append(f"static_assert(a::{ours} == static_cast<decltype(a::{ours})>({theirs}), \"{ours}\");")
    lines.append("static_assert(sizeof(a::Image) == sizeof(nvjpegImage_t), \"Image\");")
    for field in ("channel", "pitch"):
        lines.append(f"static_assert(offsetof(a::Image, {field}) == offsetof(nvjpegImage_t, {field}) && "
                     f"sizeof(a::Image::{field}) == sizeof(nvjpegImage_t::{field}), \"Image.{field}\");")
    for ours, theirs in FUNCTIONS.items():
        lines.append(f"static_assert(Same<a::{ours}, decltype(&{theirs})>::value, \"{ours}\");")
    return "\n".join(lines) + "\n"


# The CUDA runtime wheel's headers include crt/host_defines.h, which comes with the CUDA compiler,
# not with the runtime: these are the definitions a host compiler needs from it.
HOST_DEFINES = """#pragma once
#define __host__
#define __device__
#define __device_builtin__
#define __cudart_builtin__
#define __builtin_align__(a) __attribute__((aligned(a)))
#define __align__(n) __attribute__((aligned(n)))
#define CUDARTAPI
#define __dv(v) = v
"""


def compile_check(include: str, tmp_path, first: str = "") -> subprocess.CompletedProcess:
    (tmp_path / "crt").mkdir(exist_ok=True)
    (tmp_path / "crt" / "host_defines.h").write_text(HOST_DEFINES)
    src = tmp_path / "abi_check.cpp"
    src.write_text(abi_check_source())
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "the build needs a C++ compiler, and so does this check"
    return subprocess.run([compiler, "-std=c++17", "-fsyntax-only"] + ([f"-I{first}"] if first else []) +
                          [f"-I{tmp_path}", f"-I{include}", f"-I{os.path.join(ROOT, 'csrc')}", str(src)],
                          capture_output=True, text=True)


def test_abi_declarations_match_the_installed_headers(tmp_path):
    # csrc/gpu/nvjpeg_abi.h writes out the constants, the one structure and the signatures that
    # fastdata passes to nvJPEG and the CUDA runtime: every one is compared by the compiler.
    done = compile_check(cuda_include(), tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]


def test_abi_check_catches_a_drifted_declaration(tmp_path):
    # A copy of nvjpeg.h with a constant and a parameter changed, found before the installed one.
    include = cuda_include()
    with open(os.path.join(include, "nvjpeg.h")) as f:
        text = f.read()
    drifted = text.replace("NVJPEG_OUTPUT_RGBI           = 5", "NVJPEG_OUTPUT_RGBI           = 6", 1)
    drifted = drifted.replace("          int max_cpu_threads,\n          nvjpegOutputFormat_t output_format);",
                              "          int max_cpu_threads,\n          size_t output_format);", 1)
    assert drifted.count("= 6") > text.count("= 6") and "size_t output_format" in drifted
    fake = tmp_path / "drifted"
    fake.mkdir()
    (fake / "nvjpeg.h").write_text(drifted)
    done = compile_check(include, tmp_path, first=str(fake))
    assert done.returncode != 0 and "kOutputRgbi" in done.stderr and "DecodeBatchedInitializeFn" in done.stderr


# ---------------------------------------------------------------- the stand-in library

@pytest.fixture(scope="session")
def fake_library(tmp_path_factory) -> str:
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "the build needs a C compiler, and so does the stand-in"
    out = tmp_path_factory.mktemp("fake_nvjpeg") / "libfake_nvjpeg.so"
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", os.path.join(HERE, "fake_nvjpeg.c"),
                           "-ljpeg", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return str(out)


@pytest.fixture
def fake(fake_library):
    """The stand-in's knobs and counters (the same copy of the library as NvJpegBatch loads)."""
    lib = ctypes.CDLL(fake_library)
    lib.fake_nvjpeg_set.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.fake_nvjpeg_get.argtypes = [ctypes.c_char_p]

    class Knobs:
        path = fake_library

        def set(self, **kw):
            for name, value in kw.items():
                assert lib.fake_nvjpeg_set(name.encode(), value) == 0, name

        def get(self, name):
            value = lib.fake_nvjpeg_get(name.encode())
            assert value >= 0, name
            return value

    knobs = Knobs()
    knobs.set(reset=1)
    return knobs


def jpeg(h: int, w: int, seed: int, subsampling: int = 2, progressive: bool = False, gray: bool = False) -> bytes:
    img = photo_like(h, w, seed=seed)
    out = io.BytesIO()
    (img.convert("L") if gray else img).save(out, "JPEG", quality=90, subsampling=subsampling,
                                              progressive=progressive)
    return out.getvalue()


def without_quantization_tables(data: bytes) -> bytes:
    """The file with its DQT segments cut out: its header reads, its scan cannot be decoded
    (libjpeg-turbo fills in missing Huffman tables, as Motion-JPEG omits them, but not these)."""
    out, i = bytearray(data[:2]), 2
    while data[i] == 0xFF and data[i + 1] != 0xDA:
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if data[i + 1] != 0xDB:
            out += data[i:i + 2 + length]
        i += 2 + length
    return bytes(out + data[i:])


def decode_into(batch, datas, shapes):
    """One decode call into a host buffer laid out as the gpu decoder lays a batch out."""
    layout = ImageLayout.packed(np.asarray(shapes, np.int64), chw=False, align=gpu.IMAGE_ALIGN)
    out = np.full(layout.nbytes(), 7, np.uint8)
    status = batch.decode(datas, out.ctypes.data, out.nbytes, layout.base,
                          np.asarray([s[0] for s in shapes]), np.asarray([s[1] for s in shapes]), 0)
    images = [out[b:b + h * w * 3].reshape(h, w, 3) for b, (h, w) in zip(layout.base, shapes)]
    return np.asarray(status), images


def test_batch_decodes_every_sampling_and_size_as_libjpeg_does(fake):
    batch = _C.NvJpegBatch(fake.path, fake.path)
    assert batch.hardware_engines == 5 and fake.get("blocking_events") == 1  # its wait sleeps
    datas = [jpeg(37, 53, 1, 0), jpeg(64, 48, 2, 1), jpeg(75, 101, 3, 2), jpeg(33, 17, 4, gray=True)]
    shapes = [(37, 53), (64, 48), (75, 101), (33, 17)]
    for call in range(2):
        status, images = decode_into(batch, datas, shapes)
        assert status.tolist() == [gpu.DECODED] * 4
        for data, image in zip(datas, images):
            assert np.array_equal(image, np.asarray(fastdata.decode(data)))  # libjpeg's pixels, at the row's place
    # one nvjpegDecodeBatched per decode; the second waited for the first's work before reusing the state
    assert fake.get("calls") == 2 and fake.get("max_rows") == 4 and fake.get("records") == 2
    assert fake.get("syncs") == 1 and fake.get("early_reuse") == 0
    del batch
    assert fake.get("syncs") == 2  # the last call's work, before the state is destroyed


def test_rows_it_cannot_take_are_named_and_others_still_decode(fake):
    fake.set(refuse_width=29)
    good = jpeg(40, 60, 5)
    datas = [b"\xff\xd8 not a jpeg", good, jpeg(40, 60, 6, progressive=True), good, jpeg(20, 29, 7), good]
    shapes = [(40, 60), (40, 61), (40, 60), (40, 60), (20, 29), (40, 60)]
    status, images = decode_into(_C.NvJpegBatch(fake.path, fake.path), datas, shapes)
    # unreadable header, planned size other than the frame's, unsupported (progressive, refused width)
    assert status.tolist() == [2, 3, 1, 0, 1, 0]
    assert fake.get("max_rows") == 2 and fake.get("rows_decoded") == 2  # only the rows it takes reach the call
    expected = np.asarray(fastdata.decode(good))
    assert np.array_equal(images[3], expected) and np.array_equal(images[5], expected)
    assert (images[1] == 7).all()  # a refused row's slot is not written


def test_a_batch_failed_by_one_row_is_decoded_again_row_by_row(fake):
    broken = without_quantization_tables(jpeg(40, 60, 8))
    assert fastdata.probe(broken).width == 60  # its header reads
    datas = [jpeg(40, 60, 9), broken, jpeg(24, 36, 10)]
    batch = _C.NvJpegBatch(fake.path, fake.path)
    status, images = decode_into(batch, datas, [(40, 60), (40, 60), (24, 36)])
    assert status.tolist() == [0, 1, 0] and batch.row_by_row_retries == 1
    assert np.array_equal(images[0], np.asarray(fastdata.decode(datas[0])))
    assert np.array_equal(images[2], np.asarray(fastdata.decode(datas[2])))
    assert fake.get("calls") == 4 and fake.get("early_reuse") == 0  # the batch, then each row alone
    # a batch failed with a data status although no row is at fault: every row decodes alone
    fake.set(fail_batches_over=1)
    status, _ = decode_into(batch, [datas[0], datas[2]], [(40, 60), (24, 36)])
    assert status.tolist() == [0, 0] and batch.row_by_row_retries == 2


@pytest.mark.parametrize("status", [6, 8], ids=["EXECUTION_FAILED", "INTERNAL_ERROR"])
def test_a_failure_that_is_not_the_data_raises(fake, status):
    batch = _C.NvJpegBatch(fake.path, fake.path)
    fake.set(fail_status=status)  # the device's or the library's failure: no retry row by row
    with pytest.raises(RuntimeError, match=f"nvjpegDecodeBatched failed with status {status}"):
        decode_into(batch, [jpeg(16, 16, 11), jpeg(16, 16, 12)], [(16, 16), (16, 16)])
    assert batch.row_by_row_retries == 0 and fake.get("calls") == 1
    fake.set(fail_status=0)
    status, _ = decode_into(batch, [jpeg(16, 16, 11)], [(16, 16)])  # still usable after
    assert status.tolist() == [0] and fake.get("early_reuse") == 0


def test_construction_errors_name_the_problem(fake, tmp_path):
    fake.set(engines=0)
    with pytest.raises(RuntimeError, match="no hardware JPEG decoder"):
        _C.NvJpegBatch(fake.path, fake.path)
    with pytest.raises(RuntimeError, match="cannot load .*missing.so"):
        _C.NvJpegBatch(str(tmp_path / "missing.so"), fake.path)
    with pytest.raises(RuntimeError, match="has no cudaEventCreateWithFlags"):
        _C.NvJpegBatch(fake.path, "libjpeg.so.62")  # a library without the runtime's functions


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: tests/gpu runs the real library")
def test_the_real_library_without_a_gpu_fails_with_a_named_error(monkeypatch):
    # The wheel's libnvjpeg and the process's CUDA runtime load; with no GPU, creating the
    # hardware decoder fails with nvJPEG's status in the message, not a crash.
    runtime = gpu.cudart_library()
    assert os.path.isabs(runtime) and os.path.basename(runtime).startswith("libcudart.so"), runtime
    with pytest.raises(RuntimeError, match="nvjpegCreateEx failed with status"):
        _C.NvJpegBatch(gpu.nvjpeg_library(), runtime)
    monkeypatch.setattr(gpu, "ENGINE_CALLS", "nvjpeg")
    with pytest.raises(RuntimeError, match="nvJPEG could not create a hardware decoder on cpu"):
        NvJpegStandIn(fastdata.RandomResizedCrop(32))


def test_bad_arguments_raise_before_anything_is_written(fake):
    batch = _C.NvJpegBatch(fake.path, fake.path)
    out = np.zeros(100, np.uint8)
    with pytest.raises(ValueError, match="outside the output buffer"):
        batch.decode([jpeg(16, 16, 12)], out.ctypes.data, out.nbytes, np.asarray([0]), np.asarray([16]),
                     np.asarray([16]), 0)
    assert fake.get("calls") == 0 and not out.any()


# ---------------------------------------------------------------- the gpu decoder on nvJPEG's calls

# The decoder's host images are resampled by the Triton kernels under Triton's interpreter, which
# tests/conftest.py turns on only where there is no CUDA.
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="CUDA is present: Triton's interpreter is off (tests/gpu covers this)")


class NvJpegStandIn(gpu.NvImageCodecDecoder):
    """The gpu decoder making nvJPEG's calls, into host memory, with the stand-in library."""

    _allow_cpu = True

    def __init__(self, transform, **kw):
        super().__init__(transform, device=torch.device("cpu"), **kw)


@pytest.fixture
def nvjpeg_calls(fake, monkeypatch):
    monkeypatch.setattr(gpu, "ENGINE_CALLS", "nvjpeg")
    monkeypatch.setattr(gpu, "NVJPEG_LIBRARY", fake.path)
    monkeypatch.setattr(gpu, "CUDART_LIBRARY", fake.path)
    return fake


def test_the_switch_is_checked_and_takes_the_hardware_engines_only(nvjpeg_calls, monkeypatch):
    transform = fastdata.RandomResizedCrop(32)
    decoder = NvJpegStandIn(transform, lanes=2)
    assert decoder.engine_calls == "nvjpeg" and all(isinstance(d, _C.NvJpegBatch) for d in decoder._decoders)
    decoder.close()
    with pytest.raises(ValueError, match="hardware engines only"):
        NvJpegStandIn(transform, backend_kinds=("CPU_ONLY",))
    monkeypatch.setattr(gpu, "ENGINE_CALLS", "nvjpg")
    with pytest.raises(ValueError, match="ENGINE_CALLS"):
        NvJpegStandIn(transform)


@needs_interpreter
@pytest.mark.parametrize("pinned", [False, True])
def test_gpu_decoder_on_nvjpeg_calls_matches_nvimgcodec_calls_and_native(tmp_path, nvjpeg_calls, monkeypatch, pinned):
    # Over the hard cases: the same rows, pixels and failures as the decoder on nvImageCodec's
    # calls (its CPU backend, test_gpu_decoder.py's stand-in; both libraries here decode with
    # libjpeg, fancy upsampling on), and native's within
    # the PSNR the issue asks of the GPU path (test_gpu_decoder.py's setting).
    monkeypatch.setattr(gpu, "PINNED_BITSTREAMS", pinned)
    paths = hard_case_folder(tmp_path)
    names = [p.rsplit("/", 1)[-1] for p in paths]
    indices = np.arange(500, 500 + len(paths))
    transform = fastdata.RandomResizedCrop(64)
    cfg = dict(device="cpu", dtype=None, seed=9, threads=2)

    def run(backend):
        with make_backend(backend, transform, **cfg) as running:
            return running.run(paths, indices, 2) + (dict(running.stats),)

    a, fa, ra, stats = run(NvJpegStandIn(transform, lanes=2))
    monkeypatch.setattr(gpu, "ENGINE_CALLS", "nvimgcodec")
    from test_gpu_decoder import CpuEngines  # needs nvImageCodec (importorskip there); the rest here does not

    c, fc, rc, nvimgcodec_stats = run(CpuEngines(transform, lanes=2))
    b, fb, rb, _ = run("native")
    # baseline, gray and EXIF-rotated JPEGs reach nvJPEG's calls; CMYK, progressive, PNG,
    # truncated, garbage and missing go native (routing), as with nvImageCodec's calls
    to_gpu = {"gray.jpg", "exif6.jpg", "exif7.jpg"} | {n for n in names if n.endswith("_plain.jpg")}
    assert stats["gpu_rows"] == len(to_gpu) == nvjpeg_calls.get("rows_decoded") and stats["gpu_rejected"] == 0
    assert nvimgcodec_stats["gpu_rows"] == len(to_gpu)
    assert nvjpeg_calls.get("early_reuse") == 0
    assert torch.equal(a, c) and ra == rc == rb
    assert [(e.index, e.name) for e in fa] == [(e.index, e.name) for e in fc] == [(e.index, e.name) for e in fb]
    for row, name in enumerate(names):
        if row in ra:
            assert (a[row] == 0).all()
        else:  # the plan's crop box on both sides: a box one pixel off scores far below this
            assert psnr(a[row], b[row]) >= 35, (name, psnr(a[row], b[row]))


@needs_interpreter
def test_loader_on_nvjpeg_calls_skips_or_raises_on_damaged_files_and_counts_refusals(tmp_path, nvjpeg_calls):
    paths = hard_case_folder(tmp_path)[:-1]  # the missing file left out: the damaged ones stay
    # Its header reads and routes to nvJPEG's call; the stand-in fails its batch call (libjpeg has
    # no quantization table), so the refusal, the retry and gpu_rejected below are the stand-in's
    # behaviour: the hardware decoder may well decode damaged scan data without an error (as with
    # nvImageCodec's calls), or refuse this file at its header parse. The Loader's handling of a
    # refused row is what this checks.
    broken = tmp_path / "no_tables.jpg"
    broken.write_bytes(without_quantization_tables(photo_like_jpeg(3, 1, 64, 48)))
    paths.append(str(broken))
    source = fastdata.FileList(paths, list(range(len(paths))))
    transform = fastdata.RandomResizedCrop(32)
    with fastdata.Loader(source, len(paths), transform, device="cpu", threads=2, seed=1, on_error="skip",
                         backend=NvJpegStandIn(transform)) as loader:
        with pytest.warns(RuntimeWarning) as warned:
            batches = [x for x, _ in loader]
        stats = loader.stats()
    # replaced and counted: the garbage file and the one without tables (refused by nvJPEG's call,
    # then named by the native decoder); the truncated one decodes (grey below the cut), as native
    named = sorted(str(w.message).split("'")[1].rsplit("/", 1)[-1] for w in warned)
    assert named == ["garbage.jpg", "no_tables.jpg"] and stats.failures == 2
    assert sum(len(x) for x in batches) == len(paths)
    assert stats.gpu_rejected == 1 and stats.gpu_rows > 0
    with fastdata.Loader(source, len(paths), transform, device="cpu", threads=2, seed=1, on_error="raise",
                         backend=NvJpegStandIn(transform)) as loader:
        with pytest.raises(fastdata.BatchDecodeError, match="garbage.jpg") as raised:
            next(iter(loader))
    assert "no_tables.jpg" in str(raised.value)
