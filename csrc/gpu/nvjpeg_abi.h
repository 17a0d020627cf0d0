// The part of nvJPEG's C API (nvjpeg.h of CUDA 13, the nvidia-nvjpeg wheel) and of the CUDA
// runtime (cuda_runtime_api.h) that fastdata's nvJPEG batch decoder calls: constants, the one
// structure it passes (nvjpegImage_t) and the function signatures, written out here so that
// fastdata builds without CUDA headers and loads both libraries at run time (dlopen) only when a
// gpu decoder asks for nvJPEG's calls. Opaque handles are void pointers and C enums are int32_t
// (the same size and passing convention on x86-64 and aarch64).
// tests/decoders/test_nvjpeg_batch.py compiles a check of every constant and of the structure's
// layout against the installed headers, so a drift fails a test rather than a decode.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastdata::nvjpeg_abi {

// nvjpegStatus_t
constexpr int32_t kStatusSuccess = 0;
constexpr int32_t kStatusNotInitialized = 1;
constexpr int32_t kStatusInvalidParameter = 2;
constexpr int32_t kStatusBadJpeg = 3;
constexpr int32_t kStatusJpegNotSupported = 4;
constexpr int32_t kStatusAllocatorFailure = 5;
constexpr int32_t kStatusExecutionFailed = 6;
constexpr int32_t kStatusArchMismatch = 7;
constexpr int32_t kStatusInternalError = 8;
constexpr int32_t kStatusImplementationNotSupported = 9;
constexpr int32_t kStatusIncompleteBitstream = 10;

constexpr int32_t kBackendHardware = 3;    // nvjpegBackend_t NVJPEG_BACKEND_HARDWARE
constexpr int32_t kOutputRgbi = 5;         // nvjpegOutputFormat_t NVJPEG_OUTPUT_RGBI
constexpr int32_t kCss444 = 0;             // nvjpegChromaSubsampling_t NVJPEG_CSS_444
constexpr unsigned kFlagsUpsamplingWithInterpolation = 1u << 5;  // NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION
constexpr int kMaxComponent = 4;           // NVJPEG_MAX_COMPONENT

struct Image {  // nvjpegImage_t
  unsigned char* channel[kMaxComponent];
  size_t pitch[kMaxComponent];
};

using Handle = void*;      // nvjpegHandle_t
using JpegState = void*;   // nvjpegJpegState_t
using JpegStream = void*;  // nvjpegJpegStream_t
using CudaStream = void*;  // cudaStream_t

using CreateExFn = int32_t (*)(int32_t backend, void* dev_allocator, void* pinned_allocator, unsigned flags,
                               Handle* handle);
using DestroyFn = int32_t (*)(Handle);
using GetHardwareDecoderInfoFn = int32_t (*)(Handle, unsigned* num_engines, unsigned* num_cores_per_engine);
using JpegStateCreateFn = int32_t (*)(Handle, JpegState*);
using JpegStateDestroyFn = int32_t (*)(JpegState);
using JpegStreamCreateFn = int32_t (*)(Handle, JpegStream*);
using JpegStreamDestroyFn = int32_t (*)(JpegStream);
using JpegStreamParseHeaderFn = int32_t (*)(Handle, const unsigned char* data, size_t length, JpegStream);
using JpegStreamGetFrameDimensionsFn = int32_t (*)(JpegStream, unsigned* width, unsigned* height);
using DecodeBatchedSupportedFn = int32_t (*)(Handle, JpegStream, int* is_supported);
using DecodeBatchedPreAllocateFn = int32_t (*)(Handle, JpegState, int batch_size, int width, int height,
                                               int32_t chroma_subsampling, int32_t output_format);
using DecodeBatchedInitializeFn = int32_t (*)(Handle, JpegState, int batch_size, int max_cpu_threads,
                                              int32_t output_format);
using DecodeBatchedFn = int32_t (*)(Handle, JpegState, const unsigned char* const* data, const size_t* lengths,
                                    Image* destinations, CudaStream stream);

// CUDA runtime
using CudaEvent = void*;  // cudaEvent_t
constexpr int32_t kCudaSuccess = 0;         // cudaError_t cudaSuccess
constexpr unsigned kEventBlockingSync = 0x01;  // cudaEventBlockingSync
constexpr unsigned kEventDisableTiming = 0x02;  // cudaEventDisableTiming
using EventCreateWithFlagsFn = int32_t (*)(CudaEvent*, unsigned flags);
using EventRecordFn = int32_t (*)(CudaEvent, CudaStream);
using EventSynchronizeFn = int32_t (*)(CudaEvent);
using EventDestroyFn = int32_t (*)(CudaEvent);
using StreamSynchronizeFn = int32_t (*)(CudaStream);
using GetErrorStringFn = const char* (*)(int32_t);

}  // namespace fastdata::nvjpeg_abi
