#include "gpu/nvimgcodec_instance.h"

#include <dlfcn.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace fastdata {

namespace abi = nvimgcodec_abi;

void check_nvimgcodec(const char* call, int32_t status) {
  if (status != abi::kStatusSuccess) {
    throw std::runtime_error(std::string("nvImageCodec: ") + call + " failed with status " + std::to_string(status));
  }
}

namespace {

template <typename Fn>
void load(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) throw std::runtime_error(std::string("nvImageCodec: the library has no ") + name);
}

// The library's functions, loaded once per path: dlopen keeps one copy of a library per
// process, and it is never closed (instances may outlive any one decoder object).
const NvImageCodecApi* load_api(const std::string& path) {
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
  const NvImageCodecApi* result = api.get();
  loaded.emplace(path, std::move(api));
  return result;
}

}  // namespace

NvImageCodecInstance::NvImageCodecInstance(const std::string& library) {
  api_ = load_api(library);
  auto properties = abi::with_header<abi::Properties>(abi::kProperties);
  check_nvimgcodec("nvimgcodecGetProperties", api_->get_properties(&properties));
  version_ = properties.version;
  // The structures in nvimgcodec_abi.h are 0.9's; another minor version may lay them out differently.
  if (version_ / 100 != 9) {
    throw std::runtime_error("nvImageCodec " + std::to_string(version_ / 1000) + "." +
                             std::to_string(version_ % 1000 / 100) + " is installed; fastdata's batch decoder "
                             "is built for 0.9 (pip install 'nvidia-nvimgcodec-cu13>=0.9,<0.10')");
  }
  auto create = abi::with_header<abi::InstanceCreateInfo>(abi::kInstanceCreateInfo);
  create.load_builtin_modules = 1;
  create.load_extension_modules = 1;
  const auto started = std::chrono::steady_clock::now();
  check_nvimgcodec("nvimgcodecInstanceCreate", api_->instance_create(&instance_, &create));
  create_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

NvImageCodecInstance::~NvImageCodecInstance() {
  // A destructor cannot raise: a failed destroy leaves nothing to retry. Every decoder made on
  // it is gone by now: each holds the instance (NvImageCodecBatch::instance_).
  if (instance_ != nullptr) (void)api_->instance_destroy(instance_);
}

}  // namespace fastdata
