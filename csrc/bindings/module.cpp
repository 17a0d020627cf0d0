// pybind11 surface of fastdata._C. Arguments are checked and converted with the GIL
// held; the work itself runs with the GIL released. No Python object is touched by a
// worker thread.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/augment.h"
#include "core/decoder.h"
#include "core/engine.h"
#include "core/sample.h"
#include "core/transcode.h"

namespace py = pybind11;
using namespace fastdata;

namespace {

// Holds PyBUF_SIMPLE views (contiguous bytes) of Python objects for the duration of a call.
class BufferViews {
 public:
  ~BufferViews() {
    for (auto& v : views_) PyBuffer_Release(&v);
  }
  const Py_buffer& add(const py::handle& obj, bool writable = false) {
    views_.emplace_back();
    if (PyObject_GetBuffer(obj.ptr(), &views_.back(), writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      views_.pop_back();
      throw py::error_already_set();
    }
    return views_.back();
  }

 private:
  std::vector<Py_buffer> views_;  // Py_buffer is trivially movable before release
};

TransformSpec spec_from_tuple(const py::tuple& t) {
  if (t.size() != 10) throw py::value_error("internal: transform spec tuple must have 10 fields");
  TransformSpec s;
  const int kind = t[0].cast<int>();
  if (kind < 0 || kind > 2) throw py::value_error("unknown transform kind");
  s.kind = static_cast<TransformKind>(kind);
  s.out_h = t[1].cast<int>();
  s.out_w = t[2].cast<int>();
  s.scale_lo = t[3].cast<double>();
  s.scale_hi = t[4].cast<double>();
  s.ratio_lo = t[5].cast<double>();
  s.ratio_hi = t[6].cast<double>();
  s.hflip = t[7].cast<double>();
  s.resize_to = t[8].cast<int>();
  s.roi = t[9].cast<bool>();
  if (s.out_h <= 0 || s.out_w <= 0) throw py::value_error("output size must be positive");
  return s;
}

const char* color_space_name(ColorSpace c) {
  switch (c) {
    case ColorSpace::kGray: return "gray";
    case ColorSpace::kYCbCr: return "ycbcr";
    case ColorSpace::kRGB: return "rgb";
    case ColorSpace::kCMYK: return "cmyk";
    case ColorSpace::kYCCK: return "ycck";
    default: return "other";
  }
}

SampleScratch& thread_scratch() {
  thread_local SampleScratch scratch;
  return scratch;
}

py::dict probe(const py::object& data) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  JpegInfo info;
  {
    py::gil_scoped_release nogil;
    info = thread_scratch().decoder.read_header(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), false);
  }
  py::dict d;
  d["width"] = info.width;
  d["height"] = info.height;
  d["oriented_width"] = info.oriented_width();
  d["oriented_height"] = info.oriented_height();
  d["color_space"] = color_space_name(info.color_space);
  d["subsampling"] = info.subsampling;
  d["progressive"] = info.progressive;
  d["orientation"] = info.orientation;
  d["components"] = info.components;
  d["restart_indexed"] = info.restart_indexed;
  return d;
}

py::bytes transcode_to_baseline_py(const py::object& data, int64_t max_pixels) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  std::vector<uint8_t> out;
  {
    py::gil_scoped_release nogil;
    out = transcode_to_baseline(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), max_pixels);
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
}

py::bytes transcode_restart_indexed_py(const py::object& data, int64_t max_pixels, int interval_mcus) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  std::vector<uint8_t> out;
  {
    py::gil_scoped_release nogil;
    out = transcode_restart_indexed(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), max_pixels,
                                    interval_mcus);
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
}

