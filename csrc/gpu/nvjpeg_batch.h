// One nvJPEG hardware-backend decoder (a handle and a decode state) that decodes a batch of
// JPEGs into one caller-owned buffer with one nvjpegDecodeBatched call on the caller's CUDA
// stream: the same job and the same decode() contract as NvImageCodecBatch
// (nvimgcodec_batch.h), without nvImageCodec in between.
//
// Why a second call: nvImageCodec decodes on CUDA streams of its own (at the default priority)
// with worker threads of its own, uploads the bitstreams from pageable memory, and waits for
// its previous batch with a spinning cudaEventSynchronize (read in its 0.8 source). Beside a
// training step its calls took 2.4-4.4x their wall time alone (docs/results.md, twenty-third
// session). Here the work goes on the stream the caller gives (the gpu decoder's own stream per
// instance), the caller may hand over pinned bitstreams, and the wait sleeps (a blocking-sync
// event). The gpu decoder picks the call with nvimgcodec.ENGINE_CALLS; which is faster is for a
// GPU run to tell.
//
// What it does as nvImageCodec's hardware decoder does (its 0.8 source, read): a header parse and
// nvjpegDecodeBatchedSupported per row before the call, fancy upsampling
// (NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, libjpeg's), a PreAllocate at creation so that
// nvJPEG pools its buffers, and a wait for the previous call's work before the state is reused.
//
// libnvjpeg (it carries its own static CUDA runtime) and libcudart (the events; the process's
// copy, which torch loaded) are loaded at run time, so fastdata builds and imports without them.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/nvimgcodec_batch.h"  // EncodedRow, GpuDecodeStatus: the batch calls' shared types
#include "gpu/nvjpeg_abi.h"

namespace fastdata {

struct NvJpegApi;  // the libraries' functions, loaded once per process (nvjpeg_batch.cpp)

class NvJpegBatch {
 public:
  // nvjpeg_library: path of libnvjpeg.so.13. cudart_library: a path or soname of the CUDA
  // runtime (the copy already in the process is taken when there is one). Creates the handle
  // and state on the calling thread's current CUDA device. Throws std::runtime_error naming
  // the failing call and its status.
  NvJpegBatch(const std::string& nvjpeg_library, const std::string& cudart_library);
  ~NvJpegBatch();
  NvJpegBatch(const NvJpegBatch&) = delete;
  NvJpegBatch& operator=(const NvJpegBatch&) = delete;

  // Decodes every row into out + row.offset (device memory) on cuda_stream, and returns once the
  // work is queued there. Rows nvJPEG cannot parse, whose frame size differs from the planned
  // one, or that its hardware decoder does not support are not decoded (their statuses say
  // which). A batch call that fails on the data (BAD_JPEG, JPEG_NOT_SUPPORTED, INCOMPLETE_BITSTREAM:
  // nvJPEG fails the whole batch for one row) is made again row by row, and only the rows that
  // fail alone are refused. The caller keeps the rows' bytes alive until the stream's work is done (pinned
  // bitstreams are uploaded asynchronously) and waits for the stream before it frees or reuses
  // `out`. Throws std::runtime_error when a call fails for any other reason (CUDA errors,
  // allocation, internal errors).
  std::vector<GpuDecodeStatus> decode(const std::vector<EncodedRow>& rows, uint8_t* out, void* cuda_stream);

  unsigned hardware_engines() const { return engines_; }
  unsigned cores_per_engine() const { return cores_per_engine_; }
  // Batch calls made again row by row since creation (tests, diagnostics).
  uint64_t row_by_row_retries() const { return retries_.load(); }

 private:
  // One nvjpegDecodeBatched call over `rows` (indices into the decode call's rows), after the
  // previous call's work is done. Returns nvJPEG's status; queued work is marked by the event.
  int32_t call(const std::vector<EncodedRow>& all, const std::vector<size_t>& rows, uint8_t* out, void* stream);
  void wait_for_previous_call();
  void release() noexcept;  // handle, state, parse stream and event, the last call's work waited for

  const NvJpegApi* api_ = nullptr;  // shared, never unloaded
  nvjpeg_abi::Handle handle_ = nullptr;
  nvjpeg_abi::JpegState state_ = nullptr;
  nvjpeg_abi::JpegStream parsed_ = nullptr;  // header parses, one row at a time
  nvjpeg_abi::CudaEvent done_ = nullptr;     // the last call's work, recorded on its stream
  bool pending_ = false;                     // done_ marks work not yet waited for
  unsigned engines_ = 0, cores_per_engine_ = 0;
  std::atomic<uint64_t> retries_{0};
  std::mutex mutex_;  // decode() calls take turns on the state
  // Per call, reused: the queued rows' bitstreams, lengths and destinations.
  std::vector<const unsigned char*> datas_;
  std::vector<size_t> lengths_;
  std::vector<nvjpeg_abi::Image> images_;
};

}  // namespace fastdata
