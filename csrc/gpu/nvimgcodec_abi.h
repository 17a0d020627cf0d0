// The part of nvImageCodec 0.9's C ABI (nvimgcodec.h) that fastdata's batch decoder calls:
// the types, constants and function signatures, written out here so that fastdata builds
// without nvImageCodec or CUDA headers and loads the library at run time (dlopen) only when
// backend="gpu"/"hybrid" asks for it. The layouts follow the header field by field;
// tests/decoders/test_nvimgcodec_batch.py compiles a check of every size, offset and constant
// against the real header of the installed wheel, so a drift fails a test rather than a decode.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fastdata::nvimgcodec_abi {

// nvimgcodecStructureType_t: the values used here (enum order of the header).
enum StructureType : int32_t {
  kInstanceCreateInfo = 2,
  kDecodeParams = 5,
  kOrientation = 7,
  kImageInfo = 11,
  kImagePlaneInfo = 12,
  kBackend = 17,
  kBackendParams = 29,
  kExecutionParams = 30,
  kProperties = 1,
};

constexpr int32_t kStatusSuccess = 0;               // nvimgcodecStatus_t
constexpr uint32_t kProcessingSuccess = 0x1;        // nvimgcodecProcessingStatus_t
constexpr int kDeviceCpuOnly = -99999;              // NVIMGCODEC_DEVICE_CPU_ONLY
constexpr int32_t kBackendCpuOnly = 1;              // nvimgcodecBackendKind_t
constexpr int32_t kBackendGpuOnly = 2;
constexpr int32_t kBackendHybridCpuGpu = 3;
constexpr int32_t kBackendHwGpuOnly = 4;
constexpr int32_t kLoadHintPolicyFixed = 2;         // nvimgcodecLoadHintPolicy_t
constexpr int32_t kColorSpecSrgb = 1;               // nvimgcodecColorSpec_t
constexpr int32_t kSamplingNone = 0;                // nvimgcodecChromaSubsampling_t
constexpr int32_t kSampleFormatInterleavedRgb = 8;  // nvimgcodecSampleFormat_t I_RGB
constexpr int32_t kSampleUint8 = 0x0802;            // nvimgcodecSampleDataType_t
constexpr int32_t kBufferStridedDevice = 1;         // nvimgcodecImageBufferKind_t
constexpr int32_t kBufferStridedHost = 2;
constexpr int kMaxCodecName = 256;                  // NVIMGCODEC_MAX_CODEC_NAME_SIZE
constexpr int kMaxPlanes = 32;                      // NVIMGCODEC_MAX_NUM_PLANES

struct Instance;
struct Decoder;
struct CodeStream;
struct Image;
struct Future;

struct Properties {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  uint32_t version;  // major * 1000 + minor * 100 + patch
  uint32_t cudart_version;
};

struct InstanceCreateInfo {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  int load_builtin_modules;
  int load_extension_modules;
  const char* extension_modules_path;
  int create_debug_messenger;
  const void* debug_messenger_desc;
  uint32_t message_severity;
  uint32_t message_category;
};

struct BackendParams {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  float load_hint;
  int32_t load_hint_policy;
};

struct Backend {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  int32_t kind;
  BackendParams params;
};

struct ExecutionParams {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  void* device_allocator;
  void* pinned_allocator;
  int max_num_cpu_threads;
  void* executor;
  int device_id;
  int pre_init;
  int skip_pre_sync;
  int num_backends;
  const Backend* backends;
};

struct Orientation {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  int rotated;
  int flip_x;
  int flip_y;
};

struct ImagePlaneInfo {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  uint32_t width;
  uint32_t height;
  size_t row_stride;
  uint32_t num_channels;
  int32_t sample_type;
  uint8_t precision;
};

struct ImageInfo {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  char codec_name[kMaxCodecName];
  int32_t color_spec;
  int32_t chroma_subsampling;
  int32_t sample_format;
  Orientation orientation;
  uint32_t num_planes;
  ImagePlaneInfo plane_info[kMaxPlanes];
  void* buffer;
  int32_t buffer_kind;
  void* cuda_stream;  // cudaStream_t
};

struct DecodeParams {
  int32_t struct_type;
  size_t struct_size;
  void* struct_next;
  int apply_exif_orientation;
};

// The functions, as loaded by name (nvimgcodec.h's signatures; status results are int32_t).
using GetPropertiesFn = int32_t (*)(Properties*);
using InstanceCreateFn = int32_t (*)(Instance**, const InstanceCreateInfo*);
using InstanceDestroyFn = int32_t (*)(Instance*);
using DecoderCreateFn = int32_t (*)(Instance*, Decoder**, const ExecutionParams*, const char*);
using DecoderDestroyFn = int32_t (*)(Decoder*);
using CodeStreamCreateFromHostMemFn = int32_t (*)(Instance*, CodeStream**, const unsigned char*, size_t,
                                                  const void* code_stream_view);
using CodeStreamDestroyFn = int32_t (*)(CodeStream*);
using CodeStreamGetImageInfoFn = int32_t (*)(CodeStream*, ImageInfo*);
using ImageCreateFn = int32_t (*)(Instance*, Image**, const ImageInfo*);
using ImageDestroyFn = int32_t (*)(Image*);
using DecoderDecodeFn = int32_t (*)(Decoder*, CodeStream* const*, Image* const*, int, const DecodeParams*, Future**);
using FutureWaitForAllFn = int32_t (*)(Future*);
using FutureGetProcessingStatusFn = int32_t (*)(Future*, uint32_t*, size_t*);
using FutureDestroyFn = int32_t (*)(Future*);

// A zeroed structure T with its type and size filled in, as every nvImageCodec call expects.
template <typename T>
T with_header(StructureType type) {
  T value;
  std::memset(&value, 0, sizeof(value));
  value.struct_type = type;
  value.struct_size = sizeof(T);
  return value;
}

}  // namespace fastdata::nvimgcodec_abi
