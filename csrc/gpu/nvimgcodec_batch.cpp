#include "gpu/nvimgcodec_batch.h"

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace fastdata {

namespace abi = nvimgcodec_abi;

struct NvImageCodecApi {
  abi::GetPropertiesFn get_properties;
  abi::InstanceCreateFn instance_create;
  abi::InstanceDestroyFn instance_destroy;
  abi::DecoderCreateFn decoder_create;
  abi::DecoderDestroyFn decoder_destroy;
  abi::CodeStreamCreateFromHostMemFn code_stream_from_host_mem;
  abi::CodeStreamDestroyFn code_stream_destroy;
  abi::CodeStreamGetImageInfoFn code_stream_image_info;
  abi::ImageCreateFn image_create;
  abi::ImageDestroyFn image_destroy;
  abi::DecoderDecodeFn decoder_decode;
  abi::FutureWaitForAllFn future_wait;
  abi::FutureGetProcessingStatusFn future_status;
  abi::FutureDestroyFn future_destroy;
};

namespace {

[[noreturn]] void fail(const char* call, int32_t status) {
  throw std::runtime_error(std::string("nvImageCodec: ") + call + " failed with status " + std::to_string(status));
}

void check(const char* call, int32_t status) {
  if (status != abi::kStatusSuccess) fail(call, status);
}

template <typename Fn>
void load(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) throw std::runtime_error(std::string("nvImageCodec: the library has no ") + name);
}

// The library's functions, loaded once per path: dlopen keeps one copy of a library per
// process, and it is never closed (instances may outlive any one decoder object).
NvImageCodecApi* load_api(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<NvImageCodecApi>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find(path);
  if (found != loaded.end()) return found->second.get();
  // RTLD_LOCAL: everything is reached through dlsym; another copy of the library in the
  // process (DALI bundles one) must not see these symbols.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("nvImageCodec: cannot load " + path + ": " + (why ? why : "unknown error"));
  }
  auto api = std::make_unique<NvImageCodecApi>();
  load(lib, "nvimgcodecGetProperties", &api->get_properties);
  load(lib, "nvimgcodecInstanceCreate", &api->instance_create);
  load(lib, "nvimgcodecInstanceDestroy", &api->instance_destroy);
  load(lib, "nvimgcodecDecoderCreate", &api->decoder_create);
  load(lib, "nvimgcodecDecoderDestroy", &api->decoder_destroy);
  load(lib, "nvimgcodecCodeStreamCreateFromHostMem", &api->code_stream_from_host_mem);
  load(lib, "nvimgcodecCodeStreamDestroy", &api->code_stream_destroy);
  load(lib, "nvimgcodecCodeStreamGetImageInfo", &api->code_stream_image_info);
  load(lib, "nvimgcodecImageCreate", &api->image_create);
  load(lib, "nvimgcodecImageDestroy", &api->image_destroy);
  load(lib, "nvimgcodecDecoderDecode", &api->decoder_decode);
  load(lib, "nvimgcodecFutureWaitForAll", &api->future_wait);
  load(lib, "nvimgcodecFutureGetProcessingStatus", &api->future_status);
  load(lib, "nvimgcodecFutureDestroy", &api->future_destroy);
  NvImageCodecApi* result = api.get();
  loaded.emplace(path, std::move(api));
  return result;
}

// Everything one decode call creates, destroyed on every path out of it.
struct CallResources {
  const NvImageCodecApi* api;
  std::vector<abi::CodeStream*> streams;
  std::vector<abi::Image*> images;
  abi::Future* future = nullptr;
  ~CallResources() {
    // Destruction cannot report to anyone: its statuses are dropped on purpose (the
    // objects are gone either way), after the wait that precedes every normal exit.
    if (future != nullptr) (void)api->future_destroy(future);
    for (abi::Image* image : images) (void)api->image_destroy(image);
    for (abi::CodeStream* stream : streams) (void)api->code_stream_destroy(stream);
  }
};

template <typename T>
T header(abi::StructureType type) {
  T value;
  std::memset(&value, 0, sizeof(value));
  value.struct_type = type;
  value.struct_size = sizeof(T);
  return value;
}

}  // namespace

NvImageCodecBatch::NvImageCodecBatch(const std::string& library, int device_id, int max_cpu_threads,
                                     const std::vector<int32_t>& backend_kinds, const std::string& options) {
  // Every argument is checked before the library is touched: creating an instance loads its
  // codec extensions, and only the decoder's creation below can fail after it.
  if (max_cpu_threads < 1) throw std::invalid_argument("max_cpu_threads must be at least 1");
  if (backend_kinds.empty()) throw std::invalid_argument("backend_kinds must name at least one backend");
  std::vector<abi::Backend> backends;
  host_buffers_ = true;
  for (int32_t kind : backend_kinds) {
    if (kind < abi::kBackendCpuOnly || kind > abi::kBackendHwGpuOnly) {
      throw std::invalid_argument("unknown nvImageCodec backend kind " + std::to_string(kind));
    }
    auto backend = header<abi::Backend>(abi::kBackend);
    backend.kind = kind;
    backend.params = header<abi::BackendParams>(abi::kBackendParams);
    backend.params.load_hint = 1.0f;
    backend.params.load_hint_policy = abi::kLoadHintPolicyFixed;
    backends.push_back(backend);
    host_buffers_ = host_buffers_ && kind == abi::kBackendCpuOnly;
  }
  if (host_buffers_ != (device_id == abi::kDeviceCpuOnly)) {
    throw std::invalid_argument("the CPU-only backend goes with device_id=CPU_ONLY, and only with it");
  }
  api_ = load_api(library);
  auto properties = header<abi::Properties>(abi::kProperties);
  check("nvimgcodecGetProperties", api_->get_properties(&properties));
  version_ = properties.version;
  // The structures above are 0.9's; another minor version may lay them out differently.
  if (version_ / 100 != 9) {
    throw std::runtime_error("nvImageCodec " + std::to_string(version_ / 1000) + "." +
                             std::to_string(version_ % 1000 / 100) + " is installed; fastdata's batch decoder "
                             "is built for 0.9 (pip install 'nvidia-nvimgcodec-cu13>=0.9,<0.10')");
  }
  auto create = header<abi::InstanceCreateInfo>(abi::kInstanceCreateInfo);
  create.load_builtin_modules = 1;
  create.load_extension_modules = 1;
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  check("nvimgcodecInstanceCreate", api_->instance_create(&instance_, &create));
  const auto instance_made = Clock::now();
  instance_seconds_ = std::chrono::duration<double>(instance_made - started).count();
  auto exec = header<abi::ExecutionParams>(abi::kExecutionParams);
  exec.device_id = device_id;
  exec.max_num_cpu_threads = max_cpu_threads;
  exec.num_backends = static_cast<int>(backends.size());
  exec.backends = backends.data();
  const int32_t status = api_->decoder_create(instance_, &decoder_, &exec, options.c_str());
  decoder_seconds_ = std::chrono::duration<double>(Clock::now() - instance_made).count();
  if (status != abi::kStatusSuccess) {
    (void)api_->instance_destroy(instance_);  // the constructor throws: nothing else owns it
    fail("nvimgcodecDecoderCreate", status);
  }
}

