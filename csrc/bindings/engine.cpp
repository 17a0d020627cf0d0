// The batch engine: Engine.run / plan / read_files / transform_pixels, and the crop boxes
// it draws (sample_crop_boxes, for tests and GPU decoders that need the same crops).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings/common.h"
#include "bindings/released_gil.h"
#include "bindings/register.h"
#include "bindings/types.h"
#include "core/augment.h"
#include "core/engine.h"
#include "core/thread_pool.h"
#include "core/sample.h"

namespace fastdata::bindings {

namespace {

py::array_t<int64_t> sample_crop_boxes(int height, int width, std::pair<double, double> scale,
                                       std::pair<double, double> ratio, double hflip, uint64_t seed, uint64_t epoch,
                                       py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices) {
  if (height <= 0 || width <= 0) throw py::value_error("height and width must be positive");
  TransformSpec spec;
  spec.scale_lo = scale.first, spec.scale_hi = scale.second;
  spec.ratio_lo = ratio.first, spec.ratio_hi = ratio.second;
  spec.hflip = hflip;
  const auto n = indices.size();
  py::array_t<int64_t> boxes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(5)});
  auto b = boxes.mutable_unchecked<2>();
  const int64_t* idx = indices.data();
  for (py::ssize_t i = 0; i < n; ++i) {
    const CropBox c = sample_random_resized_crop(height, width, spec, seed, epoch, static_cast<uint64_t>(idx[i]));
    b(i, 0) = c.top, b(i, 1) = c.left, b(i, 2) = c.height, b(i, 3) = c.width, b(i, 4) = c.flip;
  }
  return boxes;
}

struct EngineDeleter {
  // Joining workers needs no Python, but other Python threads should not wait on it.
  void operator()(Engine* e) const {
    if (PyGILState_Check()) {
      ReleasedGil nogil;
      delete e;
    } else {
      delete e;
    }
  }
};

std::vector<int64_t> indices_from(const py::object& indices_obj, size_t n) {
  std::vector<int64_t> indices;
  if (!indices_obj.is_none()) {
    auto arr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(indices_obj);
    if (!arr || static_cast<size_t>(arr.size()) != n) throw py::value_error("indices must have one entry per item");
    indices.assign(arr.data(), arr.data() + n);
  }
  return indices;
}

CropPlan engine_plan(Engine& engine, const py::sequence& items, const TransformSpec& spec, uint64_t seed,
                     uint64_t epoch, const py::object& indices_obj, int64_t max_pixels, int64_t max_file_bytes) {
  BufferViews views;
  const std::vector<SampleInput> inputs = inputs_from_items(items, &views);
  const size_t n = inputs.size();
  const std::vector<int64_t> indices = indices_from(indices_obj, n);
  std::vector<Engine::SamplePlan> plans;
  std::vector<SampleResult> results;
  {
    ReleasedGil nogil;
    engine.plan(inputs, spec, seed, epoch, indices.empty() ? nullptr : indices.data(), max_pixels, max_file_bytes,
                &plans, &results);
  }
  const auto rows = static_cast<py::ssize_t>(n);
  CropPlan plan;
  plan.boxes = py::array_t<double>({rows, static_cast<py::ssize_t>(4)});
  plan.flips = py::array_t<bool>(rows);
  plan.sizes = py::array_t<int32_t>({rows, static_cast<py::ssize_t>(2)});
  plan.orientations = py::array_t<int32_t>(rows);
  plan.components = py::array_t<int32_t>(rows);
  plan.precisions = py::array_t<int32_t>(rows);
  plan.arithmetic = py::array_t<bool>(rows);
  plan.progressive = py::array_t<bool>(rows);
  plan.subsamplings = py::array_t<int32_t>(rows);
  plan.rgb_coded = py::array_t<bool>(rows);
  auto b = plan.boxes.mutable_unchecked<2>();
  auto f = plan.flips.mutable_unchecked<1>();
  auto s = plan.sizes.mutable_unchecked<2>();
  auto o = plan.orientations.mutable_unchecked<1>();
  auto c = plan.components.mutable_unchecked<1>();
  auto bits = plan.precisions.mutable_unchecked<1>();
  auto arith = plan.arithmetic.mutable_unchecked<1>();
  auto prog = plan.progressive.mutable_unchecked<1>();
  auto samp = plan.subsamplings.mutable_unchecked<1>();
  auto rgb = plan.rgb_coded.mutable_unchecked<1>();
  for (size_t i = 0; i < n; ++i) {
    const auto& p = plans[i];
    const auto r = static_cast<py::ssize_t>(i);
    b(r, 0) = p.x0, b(r, 1) = p.y0, b(r, 2) = p.x1, b(r, 3) = p.y1;
    f(r) = p.flip;
    s(r, 0) = p.height, s(r, 1) = p.width;
    o(r) = p.orientation;
    c(r) = p.components, bits(r) = p.precision, arith(r) = p.arithmetic, prog(r) = p.progressive;
    samp(r) = static_cast<int32_t>(p.subsampling);
    rgb(r) = p.rgb_coded;
  }
  plan.failures = failures_of(results);
  return plan;
}

