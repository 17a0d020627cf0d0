#include "core/engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <new>
#include <utility>

namespace fastdata {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void zero_row(const BatchOutput& out, size_t i, size_t pixels) {
  std::memset(out.row(i), 0, pixels * 3 * value_bytes(out.type));
}

}  // namespace

bool load_input(const SampleInput& in, int64_t max_file_bytes, std::vector<uint8_t>* file_buffer,
                const uint8_t** data, size_t* size, SampleResult* res) {
  *data = in.data;
  *size = in.size;
  if (!in.path.empty()) {
    if (!read_file(in.path, max_file_bytes, file_buffer, &res->message)) {
      res->status = SampleStatus::kReadError;
      return false;
    }
    *data = file_buffer->data();
    *size = file_buffer->size();
  }
  if (*size > 0 && !looks_like_jpeg(*data, *size)) {
    res->status = SampleStatus::kNotJpeg;
    res->message = "not a JPEG file";
    return false;
  }
  return true;
}

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

bool read_file(const std::string& path, int64_t max_file_bytes, std::vector<uint8_t>* buf, std::string* error) {
  buf->clear();
  // O_NONBLOCK: opening a named pipe for reading would otherwise wait for a writer forever.
  // It changes nothing for the regular files read below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *error = std::string("cannot open file: ") + std::strerror(errno);
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *error = std::string("cannot stat file: ") + std::strerror(errno);
    ::close(fd);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = std::string("not a regular file (") + file_kind(st.st_mode) + "); only regular files are read";
    ::close(fd);
    return false;
  }
  if (max_file_bytes > 0 && st.st_size > max_file_bytes) {
    *error = "file is " + std::to_string(static_cast<long long>(st.st_size)) + " bytes, above the limit of " +
             std::to_string(static_cast<long long>(max_file_bytes)) + " (max_file_bytes; raise it to read larger files)";
    ::close(fd);
    return false;
  }
  try {
    buf->resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    ::close(fd);
    throw;
  }
  size_t got = 0;
  while (got < buf->size()) {
    const ssize_t n = ::read(fd, buf->data() + got, buf->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = std::string("read failed: ") + std::strerror(errno);
      buf->clear();  // no partial bytes for a caller to mistake for the file
      ::close(fd);
      return false;
    }
    if (n == 0) break;  // the file shrank while we read it
    got += static_cast<size_t>(n);
  }
  buf->resize(got);  // never more than the size checked above, even if the file grew
  ::close(fd);
  return true;
}

Engine::Engine(int threads, int nice_increment, std::string thread_name)
    : pool_(new ThreadPool(threads < 1 ? 1 : threads, nice_increment, std::move(thread_name))) {
  for (int i = 0; i <= pool_->size(); ++i) scratch_.emplace_back(new SampleScratch());
  file_buffers_.resize(pool_->size() + 1);
}

Engine::~Engine() {
  if (!pool_->made_here()) {  // deliberately leaked: its threads are the parent's
    static_cast<void>(pool_.release());
    return;
  }
  pool_.reset();  // the started runs finish first (their callers hold the buffers they use)
}

bool Engine::priority_lowered() const { return pool_->priority_lowered(); }

namespace {
std::atomic<bool> g_claim_largest_first{true};
std::atomic<bool> g_overlap_runs{true};
}  // namespace

void set_claim_largest_first(bool enabled) { g_claim_largest_first.store(enabled); }
bool claim_largest_first() { return g_claim_largest_first.load(); }
void set_overlap_runs(bool enabled) { g_overlap_runs.store(enabled); }
bool overlap_runs() { return g_overlap_runs.load(); }

std::vector<size_t> claim_order(const std::vector<SampleInput>& inputs) {
  std::vector<size_t> order(inputs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!claim_largest_first()) return order;
  for (const SampleInput& input : inputs) {
    if (!input.path.empty()) return order;
  }
  // Encoded size stands in for decode time (a measured ordering by cost did little better:
  // docs/results.md, "Rows claimed largest first").
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return inputs[a].size > inputs[b].size; });
  return order;
}

