#include "gpu/nvjpeg_batch.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace fastdata {

namespace abi = nvjpeg_abi;

struct NvJpegApi {
  abi::CreateExFn create_ex;
  abi::DestroyFn destroy;
  abi::GetHardwareDecoderInfoFn hardware_info;
  abi::JpegStateCreateFn state_create;
  abi::JpegStateDestroyFn state_destroy;
  abi::JpegStreamCreateFn stream_create;
  abi::JpegStreamDestroyFn stream_destroy;
  abi::JpegStreamParseHeaderFn parse_header;
  abi::JpegStreamGetFrameDimensionsFn frame_dimensions;
  abi::DecodeBatchedSupportedFn supported;
  abi::DecodeBatchedPreAllocateFn preallocate;
  abi::DecodeBatchedInitializeFn initialize;
  abi::DecodeBatchedFn decode_batched;
  abi::EventCreateWithFlagsFn event_create;
  abi::EventRecordFn event_record;
  abi::EventSynchronizeFn event_synchronize;
  abi::EventDestroyFn event_destroy;
  abi::StreamSynchronizeFn stream_synchronize;
  abi::GetErrorStringFn error_string;
};

namespace {

void check(const char* call, int32_t status) {
  if (status != abi::kStatusSuccess) {
    throw std::runtime_error(std::string("nvJPEG: ") + call + " failed with status " + std::to_string(status));
  }
}

template <typename Fn>
void load(void* lib, const char* library, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) throw std::runtime_error(std::string(library) + " has no " + name);
}

void* open_library(const std::string& name, bool prefer_loaded) {
  // The CUDA runtime: the process's own copy when there is one (torch's), so that the events
  // live in the runtime that made the streams they are recorded on.
  void* lib = prefer_loaded ? dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD) : nullptr;
  // RTLD_LOCAL: reached through dlsym only; another copy in the process (DALI's, torch's) keeps its own.
  if (lib == nullptr) lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("nvJPEG: cannot load " + name + ": " + (why ? why : "unknown error"));
  }
  return lib;
}

// Loaded once per pair of libraries and never closed (handles may outlive any one decoder).
const NvJpegApi* load_api(const std::string& nvjpeg, const std::string& cudart) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, std::unique_ptr<NvJpegApi>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(nvjpeg, cudart);
  auto found = loaded.find(key);
  if (found != loaded.end()) return found->second.get();
  void* jpeg = open_library(nvjpeg, false);
  void* rt = open_library(cudart, true);
  auto api = std::make_unique<NvJpegApi>();
  const char* j = nvjpeg.c_str();
  const char* r = cudart.c_str();
  load(jpeg, j, "nvjpegCreateEx", &api->create_ex);
  load(jpeg, j, "nvjpegDestroy", &api->destroy);
  load(jpeg, j, "nvjpegGetHardwareDecoderInfo", &api->hardware_info);
  load(jpeg, j, "nvjpegJpegStateCreate", &api->state_create);
  load(jpeg, j, "nvjpegJpegStateDestroy", &api->state_destroy);
  load(jpeg, j, "nvjpegJpegStreamCreate", &api->stream_create);
  load(jpeg, j, "nvjpegJpegStreamDestroy", &api->stream_destroy);
  load(jpeg, j, "nvjpegJpegStreamParseHeader", &api->parse_header);
  load(jpeg, j, "nvjpegJpegStreamGetFrameDimensions", &api->frame_dimensions);
  load(jpeg, j, "nvjpegDecodeBatchedSupported", &api->supported);
  load(jpeg, j, "nvjpegDecodeBatchedPreAllocate", &api->preallocate);
  load(jpeg, j, "nvjpegDecodeBatchedInitialize", &api->initialize);
  load(jpeg, j, "nvjpegDecodeBatched", &api->decode_batched);
  load(rt, r, "cudaEventCreateWithFlags", &api->event_create);
  load(rt, r, "cudaEventRecord", &api->event_record);
  load(rt, r, "cudaEventSynchronize", &api->event_synchronize);
  load(rt, r, "cudaEventDestroy", &api->event_destroy);
  load(rt, r, "cudaStreamSynchronize", &api->stream_synchronize);
  load(rt, r, "cudaGetErrorString", &api->error_string);
  const NvJpegApi* result = api.get();
  loaded.emplace(key, std::move(api));
  return result;
}

