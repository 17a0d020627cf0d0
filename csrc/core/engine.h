// The batch engine: a thread pool that reads (optionally), decodes and transforms the
// samples of a batch into caller-owned rows, and reports each sample's outcome.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/augment.h"
#include "core/normalize.h"
#include "core/sample.h"
#include "core/thread_pool.h"

namespace fastdata {

enum class SampleStatus : int {
  kOk = 0,
  kNotJpeg = 1,      // left for the caller's fallback decoder (the row is untouched)
  kDecodeError = 2,  // corrupt or unsupported data (the row is zero-filled)
  kReadError = 3,    // the file could not be read (the row is zero-filled)
  kInternal = 4,     // a bug or out of memory (the row is zero-filled)
};

// Either an encoded buffer or a file path that a native thread reads.
struct SampleInput {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string path;
};

struct SampleResult {
  SampleStatus status = SampleStatus::kOk;
  std::string message;
  int warnings = 0;
  std::vector<uint8_t> file_bytes;  // kNotJpeg from a path: what was read, for the fallback
};

// Where a batch's rows go: uint8 RGB, or RGB normalized per channel as u8 * scale[c] + bias[c]
// in float32, float16 or bfloat16 (the CPU output path; on GPUs normalization runs there).
struct BatchOutput {
  uint8_t* data = nullptr;  // row 0
  OutputType type = OutputType::kUint8;
  ptrdiff_t row_stride = 0;  // bytes between rows
  float scale[3] = {1, 1, 1};
  float bias[3] = {0, 0, 0};

  bool normalized() const { return type != OutputType::kUint8; }
  uint8_t* row(size_t i) const { return data + static_cast<ptrdiff_t>(i) * row_stride; }
};

struct BatchTimes {
  double read_seconds = 0;    // summed over threads
  double decode_seconds = 0;  // decode + crop + resize, summed over threads
  // run: the run from its start to its end (one clock). start_run: runs overlap (the next
  // one's rows start while the last rows of the one before finish), so each is charged its
  // window, end - max(when start_run queued it, end of the run started before it) (ends come
  // in the order the runs were started), and the runs' sum is the time the native threads had
  // started runs to work on, no overlap counted twice; a run's rows over its wall_seconds is
  // the rate the threads deliver rows at (the split balancer's measure). From the queuing, not
  // its first row: the threads' wake-up is the native side's time too (from the first row,
  // runs of a few tiny rows read as fast as the hybrid tests' 100,000 rows/s GPU). Runs started
  // later that finished before a run's end (fewer rows than free threads) ran inside its
  // window and would be charged ~0 (a rate spike the balancer takes many batches to forget):
  // that window is shared among them and it by their read + decode seconds.
  double wall_seconds = 0;
};

// An asynchronous run (Engine::start_run): run's arguments, owned, and what it fills in.
// Held by the engine until on_done; results and times are complete when on_done is called.
struct RunJob {
  std::vector<SampleInput> inputs;
  TransformSpec spec;
  uint64_t seed = 0, epoch = 0;
  std::vector<int64_t> indices;  // empty: row i's index is i
  bool strict = false;
  int64_t max_pixels = 0, max_file_bytes = 0;
  BatchOutput out;
  std::vector<SampleResult> results;
  BatchTimes times;
};

// The order a run's threads claim its rows in: largest encoded size first when every row is
// a buffer (stable among equal sizes), else the rows' own order (a path's size is unknown
// until it is read). A run ends when its last row does; with few rows a thread a big row
// claimed last leaves the others idle (docs/results.md, "Rows claimed largest first").
std::vector<size_t> claim_order(const std::vector<SampleInput>& inputs);
// A/B switch (tests, benchmarks): false makes claim_order keep the rows' own order.
void set_claim_largest_first(bool enabled);
bool claim_largest_first();
// A/B switch (tests, benchmarks): false puts back the barrier between started runs (no row of
// a run is claimed before the run started before it has finished). Read at start_run.
void set_overlap_runs(bool enabled);
bool overlap_runs();

class Engine {
 public:
  // nice_increment > 0: the native threads (the pool's workers and its queue thread) run
  // that many nice steps below the thread that created each of them (the engine's creator;
  // for the queue thread, the first caller of start_run), so that the threads feeding a GPU
  // (and the training loop) get a core the moment they need one.
  // thread_name: the native threads' OS name (the pool's workers and its queue thread).
  explicit Engine(int threads, int nice_increment = 0, std::string thread_name = "fastdata-native");
  ~Engine();  // finishes the started runs first; in a forked child the pool is leaked, not destroyed (ThreadPool says why)
  int threads() const { return pool_->size(); }
  // False when a native thread could not lower its priority as asked (a thread that has not
  // started yet has not tried: the pool's workers all have after a first parallel loop).
  bool priority_lowered() const;