// Files read on the engine's threads (GIL released), each returned as a uint8 array that
// owns the bytes read (no copy), or the reason it could not be read.
py::tuple engine_read_files(Engine& engine, const py::sequence& path_objs, int64_t max_file_bytes) {
  std::vector<std::string> paths;
  for (size_t i = 0; i < static_cast<size_t>(py::len(path_objs)); ++i) paths.push_back(fs_path(path_objs[i], i));
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::string> errors;
  {
    ReleasedGil nogil;
    engine.read_files(paths, max_file_bytes, &bufs, &errors);
  }
  py::list arrays, reasons;
  for (size_t i = 0; i < paths.size(); ++i) {
    arrays.append(owned_array(std::move(bufs[i])));
    reasons.append(errors[i].empty() ? py::object(py::none()) : py::object(py::str(errors[i])));
  }
  return py::make_tuple(arrays, reasons);
}

// One file, read as the engine reads files (read_file in core/engine.h): (uint8 array, None)
// or (empty array, the reason). For Python code that needs a file's bytes (fastdata-convert,
// the RAM cache), so that every input file is opened in one place.
py::tuple read_file_py(const py::str& path, int64_t max_file_bytes) {
  const std::string p = fs_path(path, 0);
  std::vector<uint8_t> buf;
  std::string error;
  bool ok;
  {
    ReleasedGil nogil;
    ok = read_file(p, max_file_bytes, &buf, &error);
  }
  if (!ok) return py::make_tuple(owned_array(std::vector<uint8_t>()), py::str(error));
  return py::make_tuple(owned_array(std::move(buf)), py::none());
}