void check_cuda(const NvJpegApi* api, const char* call, int32_t error) {
  if (error != abi::kCudaSuccess) {
    const char* text = api->error_string(error);
    throw std::runtime_error(std::string("CUDA: ") + call + " failed with error " + std::to_string(error) + " (" +
                             (text ? text : "?") + ")");
  }
}

// Statuses with which nvJPEG fails a batch call because of a row's data: the call is made again
// row by row to find the row. Any other status (EXECUTION_FAILED is "error during the execution of
// the device tasks") is the library's or CUDA's failure, and raises.
bool data_failure(int32_t status) {
  return status == abi::kStatusBadJpeg || status == abi::kStatusJpegNotSupported ||
         status == abi::kStatusIncompleteBitstream;
}

// A header parse that fails on the data: those statuses, and INVALID_PARAMETER, which a parser may
// give for bytes that are no JPEG. The row goes back to the native decoder, which names the damage
// (our own parser routed only files it read as baseline JPEGs ending in EOI, so these are rare).
bool unparsable(int32_t status) { return data_failure(status) || status == abi::kStatusInvalidParameter; }

}  // namespace

NvJpegBatch::NvJpegBatch(const std::string& nvjpeg_library, const std::string& cudart_library) {
  api_ = load_api(nvjpeg_library, cudart_library);
  // A constructor that throws runs no destructor: what it made is released here (release()).
  try {
    check("nvjpegCreateEx", api_->create_ex(abi::kBackendHardware, nullptr, nullptr,
                                            abi::kFlagsUpsamplingWithInterpolation, &handle_));
    check("nvjpegGetHardwareDecoderInfo", api_->hardware_info(handle_, &engines_, &cores_per_engine_));
    if (engines_ == 0) throw std::runtime_error("nvJPEG: this GPU has no hardware JPEG decoder");
    check("nvjpegJpegStateCreate", api_->state_create(handle_, &state_));
    check("nvjpegJpegStreamCreate", api_->stream_create(handle_, &parsed_));
    // A batch of one at 1x1, as nvImageCodec does by default: what it buys is nvJPEG's pooling
    // of its buffers across calls (nvImageCodec measured >20% for 8-GPU training, its comment).
    // The twenty-third session's ctypes harness, which fell to 306 img/s beside training, did not
    // make this call; whether that was the cause was not traced.
    check("nvjpegDecodeBatchedPreAllocate",
          api_->preallocate(handle_, state_, 1, 1, 1, abi::kCss444, abi::kOutputRgbi));
    // The wait for the previous call sleeps: a default event's wait spins a core for its length.
    check_cuda(api_, "cudaEventCreateWithFlags",
               api_->event_create(&done_, abi::kEventBlockingSync | abi::kEventDisableTiming));
  } catch (...) {
    release();
    throw;
  }
}

NvJpegBatch::~NvJpegBatch() { release(); }

void NvJpegBatch::release() noexcept {
  // Cannot raise (the destructor's and a failed constructor's): statuses are dropped on purpose.
  // The last call's work is waited for first, since the state's buffers may still be in use by it.
  if (done_ != nullptr) {
    if (pending_) (void)api_->event_synchronize(done_);
    (void)api_->event_destroy(done_);
    done_ = nullptr;
  }
  if (parsed_ != nullptr) (void)api_->stream_destroy(parsed_);
  if (state_ != nullptr) (void)api_->state_destroy(state_);
  if (handle_ != nullptr) (void)api_->destroy(handle_);
  parsed_ = state_ = handle_ = nullptr;
}