// Tests' window onto JpegDecoder::decode_region: stored (unoriented) rows [y0, y1) and
// columns [x0, x1) of the image scaled by 1/denom, as uint8 [h, w, 3], and the warnings.
py::tuple decode_region_py(const py::object& data, int denom, int x0, int y0, int x1, int y1, bool strict) {
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) throw py::value_error("denom must be 1, 2, 4 or 8");
  BufferViews views;
  const Py_buffer& v = views.add(data);
  std::vector<uint8_t> pixels;
  int h = 0, w = 0, warnings = 0;
  {
    py::gil_scoped_release nogil;
    JpegDecoder& dec = thread_scratch().decoder;
    dec.read_header(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), strict);
    const DecodedRegion r = dec.decode_region(denom, x0, y0, x1, y1);
    // decode_region clamps to the image and may start left of x0 (iMCU alignment).
    const int cx0 = std::max(x0, r.x0), cx1 = std::min(x1, r.x0 + r.width);
    h = r.height;
    w = std::max(0, cx1 - cx0);
    pixels.resize(static_cast<size_t>(h) * w * 3);
    for (int y = 0; y < h; ++y) {
      std::memcpy(pixels.data() + static_cast<size_t>(y) * w * 3, r.pixels + y * r.stride + (cx0 - r.x0) * 3,
                  static_cast<size_t>(w) * 3);
    }
    warnings = dec.warnings();
  }
  py::array_t<uint8_t> out({h, w, 3});
  std::memcpy(out.mutable_data(), pixels.data(), pixels.size());
  return py::make_tuple(out, warnings);
}

py::tuple decode_full_py(const py::object& data, bool strict, int64_t max_pixels) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  py::array_t<uint8_t> out;
  int warnings;
  {
    py::gil_scoped_release nogil;
    warnings = decode_full(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), strict, max_pixels,
                           &thread_scratch(), [&](int h, int w) {
                             py::gil_scoped_acquire gil;
                             out = py::array_t<uint8_t>({h, w, 3});
                             return out.mutable_data();
                           });
  }
  return py::make_tuple(out, warnings);
}

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

std::vector<SampleInput> inputs_from_items(const py::sequence& items, BufferViews* views);

// The benchmark hooks below take encoded buffers only (no file reads in what they time).
std::vector<SampleInput> buffers_only(const py::list& datas, BufferViews* views) {
  std::vector<SampleInput> inputs = inputs_from_items(datas, views);
  for (const auto& in : inputs) {
    if (!in.path.empty()) throw py::type_error("benchmark hooks take encoded buffers, not paths");
  }
  return inputs;
}

void entropy_floor_py(const py::list& datas, const py::tuple& spec_t, uint64_t seed, uint64_t epoch) {
  const TransformSpec spec = spec_from_tuple(spec_t);
  BufferViews views;
  const std::vector<SampleInput> inputs = buffers_only(datas, &views);
  py::gil_scoped_release nogil;
  for (size_t i = 0; i < inputs.size(); ++i) {
    entropy_floor(inputs[i].data, inputs[i].size, spec, SampleKey{seed, epoch, i}, &thread_scratch());
  }
}

void plain_decode_py(const py::list& datas) {
  BufferViews views;
  const std::vector<SampleInput> inputs = buffers_only(datas, &views);
  py::gil_scoped_release nogil;
  JpegDecoder decoder;  // its own, switched to libjpeg-turbo's Huffman decoder for good
  decoder.set_fast_huffman(false);
  for (const auto& in : inputs) {
    const JpegInfo info = decoder.read_header(in.data, in.size, false);
    decoder.decode_region(1, 0, 0, info.width, info.height);  // into the decoder's reused buffer
  }
}

struct EngineDeleter {
  // Joining workers needs no Python, but other Python threads should not wait on it.
  void operator()(Engine* e) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      delete e;
    } else {
      delete e;
    }
  }
};

// str items are paths the native threads read; anything else must be a byte buffer.
std::vector<SampleInput> inputs_from_items(const py::sequence& items, BufferViews* views) {
  const size_t n = static_cast<size_t>(py::len(items));
  std::vector<SampleInput> inputs(n);
  for (size_t i = 0; i < n; ++i) {
    py::handle item = items[i];
    if (py::isinstance<py::str>(item)) {
      inputs[i].path = item.cast<std::string>();
      if (inputs[i].path.empty()) throw py::value_error("empty file path at row " + std::to_string(i));
    } else {
      const Py_buffer& v = views->add(item);
      inputs[i].data = static_cast<const uint8_t*>(v.buf);
      inputs[i].size = static_cast<size_t>(v.len);
    }
  }
  return inputs;
}

