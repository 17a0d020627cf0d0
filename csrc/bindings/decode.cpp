// Single-image entry points: header probe, full decode, and which libjpeg this build uses.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <string>

#include "bindings/common.h"
#include "bindings/released_gil.h"
#include "bindings/register.h"
#include "core/cpu_features.h"
#include "core/decoder.h"
#include "core/huffman.h"
#include "core/sample.h"

namespace fastdata::bindings {

namespace {

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

py::dict probe(const py::object& data) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  JpegInfo info;
  {
    ReleasedGil nogil;
    info = thread_scratch().decoder.read_header(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), false);
  }
  py::dict d;
  d["width"] = info.width;
  d["height"] = info.height;
  d["oriented_width"] = info.oriented_width();
  d["oriented_height"] = info.oriented_height();
  d["color_space"] = color_space_name(info.color_space);
  d["subsampling"] = subsampling_name(info.subsampling);
  d["progressive"] = info.progressive;
  d["orientation"] = info.orientation;
  d["components"] = info.components;
  d["restart_indexed"] = info.restart_indexed;
  return d;
}

py::tuple decode_full_py(const py::object& data, bool strict, int64_t max_pixels) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  py::array_t<uint8_t> out;
  int warnings;
  {
    ReleasedGil nogil;
    warnings = decode_full(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), strict, max_pixels,
                           &thread_scratch(), [&](int h, int w) {
                             ReleasedGil::Held gil(nogil);
                             out = py::array_t<uint8_t>({h, w, 3});
                             return out.mutable_data();
                           });
  }
  return py::make_tuple(out, warnings);
}

py::dict jpeg_info() {
  py::dict d;
  d["libjpeg_turbo_version"] = libjpeg_version();
  const char* force_none = std::getenv("JSIMD_FORCENONE");
  d["simd_disabled_by_env"] = force_none != nullptr && std::string(force_none) == "1";
  // Which copy of fastdata's progressive Huffman decoder this CPU runs: "pdep" (BMI2's bit
  // deposit), "software-deposit" (BMI2 without it: AMD Zen 1/2, or FASTDATA_SOFTWARE_BIT_DEPOSIT=1)
  // or "portable" (no BMI2, or FASTDATA_FORCE_SCALAR=1).
  d["progressive_decoder"] = progressive_decoder_copy();
  // fastdata's test switches set now (fastdata-doctor warns: slower copies in a training job)
  py::list switches;
  for (const char* name : kTestSwitches) {
    if (env_switch(name)) switches.append(name);
  }
  d["test_switches"] = switches;
  return d;
}

}  // namespace

void register_decode(py::module_& m) {
  m.def("probe", &probe, py::arg("data"), "Header fields of a JPEG (no pixel decode).");
  m.def("decode_full", &decode_full_py, py::arg("data"), py::arg("strict"), py::arg("max_pixels"),
        "Full decode to uint8 RGB HxWx3 with EXIF orientation; returns (array, warnings).");
  m.def("jpeg_info", &jpeg_info, "The libjpeg-turbo this build runs, whether its SIMD is switched off by env, and which copy of "
        "fastdata's progressive decoder this CPU runs.");
}

}  // namespace fastdata::bindings