void NvJpegBatch::wait_for_previous_call() {
  // nvImageCodec waits here too: the state's pinned staging may still feed the previous call's
  // uploads, and nvjpegDecodeBatchedInitialize resets it. Still pending if the wait fails, so that
  // release() waits again before the state goes.
  if (!pending_) return;
  check_cuda(api_, "cudaEventSynchronize", api_->event_synchronize(done_));
  pending_ = false;
}

int32_t NvJpegBatch::call(const std::vector<EncodedRow>& all, const std::vector<size_t>& rows, uint8_t* out,
                          void* stream) {
  wait_for_previous_call();
  datas_.clear();
  lengths_.clear();
  images_.assign(rows.size(), abi::Image{});
  for (size_t k = 0; k < rows.size(); ++k) {
    const EncodedRow& row = all[rows[k]];
    datas_.push_back(row.data);
    lengths_.push_back(row.size);
    images_[k].channel[0] = out + row.offset;
    images_[k].pitch[0] = static_cast<size_t>(row.width) * 3;
  }
  const int n = static_cast<int>(rows.size());
  int32_t status = api_->initialize(handle_, state_, n, 1, abi::kOutputRgbi);
  if (status == abi::kStatusSuccess) {
    status = api_->decode_batched(handle_, state_, datas_.data(), lengths_.data(), images_.data(), stream);
  }
  // Recorded whatever the status: a failed call may have queued work that uses the state.
  const int32_t recorded = api_->event_record(done_, stream);
  if (recorded != abi::kCudaSuccess) {
    // No event marks the queued work: wait for the stream itself before the error goes up (the
    // state, and the caller's buffers, must outlive that work). Its own error is the same one.
    (void)api_->stream_synchronize(stream);
    check_cuda(api_, "cudaEventRecord", recorded);
  }
  pending_ = true;
  return status;
}

std::vector<GpuDecodeStatus> NvJpegBatch::decode(const std::vector<EncodedRow>& rows, uint8_t* out,
                                                 void* cuda_stream) {
  std::lock_guard<std::mutex> lock(mutex_);  // one call at a time: the state is the instance's
  std::vector<GpuDecodeStatus> result(rows.size(), GpuDecodeStatus::kRefused);
  std::vector<size_t> queued;
  queued.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const EncodedRow& row = rows[i];
    const int32_t parsed = api_->parse_header(handle_, row.data, row.size, parsed_);
    if (parsed != abi::kStatusSuccess) {
      if (!unparsable(parsed)) check("nvjpegJpegStreamParseHeader", parsed);
      result[i] = GpuDecodeStatus::kUnparsed;  // a counted hand-back to the native decoder
      continue;
    }
    unsigned width = 0, height = 0;
    check("nvjpegJpegStreamGetFrameDimensions", api_->frame_dimensions(parsed_, &width, &height));
    // The caller planned the stored size from its own parse: a frame nvJPEG reads otherwise is
    // not decoded into a slot sized for something else.
    if (static_cast<int64_t>(height) != row.height || static_cast<int64_t>(width) != row.width) {
      result[i] = GpuDecodeStatus::kOtherShape;
      continue;
    }
    int unsupported = 1;  // nvJPEG sets 0 when its hardware decoder takes the stream
    check("nvjpegDecodeBatchedSupported", api_->supported(handle_, parsed_, &unsupported));
    if (unsupported != 0) continue;  // kRefused
    queued.push_back(i);
  }
  if (queued.empty()) return result;
  const int32_t status = call(rows, queued, out, cuda_stream);
  if (status == abi::kStatusSuccess) {
    for (size_t i : queued) result[i] = GpuDecodeStatus::kDecoded;
    return result;
  }
  if (!data_failure(status)) check("nvjpegDecodeBatched", status);
  ++retries_;
  for (size_t i : queued) {
    const int32_t alone = call(rows, {i}, out, cuda_stream);
    if (alone == abi::kStatusSuccess) {
      result[i] = GpuDecodeStatus::kDecoded;
    } else if (!data_failure(alone)) {
      check("nvjpegDecodeBatched (one row)", alone);
    }  // else kRefused: the native decoder takes it and reports its damage
  }
  return result;
}

}  // namespace fastdata