std::vector<int64_t> indices_from(const py::object& indices_obj, size_t n) {
  std::vector<int64_t> indices;
  if (!indices_obj.is_none()) {
    auto arr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(indices_obj);
    if (!arr || static_cast<size_t>(arr.size()) != n) throw py::value_error("indices must have one entry per item");
    indices.assign(arr.data(), arr.data() + n);
  }
  return indices;
}

py::tuple engine_plan(Engine& engine, const py::sequence& items, const py::tuple& spec_t, uint64_t seed,
                      uint64_t epoch, const py::object& indices_obj, int64_t max_pixels) {
  const TransformSpec spec = spec_from_tuple(spec_t);
  BufferViews views;
  const std::vector<SampleInput> inputs = inputs_from_items(items, &views);
  const size_t n = inputs.size();
  const std::vector<int64_t> indices = indices_from(indices_obj, n);
  std::vector<Engine::SamplePlan> plans;
  std::vector<SampleResult> results;
  {
    py::gil_scoped_release nogil;
    engine.plan(inputs, spec, seed, epoch, indices.empty() ? nullptr : indices.data(), max_pixels, &plans, &results);
  }
  py::array_t<double> boxes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(4)});
  py::array_t<int32_t> meta({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(4)});
  auto b = boxes.mutable_unchecked<2>();
  auto m = meta.mutable_unchecked<2>();
  py::list failures;
  for (size_t i = 0; i < n; ++i) {
    const auto& p = plans[i];
    b(i, 0) = p.x0, b(i, 1) = p.y0, b(i, 2) = p.x1, b(i, 3) = p.y1;
    m(i, 0) = p.flip, m(i, 1) = p.height, m(i, 2) = p.width, m(i, 3) = p.orientation;
    if (results[i].status != SampleStatus::kOk) {
      failures.append(py::make_tuple(i, static_cast<int>(results[i].status), results[i].message));
    }
  }
  return py::make_tuple(boxes, meta, failures);
}

// Files read on the engine's threads (GIL released), each returned as a uint8 array that
// owns the bytes read (no copy), or the reason it could not be read.
py::tuple engine_read_files(Engine& engine, const std::vector<std::string>& paths) {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::string> errors;
  {
    py::gil_scoped_release nogil;
    engine.read_files(paths, &bufs, &errors);
  }
  py::list arrays, reasons;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto* owned = new std::vector<uint8_t>(std::move(bufs[i]));
    py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
    arrays.append(py::array_t<uint8_t>({static_cast<py::ssize_t>(owned->size())}, owned->data(), free_when_done));
    reasons.append(errors[i].empty() ? py::object(py::none()) : py::object(py::str(errors[i])));
  }
  return py::make_tuple(arrays, reasons);
}

// out: uint8 or float32 [N, H, W, 3] with contiguous rows; float32 needs (scale, bias).
BatchOutput batch_output(const py::object& out_obj, size_t n, const TransformSpec& spec,
                         const py::object& scale_bias, py::buffer_info* info) {
  py::buffer out_buf = py::reinterpret_borrow<py::buffer>(out_obj);
  *info = out_buf.request(true);
  const bool f32 = info->format == py::format_descriptor<float>::format();
  const py::ssize_t item = f32 ? 4 : 1;
  if (!(f32 || (info->itemsize == 1 && info->format == py::format_descriptor<uint8_t>::format())) ||
      info->ndim != 4 || info->shape[0] != static_cast<py::ssize_t>(n) || info->shape[1] != spec.out_h ||
      info->shape[2] != spec.out_w || info->shape[3] != 3 || info->strides[3] != item ||
      info->strides[2] != 3 * item || info->strides[1] != 3 * item * spec.out_w) {
    throw py::value_error("out must be a writable uint8 or float32 array of shape [N, H, W, 3] with contiguous rows");
  }
  BatchOutput out;
  out.row_stride = info->strides[0];
  if (f32) {
    if (scale_bias.is_none()) throw py::value_error("a float32 out needs per-channel (scale, bias)");
    auto sb = scale_bias.cast<std::pair<std::vector<float>, std::vector<float>>>();
    if (sb.first.size() != 3 || sb.second.size() != 3) throw py::value_error("scale and bias need 3 values each");
    out.f32 = static_cast<float*>(info->ptr);
    for (int c = 0; c < 3; ++c) out.scale[c] = sb.first[c], out.bias[c] = sb.second[c];
  } else {
    out.u8 = static_cast<uint8_t*>(info->ptr);
  }
  return out;
}

