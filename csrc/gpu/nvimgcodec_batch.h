// One nvImageCodec decoder that decodes a whole batch of JPEGs into one caller-owned
// buffer with a single call and no Python: code streams from the encoded bytes, an image per
// row at the caller's offset (HWC RGB uint8, rows of width * 3 bytes, stored orientation),
// one nvimgcodecDecoderDecode, one wait. The gpu decoder (fastdata/decoders/nvimgcodec.py)
// calls it with the GIL released for the whole batch: through nvImageCodec's Python API the
// same batch took the GIL back once or more per image (its Image objects), which the
// training thread paid for beside it.
//
// Each is made on an NvImageCodecInstance (nvimgcodec_instance.h), which it holds: the gpu
// decoder makes all of its decoders on one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/nvimgcodec_abi.h"
#include "gpu/nvimgcodec_instance.h"

namespace fastdata {

// Per-row outcome of NvImageCodecBatch::decode.
enum class GpuDecodeStatus : uint8_t {
  kDecoded = 0,     // pixels written at the row's offset
  kRefused = 1,     // nvImageCodec could not decode it (unsupported by the backends, damaged)
  kUnparsed = 2,    // nvImageCodec could not read its header
  kOtherShape = 3,  // the header's size or components differ from what the caller planned
};

struct EncodedRow {
  const uint8_t* data;
  size_t size;
  int64_t offset;  // byte offset of the row's pixels in the output buffer
  int64_t height;  // stored (not EXIF-oriented) size the caller planned for
  int64_t width;
};

class NvImageCodecBatch {
 public:
  // instance: what the decoder is made on (kept alive while it lives). device_id: a CUDA device, or
  // nvimgcodec_abi::kDeviceCpuOnly (host buffers; the tests' stand-in without a GPU).
  // backend_kinds: nvimgcodecBackendKind_t values allowed. options: nvimgcodecDecoderCreate's
  // option string ("": the library's defaults, which gave the same pixels as nvImageCodec
  // 0.9's Python API on its CPU backend; tests/decoders/test_nvimgcodec_batch.py). Throws std::runtime_error naming
  // the failing call and its status code.
  NvImageCodecBatch(std::shared_ptr<NvImageCodecInstance> instance, int device_id, int max_cpu_threads,
                    const std::vector<int32_t>& backend_kinds, const std::string& options);
  ~NvImageCodecBatch();
  NvImageCodecBatch(const NvImageCodecBatch&) = delete;
  NvImageCodecBatch& operator=(const NvImageCodecBatch&) = delete;

  // Decodes every row into out + row.offset on cuda_stream (nullptr: the default stream;
  // ignored for host buffers) and returns when nvImageCodec's work is queued on that stream
  // (device buffers) or done (host). The caller keeps out large enough and the rows' bytes
  // alive for the call. Throws std::runtime_error when a call of the API itself fails; work
  // already queued on cuda_stream may then still write `out`: the caller waits for the stream
  // before it frees or reuses `out`.
  std::vector<GpuDecodeStatus> decode(const std::vector<EncodedRow>& rows, uint8_t* out, void* cuda_stream);

  bool host_buffers() const { return host_buffers_; }
  const std::shared_ptr<NvImageCodecInstance>& instance() const { return instance_; }
  // Seconds nvimgcodecDecoderCreate took.
  double create_seconds() const { return create_seconds_; }

 private:
  std::shared_ptr<NvImageCodecInstance> instance_;  // outlives decoder_
  nvimgcodec_abi::Decoder* decoder_ = nullptr;
  bool host_buffers_ = false;
  double create_seconds_ = 0.0;
};

}  // namespace fastdata
