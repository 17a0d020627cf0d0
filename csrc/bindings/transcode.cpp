// Lossless rewrites at cache-write time: progressive -> baseline, and restart-indexed baseline.
#include <pybind11/pybind11.h>

#include <vector>

#include "bindings/common.h"
#include "bindings/released_gil.h"
#include "bindings/register.h"
#include "core/restart_index.h"
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

py::bytes transcode_restart_indexed_py(const py::object& data, int64_t max_pixels, int interval_mcus,
                                       int index_stride) {
  BufferViews views;
  const Py_buffer& v = views.add(data);
  std::vector<uint8_t> out;
  {
    py::gil_scoped_release nogil;
    out = transcode_restart_indexed(static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len), max_pixels,
                                    interval_mcus, index_stride);
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
}

}  // namespace

void register_transcode(py::module_& m) {
  m.def("transcode_to_baseline", &transcode_to_baseline_py, py::arg("data"), py::arg("max_pixels"),
        "Lossless rewrite of a grayscale/YCbCr/RGB JPEG as sequential JPEG (same DCT coefficients, optimized "
        "Huffman tables, APP1/APP2 kept). NativeDecodeError for corrupt data (warnings included) or above "
        "max_pixels (> 0); ValueError for CMYK/YCCK.");
  m.def("transcode_restart_indexed", &transcode_restart_indexed_py, py::arg("data"), py::arg("max_pixels"),
        py::arg("interval_mcus"), py::arg("index_stride") = kRestartIndexStride,
        "transcode_to_baseline with a restart marker every interval_mcus MCUs (0: one per MCU row) and fastdata's "
        "restart index (an APP15 segment giving the start of every index_stride-th interval), so that crop "
        "decodes start at the interval where the crop starts. Lossless. Errors as transcode_to_baseline; "
        "ValueError for an interval outside 0..65535 or a stride outside 1..65535.");
}

}  // namespace fastdata::bindings