namespace {

// What every row of one run reads: run's arguments, or a RunJob's.
struct RowArgs {
  const std::vector<SampleInput>& inputs;
  const TransformSpec& spec;
  uint64_t seed, epoch;
  const int64_t* indices;
  bool strict;
  int64_t max_pixels, max_file_bytes;
  const BatchOutput& out;
};

// Row i of a run into its place in out, its outcome into *res; the thread's time reading and
// decoding is added to *read_s and *decode_s. Never throws for bad data.
void decode_row_unguarded(const RowArgs& a, size_t i, SampleScratch* s, std::vector<uint8_t>* file_buffer,
                          SampleResult* res, double* read_s, double* decode_s) {
  const size_t pixels = static_cast<size_t>(a.spec.out_h) * a.spec.out_w;
  const SampleInput& in = a.inputs[i];
  try {
    const uint8_t* data;
    size_t size;
    const double t_read = now_seconds();
    const bool loaded = load_input(in, a.max_file_bytes, file_buffer, &data, &size, res);
    if (!in.path.empty()) *read_s += now_seconds() - t_read;
    if (!loaded) {
      if (res->status == SampleStatus::kReadError) zero_row(a.out, i, pixels);
      // The fallback decodes what was read here rather than opening the file again.
      if (res->status == SampleStatus::kNotJpeg && !in.path.empty()) {
        res->file_bytes = std::move(*file_buffer);
        *file_buffer = std::vector<uint8_t>();
      }
      return;
    }
    const double t0 = now_seconds();
    const SampleKey key{a.seed, a.epoch, a.indices ? static_cast<uint64_t>(a.indices[i]) : static_cast<uint64_t>(i)};
    const BatchOutput& out = a.out;
    if (out.normalized()) {  // resize into scratch while it is in cache, then normalize into the row
      s->row_u8.resize(pixels * 3);
      res->warnings = transform_jpeg(data, size, a.spec, key, a.strict, a.max_pixels, s->row_u8.data(), s);
      normalize_row(s->row_u8.data(), out.row(i), pixels, out.type, out.scale, out.bias);
    } else {
      res->warnings = transform_jpeg(data, size, a.spec, key, a.strict, a.max_pixels, out.row(i), s);
    }
    *decode_s += now_seconds() - t0;
  } catch (const DecodeError& e) {
    res->status = SampleStatus::kDecodeError;
    res->message = e.what();
    zero_row(a.out, i, pixels);
  } catch (const std::bad_alloc&) {
    res->status = SampleStatus::kInternal;
    res->message = "out of memory";
    zero_row(a.out, i, pixels);
  } catch (const std::exception& e) {
    res->status = SampleStatus::kInternal;
    res->message = std::string("internal error: ") + e.what();
    zero_row(a.out, i, pixels);
  }
}


// decode_row_unguarded, never throwing: its handlers build messages, which can themselves run
// out of memory, and a row must not throw (ThreadPool: on a worker that would terminate the
// process, on parallel_for's caller leave its loop behind).
void decode_row(const RowArgs& a, size_t i, SampleScratch* s, std::vector<uint8_t>* file_buffer, SampleResult* res,
                double* read_s, double* decode_s) {
  try {
    decode_row_unguarded(a, i, s, file_buffer, res, read_s, decode_s);
  } catch (...) {
    res->status = SampleStatus::kInternal;
    try {
      res->message = "out of memory";
    } catch (...) {
    }
    zero_row(a.out, i, static_cast<size_t>(a.spec.out_h) * a.spec.out_w);
  }
}
}  // namespace

void Engine::run(const std::vector<SampleInput>& inputs, const TransformSpec& spec, uint64_t seed, uint64_t epoch,
                 const int64_t* indices, bool strict, int64_t max_pixels, int64_t max_file_bytes,
                 const BatchOutput& out,
                 std::vector<SampleResult>* results, BatchTimes* times) {
  const double t_start = now_seconds();
  results->assign(inputs.size(), SampleResult());
  std::vector<double> read_s(pool_->size(), 0.0), decode_s(pool_->size(), 0.0);
  const std::vector<size_t> order = claim_order(inputs);
  const RowArgs args{inputs, spec, seed, epoch, indices, strict, max_pixels, max_file_bytes, out};
  pool_->parallel_for(inputs.size(), [&](size_t k, int worker) {
    const size_t i = order[k];
    decode_row(args, i, scratch_[worker].get(), &file_buffers_[worker], &(*results)[i], &read_s[worker],
               &decode_s[worker]);
  });
  for (int w = 0; w < pool_->size(); ++w) {
    times->read_seconds += read_s[w];
    times->decode_seconds += decode_s[w];
  }
  times->wall_seconds += now_seconds() - t_start;
}

