#include "gpu/nvimgcodec_batch.h"

#include <chrono>
#include <stdexcept>
#include <utility>

namespace fastdata {

namespace abi = nvimgcodec_abi;

namespace {

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

}  // namespace

NvImageCodecBatch::NvImageCodecBatch(std::shared_ptr<NvImageCodecInstance> instance, int device_id,
                                     int max_cpu_threads, const std::vector<int32_t>& backend_kinds,
                                     const std::string& options)
    : instance_(std::move(instance)) {
  if (!instance_) throw std::invalid_argument("an NvImageCodecBatch needs an nvImageCodec instance");
  if (max_cpu_threads < 1) throw std::invalid_argument("max_cpu_threads must be at least 1");
  if (backend_kinds.empty()) throw std::invalid_argument("backend_kinds must name at least one backend");
  std::vector<abi::Backend> backends;
  host_buffers_ = true;
  for (int32_t kind : backend_kinds) {
    if (kind < abi::kBackendCpuOnly || kind > abi::kBackendHwGpuOnly) {
      throw std::invalid_argument("unknown nvImageCodec backend kind " + std::to_string(kind));
    }
    auto backend = abi::with_header<abi::Backend>(abi::kBackend);
    backend.kind = kind;
    backend.params = abi::with_header<abi::BackendParams>(abi::kBackendParams);
    backend.params.load_hint = 1.0f;
    backend.params.load_hint_policy = abi::kLoadHintPolicyFixed;
    backends.push_back(backend);
    host_buffers_ = host_buffers_ && kind == abi::kBackendCpuOnly;
  }
  if (host_buffers_ != (device_id == abi::kDeviceCpuOnly)) {
    throw std::invalid_argument("the CPU-only backend goes with device_id=CPU_ONLY, and only with it");
  }
  auto exec = abi::with_header<abi::ExecutionParams>(abi::kExecutionParams);
  exec.device_id = device_id;
  exec.max_num_cpu_threads = max_cpu_threads;
  exec.num_backends = static_cast<int>(backends.size());
  exec.backends = backends.data();
  const auto started = std::chrono::steady_clock::now();
  const NvImageCodecApi& api = instance_->api();
  check_nvimgcodec("nvimgcodecDecoderCreate",
                   api.decoder_create(instance_->handle(), &decoder_, &exec, options.c_str()));
  create_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

NvImageCodecBatch::~NvImageCodecBatch() {
  // A destructor cannot raise: a failed destroy leaves nothing to retry.
  if (decoder_ != nullptr) (void)instance_->api().decoder_destroy(decoder_);
}

std::vector<GpuDecodeStatus> NvImageCodecBatch::decode(const std::vector<EncodedRow>& rows, uint8_t* out,
                                                       void* cuda_stream) {
  const NvImageCodecApi& api = instance_->api();
  std::vector<GpuDecodeStatus> result(rows.size(), GpuDecodeStatus::kRefused);
  CallResources call{&api, {}, {}, nullptr};
  std::vector<abi::CodeStream*> queued_streams;  // parallel to call.images
  std::vector<size_t> queued_rows;
  call.streams.reserve(rows.size());
  call.images.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const EncodedRow& row = rows[i];
    abi::CodeStream* stream = nullptr;
    if (api.code_stream_from_host_mem(instance_->handle(), &stream, row.data, row.size, nullptr) !=
            abi::kStatusSuccess ||
        stream == nullptr) {
      result[i] = GpuDecodeStatus::kUnparsed;  // not an image nvImageCodec can read: a counted hand-back
      continue;
    }
    call.streams.push_back(stream);
    auto info = abi::with_header<abi::ImageInfo>(abi::kImageInfo);
    if (api.code_stream_image_info(stream, &info) != abi::kStatusSuccess) {
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
    if (api.image_create(instance_->handle(), &image, &info) != abi::kStatusSuccess || image == nullptr) {
      result[i] = GpuDecodeStatus::kRefused;  // this row goes back to the native decoder, counted
      continue;
    }
    call.images.push_back(image);
    queued_streams.push_back(stream);
    queued_rows.push_back(i);
  }
  if (queued_rows.empty()) return result;
  auto params = abi::with_header<abi::DecodeParams>(abi::kDecodeParams);
  params.apply_exif_orientation = 0;  // stored orientation: the resampler folds EXIF into its addressing
  check_nvimgcodec("nvimgcodecDecoderDecode", api.decoder_decode(decoder_, queued_streams.data(), call.images.data(),
                                                        static_cast<int>(queued_rows.size()), &params,
                                                        &call.future));
  check_nvimgcodec("nvimgcodecFutureWaitForAll", api.future_wait(call.future));
  std::vector<uint32_t> statuses(queued_rows.size(), 0);
  size_t count = 0;
  check_nvimgcodec("nvimgcodecFutureGetProcessingStatus", api.future_status(call.future, statuses.data(), &count));
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