// out: [N, H, W, 3] with contiguous rows, uint8, or normalized with (scale, bias): float32,
// float16, or uint16 holding bfloat16 bits (numpy has no bfloat16: fastdata.loader.pinned_ring's
// engine_array gives a torch bfloat16 tensor's).
BatchOutput batch_output(const py::object& out_obj, size_t n, const TransformSpec& spec,
                         const py::object& scale_bias, py::buffer_info* info) {
  py::buffer out_buf = py::reinterpret_borrow<py::buffer>(out_obj);
  *info = out_buf.request(true);
  BatchOutput out;
  const std::string& format = info->format;
  if (format == py::format_descriptor<uint8_t>::format()) {
    out.type = OutputType::kUint8;
  } else if (format == py::format_descriptor<float>::format()) {
    out.type = OutputType::kFloat32;
  } else if (format == "e") {  // IEEE half (Python's struct code)
    out.type = OutputType::kFloat16;
  } else if (format == py::format_descriptor<uint16_t>::format()) {
    out.type = OutputType::kBFloat16;
  } else {
    throw py::value_error("out must be a uint8, float32, float16 or uint16 (bfloat16 bits) array, got format '" +
                          format + "'");
  }
  const py::ssize_t item = static_cast<py::ssize_t>(value_bytes(out.type));
  if (info->itemsize != item || info->ndim != 4 || info->shape[0] != static_cast<py::ssize_t>(n) ||
      info->shape[1] != spec.out_h || info->shape[2] != spec.out_w || info->shape[3] != 3 ||
      info->strides[3] != item || info->strides[2] != 3 * item || info->strides[1] != 3 * item * spec.out_w) {
    throw py::value_error("out must be a writable array of shape [N, H, W, 3] with contiguous rows");
  }
  out.data = static_cast<uint8_t*>(info->ptr);
  out.row_stride = info->strides[0];
  if (out.normalized()) {
    if (scale_bias.is_none()) throw py::value_error("a float out needs per-channel (scale, bias)");
    auto sb = scale_bias.cast<std::pair<std::vector<float>, std::vector<float>>>();
    if (sb.first.size() != 3 || sb.second.size() != 3) throw py::value_error("scale and bias need 3 values each");
    for (int c = 0; c < 3; ++c) out.scale[c] = sb.first[c], out.bias[c] = sb.second[c];
  }
  return out;
}

BatchReport report_of(std::vector<SampleResult>& results, const BatchTimes& times) {
  BatchReport report;
  for (const auto& r : results) report.warnings += r.warnings;
  report.failures = failures_of(results);
  report.read_seconds = times.read_seconds;
  report.decode_seconds = times.decode_seconds;
  report.wall_seconds = times.wall_seconds;
  return report;
}

// One Engine.run call's arguments, converted, and what it produced. Plain C++ only: a started
// run's rows and its on_done read and write it on the engine's threads without the GIL, never
// touching a Python object (the Python buffers behind inputs and out are held by the caller).
struct RunState : RunJob {
  std::mutex mutex;  // a started run: guards finished
  std::condition_variable finished_cv;
  bool finished = false;

  void execute(Engine& engine) {  // call without the GIL
    engine.run(inputs, spec, seed, epoch, indices.empty() ? nullptr : indices.data(), strict, max_pixels,
               max_file_bytes, out, &results, &times);
  }
};

// Checks and converts run's arguments (with the GIL); views and info receive the Python buffers
// the run reads (the items) and writes (out), to be held until it has finished.
std::shared_ptr<RunState> prepare_run(const py::sequence& items, const TransformSpec& spec, const py::object& out_obj,
                                      uint64_t seed, uint64_t epoch, const py::object& indices_obj, bool strict,
                                      int64_t max_pixels, int64_t max_file_bytes, const py::object& scale_bias,
                                      BufferViews* views, py::buffer_info* info) {
  auto run = std::make_shared<RunState>();
  run->inputs = inputs_from_items(items, views);
  const size_t n = run->inputs.size();
  run->out = batch_output(out_obj, n, spec, scale_bias, info);
  run->indices = indices_from(indices_obj, n);
  run->spec = spec;
  run->seed = seed, run->epoch = epoch, run->strict = strict;
  run->max_pixels = max_pixels, run->max_file_bytes = max_file_bytes;
  return run;
}

BatchReport engine_run(Engine& engine, const py::sequence& items, const TransformSpec& spec, const py::object& out_obj,
                       uint64_t seed, uint64_t epoch, const py::object& indices_obj, bool strict, int64_t max_pixels,
                       int64_t max_file_bytes, const py::object& scale_bias) {
  BufferViews views;
  py::buffer_info info;
  const auto run = prepare_run(items, spec, out_obj, seed, epoch, indices_obj, strict, max_pixels, max_file_bytes,
                               scale_bias, &views, &info);
  {
    ReleasedGil nogil;
    run->execute(engine);
  }
  return report_of(run->results, run->times);
}