// One started run's own state, shared by its rows, its on_done and Engine::started_.
struct Engine::StartedRun {
  std::shared_ptr<RunJob> job;
  std::vector<size_t> order;
  std::vector<double> read_s, decode_s;  // per pool worker id, the queue thread's included
  double started = 0;                    // when start_run queued it
  std::atomic<size_t> rows_left{0};
  std::atomic<bool> finished{false};  // every row done (read_s and decode_s complete)
  bool charged = false;               // wall_mutex_: its wall time was given by an earlier run's end
  double charge = 0;

  double busy() const {  // its threads' read + decode seconds (complete once finished)
    double sum = 0;
    for (size_t w = 0; w < read_s.size(); ++w) sum += read_s[w] + decode_s[w];
    return sum;
  }
};

void Engine::start_run(std::shared_ptr<RunJob> job, std::function<void()> on_done) {
  // Before any lock: in a forked child one may have been held by a thread that is not there.
  pool_->check_process("create a new engine here");
  const auto run = std::make_shared<StartedRun>();
  run->started = now_seconds();
  run->job = std::move(job);
  const size_t n = run->job->inputs.size();
  run->job->results.assign(n, SampleResult());
  run->order = claim_order(run->job->inputs);
  run->read_s.assign(pool_->size() + 1, 0.0);
  run->decode_s.assign(pool_->size() + 1, 0.0);
  run->rows_left.store(n);
  run->finished.store(n == 0);
  auto row = [this, run](size_t k, int worker) {
    RunJob& j = *run->job;
    const RowArgs args{j.inputs, j.spec, j.seed, j.epoch, j.indices.empty() ? nullptr : j.indices.data(),
                       j.strict, j.max_pixels, j.max_file_bytes, j.out};
    const size_t i = run->order[k];
    decode_row(args, i, scratch_[worker].get(), &file_buffers_[worker], &j.results[i], &run->read_s[worker],
               &run->decode_s[worker]);
    if (run->rows_left.fetch_sub(1, std::memory_order_acq_rel) == 1) run->finished.store(true, std::memory_order_release);
  };
  auto done = [this, run, n, on_done = std::move(on_done)] {
    const double end = now_seconds();
    RunJob& j = *run->job;
    for (size_t w = 0; w < run->read_s.size(); ++w) {
      j.times.read_seconds += run->read_s[w];
      j.times.decode_seconds += run->decode_s[w];
    }
    {
      std::lock_guard<std::mutex> lock(wall_mutex_);
      double charge = run->charge;
      if (!run->charged) {  // BatchTimes::wall_seconds says why
        const double window = n > 0 ? std::max(0.0, end - std::max(run->started, last_run_end_)) : 0.0;
        charge = window;
        // Out of memory for the list below: this run is charged the whole window, and the run is
        // still erased and its caller told (a caller never told would wait forever).
        try {
          std::vector<StartedRun*> inside;  // later runs already finished: they ran in this window
          for (const auto& later : started_) {
            if (later != run && !later->charged && later->finished.load(std::memory_order_acquire)) {
              inside.push_back(later.get());
            }
          }
          if (!inside.empty()) {
            // By thread-seconds; by rows where none were measured (rows that failed at once).
            double total = run->busy();
            for (StartedRun* r : inside) total += r->busy();
            const bool by_rows = total <= 0;
            const auto weight = [&](const StartedRun& r) {
              return by_rows ? static_cast<double>(r.job->inputs.size()) : r.busy();
            };
            if (by_rows) {
              total = weight(*run);
              for (StartedRun* r : inside) total += weight(*r);
            }
            if (total > 0) {
              charge = window * weight(*run) / total;
              for (StartedRun* r : inside) {
                r->charge = window * weight(*r) / total;
                r->charged = true;
              }
            }
          }
        } catch (const std::bad_alloc&) {
        }
      }
      j.times.wall_seconds += charge;
      last_run_end_ = std::max(last_run_end_, end);
      for (auto it = started_.begin(); it != started_.end(); ++it) {  // the front, unless two threads start runs at once
        if (*it == run) {
          started_.erase(it);
          break;
        }
      }
    }
    on_done();
  };
  {
    std::lock_guard<std::mutex> lock(wall_mutex_);
    started_.push_back(run);
  }
  try {  // not under wall_mutex_: a run of no rows may be done (done() called) on this thread, in enqueue
    pool_->enqueue(n, std::move(row), std::move(done), !overlap_runs());
  } catch (...) {  // not queued (a forked child): it will never end
    std::lock_guard<std::mutex> lock(wall_mutex_);
    for (auto it = started_.begin(); it != started_.end(); ++it) {
      if (*it == run) {
        started_.erase(it);
        break;
      }
    }
    throw;
  }
}

