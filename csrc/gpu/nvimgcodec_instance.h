// One nvImageCodec instance (nvimgcodecInstanceCreate: the library's codec modules and
// extensions, loaded), which any number of NvImageCodecBatch decoders are made on and share.
//
// Why shared: making an instance took 1.03 s on an H100, and 16 of them 16.4 s one after
// another or in 16 threads alike (2026-12-06): hybrid's 4 lanes x 4 subsamplings paid that once
// per decoder. nvImageCodec's own Python API makes every decoder on one instance per process.
//
// libnvimgcodec is loaded at run time (dlopen of the path the caller names: the wheel's copy),
// so fastdata builds and imports without it.
#pragma once
#include <cstdint>
#include <string>

#include "gpu/nvimgcodec_abi.h"

namespace fastdata {

// The library's functions, loaded once per path and process (nvimgcodec_instance.cpp).
struct NvImageCodecApi {
  nvimgcodec_abi::GetPropertiesFn get_properties;
  nvimgcodec_abi::InstanceCreateFn instance_create;
  nvimgcodec_abi::InstanceDestroyFn instance_destroy;
  nvimgcodec_abi::DecoderCreateFn decoder_create;
  nvimgcodec_abi::DecoderDestroyFn decoder_destroy;
  nvimgcodec_abi::CodeStreamCreateFromHostMemFn code_stream_from_host_mem;
  nvimgcodec_abi::CodeStreamDestroyFn code_stream_destroy;
  nvimgcodec_abi::CodeStreamGetImageInfoFn code_stream_image_info;
  nvimgcodec_abi::ImageCreateFn image_create;
  nvimgcodec_abi::ImageDestroyFn image_destroy;
  nvimgcodec_abi::DecoderDecodeFn decoder_decode;
  nvimgcodec_abi::FutureWaitForAllFn future_wait;
  nvimgcodec_abi::FutureGetProcessingStatusFn future_status;
  nvimgcodec_abi::FutureDestroyFn future_destroy;
};

// Throws std::runtime_error naming the nvImageCodec call and its status unless it succeeded.
void check_nvimgcodec(const char* call, int32_t status);

class NvImageCodecInstance {
 public:
  // library: path of libnvimgcodec.so.0. Throws std::runtime_error when it cannot be loaded, is
  // not version 0.9 (the structures in nvimgcodec_abi.h are 0.9's), or the instance cannot be made.
  explicit NvImageCodecInstance(const std::string& library);
  ~NvImageCodecInstance();
  NvImageCodecInstance(const NvImageCodecInstance&) = delete;
  NvImageCodecInstance& operator=(const NvImageCodecInstance&) = delete;

  const NvImageCodecApi& api() const { return *api_; }
  nvimgcodec_abi::Instance* handle() const { return instance_; }
  uint32_t library_version() const { return version_; }
  // Seconds nvimgcodecInstanceCreate took (it loads the codec extensions).
  double create_seconds() const { return create_seconds_; }

 private:
  const NvImageCodecApi* api_ = nullptr;  // shared, never unloaded
  nvimgcodec_abi::Instance* instance_ = nullptr;
  uint32_t version_ = 0;
  double create_seconds_ = 0.0;
};

}  // namespace fastdata