// Engine.start_run's handle. It holds the Python buffers the run reads (the items' views)
// and writes (out) until the run has finished: a handle dropped without wait() waits for its
// run first, so no buffer is released under a running decode.
class PendingRun {
 public:
  PendingRun(std::shared_ptr<RunState> run, std::unique_ptr<BufferViews> views, std::unique_ptr<py::buffer_info> out)
      : run_(std::move(run)), views_(std::move(views)), out_(std::move(out)), owner_pid_(::getpid()) {}
  ~PendingRun() {  // pybind11 destroys it with the GIL held; the buffers are released after the run
    // Not queued (start_run threw): nothing will finish it. In a process forked after it was
    // queued, the run's threads do not exist: waiting would never end.
    if (!queued_ || ::getpid() != owner_pid_) return;
    if (PyGILState_Check()) {
      ReleasedGil nogil;
      block_until_finished();
    } else {
      block_until_finished();
    }
  }
  PendingRun(const PendingRun&) = delete;
  PendingRun& operator=(const PendingRun&) = delete;

  void set_queued() { queued_ = true; }

  bool done() {
    std::lock_guard<std::mutex> lock(run_->mutex);
    return run_->finished;
  }

  // The run's report once it has finished (GIL released while waiting). Once only: the
  // report's non-JPEG bytes move out of the run.
  BatchReport wait() {
    if (waited_) throw std::runtime_error("this run was already waited for");
    if (::getpid() != owner_pid_) throw std::runtime_error("this run was queued before a fork, in another process");
    {
      ReleasedGil nogil;
      block_until_finished();
    }
    waited_ = true;
    return report_of(run_->results, run_->times);
  }

 private:
  void block_until_finished() {
    std::unique_lock<std::mutex> lock(run_->mutex);
    run_->finished_cv.wait(lock, [&] { return run_->finished; });
  }

  std::shared_ptr<RunState> run_;
  std::unique_ptr<BufferViews> views_;
  std::unique_ptr<py::buffer_info> out_;
  const pid_t owner_pid_;
  bool queued_ = false;  // set once the engine has taken the run: only then is there a run to wait for
  bool waited_ = false;
};

std::unique_ptr<PendingRun> engine_start_run(Engine& engine, const py::sequence& items, const TransformSpec& spec,
                                             const py::object& out_obj, uint64_t seed, uint64_t epoch,
                                             const py::object& indices_obj, bool strict, int64_t max_pixels,
                                             int64_t max_file_bytes, const py::object& scale_bias) {
  auto views = std::make_unique<BufferViews>();
  auto info = std::make_unique<py::buffer_info>();
  auto run = prepare_run(items, spec, out_obj, seed, epoch, indices_obj, strict, max_pixels, max_file_bytes,
                         scale_bias, views.get(), info.get());
  auto pending = std::make_unique<PendingRun>(run, std::move(views), std::move(info));
  // Called on a native thread once the run is done (the engine finishes its started runs
  // before it is destroyed). Throws, before anything is queued, in a forked child.
  engine.start_run(run, [run] {
    std::lock_guard<std::mutex> lock(run->mutex);
    run->finished = true;
    run->finished_cv.notify_all();
  });
  pending->set_queued();  // made before start_run, so nothing can fail between queuing and holding the buffers
  return pending;
}

void engine_transform_pixels(Engine& engine, py::array_t<uint8_t, py::array::c_style> rgb, const TransformSpec& spec,
                             const py::object& out_obj, size_t row, uint64_t seed, uint64_t epoch, uint64_t index,
                             const py::object& scale_bias) {
  if (rgb.ndim() != 3 || rgb.shape(2) != 3 || rgb.shape(0) < 1 || rgb.shape(1) < 1) {
    throw py::value_error("pixels must be a uint8 array of shape [H, W, 3]");
  }
  py::buffer_info info;
  const py::ssize_t rows = py::reinterpret_borrow<py::buffer>(out_obj).request().shape.at(0);
  if (row >= static_cast<size_t>(rows)) throw py::index_error("row outside out");
  const BatchOutput out = batch_output(out_obj, static_cast<size_t>(rows), spec, scale_bias, &info);
  const int h = static_cast<int>(rgb.shape(0)), w = static_cast<int>(rgb.shape(1));
  const uint8_t* src = rgb.data();
  ReleasedGil nogil;
  engine.transform_pixels_into(src, h, w, static_cast<ptrdiff_t>(w) * 3, spec, SampleKey{seed, epoch, index}, out,
                               row);
}

}  // namespace