  // Row i goes to row i of `out` (spec.out_h x spec.out_w RGB pixels), whatever order the
  // threads take the rows in (claim_order). Never throws for bad data: every sample's
  // outcome is in results[i]. Call without the GIL.
  // Files are read as read_file does, refusing any above max_file_bytes (0: no limit).
  void run(const std::vector<SampleInput>& inputs, const TransformSpec& spec, uint64_t seed, uint64_t epoch,
           const int64_t* indices, bool strict, int64_t max_pixels, int64_t max_file_bytes, const BatchOutput& out,
           std::vector<SampleResult>* results, BatchTimes* times);

  // run, asynchronously: returns at once; job's rows are decoded on the pool's workers and
  // its queue thread (ThreadPool::enqueue: size() threads in all), claimed after the rows of
  // the runs started before it, with no barrier between runs (set_overlap_runs). on_done is
  // called once job->results and job->times are complete, on a native thread (for a run of
  // no rows perhaps on the caller), in the order the runs were started; it must not throw.
  // A synchronous call meanwhile (run, plan, read_files) shares the workers: its caller
  // starts on its rows at once, the workers join it once the earlier runs' rows are claimed.
  // Throws std::runtime_error in a process forked after the engine was made.
  void start_run(std::shared_ptr<RunJob> job, std::function<void()> on_done);

  // Where each sample's output comes from, without decoding pixels (for GPU decoders):
  // per sample the source box (x0, y0, x1, y1) in EXIF-oriented coordinates, the flip, the
  // oriented size, the header facts a decoder is chosen by, and a status (kNotJpeg /
  // kDecodeError / kReadError leave the rest unset).
  struct SamplePlan {
    double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    bool flip = false;
    int height = 0, width = 0, orientation = 1;
    int components = 0, precision = 0;
    bool arithmetic = false;
    bool progressive = false;  // multi-scan (SOF2): GPU hardware JPEG engines take baseline only
    Subsampling subsampling = Subsampling::kOther;  // JpegInfo::subsampling: routes rows to the engines
    // Three components that libjpeg reads as RGB, not YCbCr (an Adobe marker's transform 0, or
    // component IDs 'R', 'G', 'B'): a GPU decoder that treats every three-component JPEG as YCbCr
    // (nvImageCodec's parser does) would convert colors that are already RGB.
    bool rgb_coded = false;
  };
  void plan(const std::vector<SampleInput>& inputs, const TransformSpec& spec, uint64_t seed, uint64_t epoch,
            const int64_t* indices, int64_t max_pixels, int64_t max_file_bytes, std::vector<SamplePlan>* plans,
            std::vector<SampleResult>* results);

  // Reads each file into bufs[i] on the pool, for decoders that take encoded bytes (the GPU
  // backends). errors[i] is empty on success, else the reason. Never throws. Call without the GIL.
  void read_files(const std::vector<std::string>& paths, int64_t max_file_bytes,
                  std::vector<std::vector<uint8_t>>* bufs, std::vector<std::string>* errors);

  // The fallback's second half: crop/resize/flip of pixels decoded elsewhere.
  void transform_pixels_into(const uint8_t* rgb, int h, int w, ptrdiff_t stride, const TransformSpec& spec,
                             const SampleKey& key, const BatchOutput& out, size_t row);

 private:
  std::unique_ptr<ThreadPool> pool_;
  // Per thread, by the pool's worker id: size() + 1 slots (the last is the queue thread's).
  std::vector<std::unique_ptr<SampleScratch>> scratch_;
  std::vector<std::vector<uint8_t>> file_buffers_;
  struct StartedRun;  // engine.cpp
  std::mutex wall_mutex_;  // guards what follows and StartedRun's charge
  double last_run_end_ = 0;  // when the last started run finished (BatchTimes::wall_seconds)
  std::deque<std::shared_ptr<StartedRun>> started_;  // the runs not yet done, in start order
};

// The encoded bytes of one input: its buffer, or its file read into file_buffer. False (with
// res->status kReadError or kNotJpeg and a message) when there is nothing to decode here.
bool load_input(const SampleInput& in, int64_t max_file_bytes, std::vector<uint8_t>* file_buffer,
                const uint8_t** data, size_t* size, SampleResult* res);

// Reads a whole file into buf; false with a message on failure. The one place fastdata
// opens an input file (the engine's threads, the Pillow fallback, fastdata-convert and the
// RAM cache all come here), so the rules hold for every caller: only regular files are read
// (a named pipe would block open() and read() forever, a device never end), and a file above
// max_file_bytes (> 0) is refused from its size before a byte is read.
bool read_file(const std::string& path, int64_t max_file_bytes, std::vector<uint8_t>* buf, std::string* error);

}  // namespace fastdata