void Engine::plan(const std::vector<SampleInput>& inputs, const TransformSpec& spec, uint64_t seed, uint64_t epoch,
                  const int64_t* indices, int64_t max_pixels, int64_t max_file_bytes,
                  std::vector<SamplePlan>* plans,
                  std::vector<SampleResult>* results) {
  plans->assign(inputs.size(), SamplePlan());
  results->assign(inputs.size(), SampleResult());
  pool_->parallel_for(inputs.size(), [&](size_t i, int worker) {
    SampleResult& res = (*results)[i];
    try {
      const uint8_t* data;
      size_t size;
      if (!load_input(inputs[i], max_file_bytes, &file_buffers_[worker], &data, &size, &res)) return;
      const JpegInfo info = scratch_[worker]->decoder.read_header(data, size, false);
      check_pixel_limit(info, max_pixels);
      const int h = info.oriented_height(), w = info.oriented_width();
      const uint64_t index = indices ? static_cast<uint64_t>(indices[i]) : static_cast<uint64_t>(i);
      const ResizePlan rp = plan_resize(h, w, spec, seed, epoch, index);
      SamplePlan& p = (*plans)[i];
      p.x0 = rp.x.start;
      p.x1 = rp.x.start + rp.x.scale * rp.x.out;
      p.y0 = rp.y.start;
      p.y1 = rp.y.start + rp.y.scale * rp.y.out;
      p.flip = rp.flip;
      p.height = h;
      p.width = w;
      p.orientation = info.orientation;
      p.components = info.components;
      p.precision = info.precision;
      p.arithmetic = info.arithmetic;
      p.progressive = info.progressive;
      p.subsampling = info.subsampling;
      p.rgb_coded = info.color_space == ColorSpace::kRGB;
    } catch (const DecodeError& e) {
      res.status = SampleStatus::kDecodeError;
      res.message = e.what();
    } catch (const std::exception& e) {
      res.status = SampleStatus::kInternal;
      res.message = std::string("internal error: ") + e.what();
    }
  });
}

void Engine::read_files(const std::vector<std::string>& paths, int64_t max_file_bytes,
                        std::vector<std::vector<uint8_t>>* bufs, std::vector<std::string>* errors) {
  bufs->assign(paths.size(), std::vector<uint8_t>());
  errors->assign(paths.size(), std::string());
  pool_->parallel_for(paths.size(), [&](size_t i, int) {
    try {
      if (!read_file(paths[i], max_file_bytes, &(*bufs)[i], &(*errors)[i]) && (*errors)[i].empty()) {
        (*errors)[i] = "cannot read file";
      }
    } catch (const std::exception& e) {  // out of memory for a huge file
      (*bufs)[i] = std::vector<uint8_t>();
      (*errors)[i] = std::string("cannot read file: ") + e.what();
    }
  });
}

void Engine::transform_pixels_into(const uint8_t* rgb, int h, int w, ptrdiff_t stride, const TransformSpec& spec,
                                   const SampleKey& key, const BatchOutput& out, size_t row) {
  // Rare path (non-JPEG samples): fresh scratch, so it never races a running batch.
  SampleScratch scratch;
  const size_t pixels = static_cast<size_t>(spec.out_h) * spec.out_w;
  if (out.normalized()) {
    scratch.row_u8.resize(pixels * 3);
    transform_pixels(rgb, h, w, stride, spec, key, scratch.row_u8.data(), &scratch);
    normalize_row(scratch.row_u8.data(), out.row(row), pixels, out.type, out.scale, out.bias);
  } else {
    transform_pixels(rgb, h, w, stride, spec, key, out.row(row), &scratch);
  }
}

}  // namespace fastdata