void register_engine(py::module_& m) {
  // Engine's nice_increment that asks for SCHED_IDLE (csrc/core/thread_pool.h).
  m.attr("IDLE_PRIORITY") = kIdlePriority;
  m.def("sample_crop_boxes", &sample_crop_boxes, py::arg("height"), py::arg("width"), py::arg("scale"),
        py::arg("ratio"), py::arg("hflip"), py::arg("seed"), py::arg("epoch"), py::arg("indices"),
        "RandomResizedCrop boxes [N, 5] = (top, left, height, width, flip) as the engine draws them.");
  m.def("read_file", &read_file_py, py::arg("path"), py::arg("max_file_bytes"),
        "A whole regular file as the engine reads it: (uint8 array, None), or (empty array, reason).");

  py::class_<PendingRun>(m, "PendingRun",
                         "A queued Engine.run (Engine.start_run); it keeps the items' buffers and out alive until "
                         "the run has finished, and waits for the run when dropped.")
      .def("done", &PendingRun::done, "Whether the run has finished (wait() then returns at once).")
      .def("wait", &PendingRun::wait,
           "Wait for the run (GIL released) and return its BatchReport, as run would. Once only.");

  py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>>(m, "Engine",
                                                             "A pool of native threads (the caller counts as one).")
      .def(py::init<int, int, std::string>(), py::arg("threads"), py::arg("nice_increment") = 0,
           py::arg("thread_name") = "fastdata-native")
      .def_property_readonly("threads", &Engine::threads)
      .def_property_readonly("priority_lowered", &Engine::priority_lowered,
                             "False when a native thread could not lower its priority as nice_increment asked.")
      .def("run", &engine_run, py::arg("items"), py::arg("spec"), py::arg("out"), py::arg("seed"), py::arg("epoch"),
           py::arg("indices"), py::arg("strict"), py::arg("max_pixels"), py::arg("max_file_bytes"),
           py::arg("scale_bias") = py::none(),
           "Decode + transform items[i] into out[i] with the GIL released; never raises for bad data.")
      .def("start_run", &engine_start_run, py::arg("items"), py::arg("spec"), py::arg("out"), py::arg("seed"),
           py::arg("epoch"), py::arg("indices"), py::arg("strict"), py::arg("max_pixels"), py::arg("max_file_bytes"),
           py::arg("scale_bias") = py::none(),
           "run, started on the engine's threads: returns at once with a PendingRun. Its rows are decoded once "
           "those of the runs started before it have all been claimed (no barrier between runs), and it finishes "
           "after them. The caller must not touch out until wait() returns.")
      .def("plan", &engine_plan, py::arg("items"), py::arg("spec"), py::arg("seed"), py::arg("epoch"),
           py::arg("indices"), py::arg("max_pixels"), py::arg("max_file_bytes"),
           "Source boxes without decoding pixels (headers only).")
      .def("read_files", &engine_read_files, py::arg("paths"), py::arg("max_file_bytes"),
           "Read files on the pool: ([uint8 array per file], [None or the reason it could not be read])")
      .def("transform_pixels", &engine_transform_pixels, py::arg("pixels"), py::arg("spec"), py::arg("out"),
           py::arg("row"), py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("scale_bias") = py::none(),
           "Crop/resize/flip pixels decoded elsewhere (the Pillow fallback) into out[row].");
}

}  // namespace fastdata::bindings