NvImageCodecBatch::~NvImageCodecBatch() {
  // A destructor cannot raise: a failed destroy leaves nothing to retry.
  if (decoder_ != nullptr) (void)api_->decoder_destroy(decoder_);
  if (instance_ != nullptr) (void)api_->instance_destroy(instance_);
}

std::vector<GpuDecodeStatus> NvImageCodecBatch::decode(const std::vector<EncodedRow>& rows, uint8_t* out,
                                                       void* cuda_stream) {
  std::vector<GpuDecodeStatus> result(rows.size(), GpuDecodeStatus::kRefused);
  CallResources call{api_, {}, {}, nullptr};
  std::vector<abi::CodeStream*> queued_streams;  // parallel to call.images
  std::vector<size_t> queued_rows;
  call.streams.reserve(rows.size());
  call.images.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const EncodedRow& row = rows[i];
    abi::CodeStream* stream = nullptr;
    if (api_->code_stream_from_host_mem(instance_, &stream, row.data, row.size, nullptr) != abi::kStatusSuccess ||
        stream == nullptr) {
      result[i] = GpuDecodeStatus::kUnparsed;  // not an image nvImageCodec can read: a counted hand-back
      continue;
    }
    call.streams.push_back(stream);
    auto info = header<abi::ImageInfo>(abi::kImageInfo);
    if (api_->code_stream_image_info(stream, &info) != abi::kStatusSuccess) {
      result[i] = GpuDecodeStatus::kUnparsed;
      continue;
    }
    // The caller planned the stored size from its own header parse; a file whose frame says
    // otherwise to nvImageCodec is not decoded into a slot sized for something else.
    if (info.num_planes < 1 || info.plane_info[0].height != static_cast<uint64_t>(row.height) ||
        info.plane_info[0].width != static_cast<uint64_t>(row.width)) {
      result[i] = GpuDecodeStatus::kOtherShape;
      continue;
    }
    info.color_spec = abi::kColorSpecSrgb;
    info.chroma_subsampling = abi::kSamplingNone;
    info.sample_format = abi::kSampleFormatInterleavedRgb;
    info.num_planes = 1;
    abi::ImagePlaneInfo& plane = info.plane_info[0];
    plane.num_channels = 3;
    plane.row_stride = static_cast<size_t>(row.width) * 3;
    plane.sample_type = abi::kSampleUint8;
    plane.precision = 0;  // the type's full 8 bits
    info.buffer = out + row.offset;
    info.buffer_kind = host_buffers_ ? abi::kBufferStridedHost : abi::kBufferStridedDevice;
    info.cuda_stream = cuda_stream;
    abi::Image* image = nullptr;
    if (api_->image_create(instance_, &image, &info) != abi::kStatusSuccess || image == nullptr) {
      result[i] = GpuDecodeStatus::kRefused;  // this row goes back to the native decoder, counted
      continue;
    }
    call.images.push_back(image);
    queued_streams.push_back(stream);
    queued_rows.push_back(i);
  }
  if (queued_rows.empty()) return result;
  auto params = header<abi::DecodeParams>(abi::kDecodeParams);
  params.apply_exif_orientation = 0;  // stored orientation: the resampler folds EXIF into its addressing
  check("nvimgcodecDecoderDecode", api_->decoder_decode(decoder_, queued_streams.data(), call.images.data(),
                                                        static_cast<int>(queued_rows.size()), &params,
                                                        &call.future));
  check("nvimgcodecFutureWaitForAll", api_->future_wait(call.future));
  std::vector<uint32_t> statuses(queued_rows.size(), 0);
  size_t count = 0;
  check("nvimgcodecFutureGetProcessingStatus", api_->future_status(call.future, statuses.data(), &count));
  if (count != queued_rows.size()) {
    throw std::runtime_error("nvImageCodec: " + std::to_string(count) + " statuses for a batch of " +
                             std::to_string(queued_rows.size()));
  }
  for (size_t k = 0; k < queued_rows.size(); ++k) {
    result[queued_rows[k]] = statuses[k] == abi::kProcessingSuccess ? GpuDecodeStatus::kDecoded
                                                                      : GpuDecodeStatus::kRefused;
  }
  return result;
}

}  // namespace fastdata