py::tuple engine_run(Engine& engine, const py::sequence& items, const py::tuple& spec_t, const py::object& out_obj,
                     uint64_t seed, uint64_t epoch, const py::object& indices_obj, bool strict, int64_t max_pixels,
                     const py::object& scale_bias) {
  const TransformSpec spec = spec_from_tuple(spec_t);
  BufferViews views;
  const std::vector<SampleInput> inputs = inputs_from_items(items, &views);
  const size_t n = inputs.size();
  py::buffer_info info;
  const BatchOutput out = batch_output(out_obj, n, spec, scale_bias, &info);
  const std::vector<int64_t> indices = indices_from(indices_obj, n);
  std::vector<SampleResult> results;
  BatchTimes times;
  {
    py::gil_scoped_release nogil;
    engine.run(inputs, spec, seed, epoch, indices.empty() ? nullptr : indices.data(), strict, max_pixels, out,
               &results, &times);
  }
  py::list failures;
  int warnings = 0;
  for (size_t i = 0; i < n; ++i) {
    warnings += results[i].warnings;
    if (results[i].status != SampleStatus::kOk) {
      failures.append(py::make_tuple(i, static_cast<int>(results[i].status), results[i].message));
    }
  }
  return py::make_tuple(failures, warnings, times.read_seconds, times.decode_seconds);
}

