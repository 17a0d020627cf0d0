// Lossless progressive -> baseline rewrite (fastdata-convert's default).
#include <pybind11/pybind11.h>

#include <vector>

#include "bindings/common.h"
#include "bindings/released_gil.h"
#include "bindings/register.h"
#include "core/transcode.h"

namespace fastdata::bindings {

namespace {

py::bytes transcode_to_baseline_py(const py::object& data, int64_t max_pixels) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  std::vector<uint8_t> out;
  {
    ReleasedGil nogil;
    out = transcode_to_baseline(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), max_pixels);
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
}

}  // namespace

void register_transcode(py::module_& m) {
  m.def("transcode_to_baseline", &transcode_to_baseline_py, py::arg("data"), py::arg("max_pixels"),
        "Lossless rewrite of a grayscale/YCbCr/RGB JPEG as sequential JPEG (same DCT coefficients, optimized "
        "Huffman tables, APP1/APP2 kept). NativeDecodeError for corrupt data (warnings included) or above "
        "max_pixels (> 0); ValueError for CMYK/YCCK.");
}

}  // namespace fastdata::bindings