void engine_transform_pixels(Engine& engine, py::array_t<uint8_t, py::array::c_style> rgb, const py::tuple& spec_t,
                             const py::object& out_obj, size_t row, uint64_t seed, uint64_t epoch, uint64_t index,
                             const py::object& scale_bias) {
  const TransformSpec spec = spec_from_tuple(spec_t);
  if (rgb.ndim() != 3 || rgb.shape(2) != 3 || rgb.shape(0) < 1 || rgb.shape(1) < 1) {
    throw py::value_error("pixels must be a uint8 array of shape [H, W, 3]");
  }
  py::buffer_info info;
  const py::ssize_t rows = py::reinterpret_borrow<py::buffer>(out_obj).request().shape.at(0);
  if (row >= static_cast<size_t>(rows)) throw py::index_error("row outside out");
  const BatchOutput out = batch_output(out_obj, static_cast<size_t>(rows), spec, scale_bias, &info);
  const int h = static_cast<int>(rgb.shape(0)), w = static_cast<int>(rgb.shape(1));
  const uint8_t* src = rgb.data();
  py::gil_scoped_release nogil;
  engine.transform_pixels_into(src, h, w, static_cast<ptrdiff_t>(w) * 3, spec, SampleKey{seed, epoch, index}, out,
                               row);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastdata native core: libjpeg-turbo decode with fused crop/resize/flip on native threads";

  // Every libjpeg failure arrives as fastdata.DecodeError (set from Python at import).
  py::register_exception<DecodeError>(m, "NativeDecodeError", PyExc_ValueError);

  m.def("probe", &probe, py::arg("data"), "Header fields of a JPEG (no pixel decode).");
  m.def("decode_full", &decode_full_py, py::arg("data"), py::arg("strict"), py::arg("max_pixels"),
        "Full decode to uint8 RGB HxWx3 with EXIF orientation; returns (array, warnings).");
  m.def("transcode_to_baseline", &transcode_to_baseline_py, py::arg("data"), py::arg("max_pixels"),
        "Lossless rewrite of a grayscale/YCbCr/RGB JPEG as sequential JPEG (same DCT coefficients, optimized "
        "Huffman tables, APP1/APP2 kept). NativeDecodeError for corrupt data (warnings included) or above "
        "max_pixels (> 0); ValueError for CMYK/YCCK.");
  m.def("transcode_restart_indexed", &transcode_restart_indexed_py, py::arg("data"), py::arg("max_pixels"),
        py::arg("interval_mcus"),
        "transcode_to_baseline with a restart marker every interval_mcus MCUs (0: one per MCU row) and fastdata's "
        "restart index (APP15), so crop decodes start at the interval where the crop starts. Lossless.");
  m.def("_decode_region", &decode_region_py, py::arg("data"), py::arg("denom"), py::arg("x0"), py::arg("y0"),
        py::arg("x1"), py::arg("y1"), py::arg("strict"),
        "Testing: the decoder's region decode (stored orientation), uint8 [h, w, 3], and the warnings.");
  m.def("sample_crop_boxes", &sample_crop_boxes, py::arg("height"), py::arg("width"), py::arg("scale"),
        py::arg("ratio"), py::arg("hflip"), py::arg("seed"), py::arg("epoch"), py::arg("indices"),
        "RandomResizedCrop boxes [N, 5] = (top, left, height, width, flip) as the engine draws them.");
  m.def("entropy_floor", &entropy_floor_py, py::arg("datas"), py::arg("spec"), py::arg("seed"), py::arg("epoch"),
        "Benchmark floor: entropy-decode only the rows each sample's crop needs (one thread).");
  m.def("plain_decode", &plain_decode_py, py::arg("datas"),
        "Benchmark baseline: libjpeg-turbo full decode to RGB into one reused buffer (one thread).");
  m.def("_set_fast_huffman", [](bool enabled) {
          const bool was = fast_huffman_enabled();
          set_fast_huffman_enabled(enabled);
          return was;
        }, py::arg("enabled"),
        "Testing/A-B switch: decode baseline JPEGs with fastdata's Huffman decoder (default) or "
        "libjpeg-turbo's own. Returns the previous setting.");
  m.def("_fast_huffman_scans", &fast_huffman_scans,
        "Scans decoded by fastdata's Huffman decoder so far in this process (for tests).");
  m.def("_restart_index_jumps", &restart_index_jumps,
        "Jumps over skipped restart intervals with a restart index so far in this process (for tests).");
  m.def("jpeg_info", []() {
    py::dict d;
    d["libjpeg_turbo_version"] = libjpeg_version();
    const char* force_none = std::getenv("JSIMD_FORCENONE");
    d["simd_disabled_by_env"] = force_none != nullptr && std::string(force_none) == "1";
    return d;
  });

  py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>>(m, "Engine")
      .def(py::init<int>(), py::arg("threads"))
      .def_property_readonly("threads", &Engine::threads)
      .def("run", &engine_run, py::arg("items"), py::arg("spec"), py::arg("out"), py::arg("seed"), py::arg("epoch"),
           py::arg("indices"), py::arg("strict"), py::arg("max_pixels"), py::arg("scale_bias") = py::none())
      .def("plan", &engine_plan, py::arg("items"), py::arg("spec"), py::arg("seed"), py::arg("epoch"),
           py::arg("indices"), py::arg("max_pixels"),
           "Source boxes without decoding: (boxes f64 [N,4] x0,y0,x1,y1 oriented; meta i32 [N,4] flip,h,w,orientation; "
           "failures [(row, status, message)])")
      .def("read_files", &engine_read_files, py::arg("paths"),
           "Read files on the pool: ([uint8 array per file], [None or the reason it could not be read])")
      .def("transform_pixels", &engine_transform_pixels, py::arg("pixels"), py::arg("spec"), py::arg("out"),
           py::arg("row"), py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("scale_bias") = py::none());
}
