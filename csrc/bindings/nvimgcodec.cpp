// NvImageCodecInstance and NvImageCodecBatch (csrc/gpu/) for the gpu decoder: decoders made on a
// shared instance, one call per batch slice, the GIL released for all of it, statuses back as
// one numpy array.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/common.h"
#include "bindings/register.h"
#include "bindings/released_gil.h"
#include "gpu/nvimgcodec_batch.h"
#include "gpu/nvimgcodec_instance.h"

namespace py = pybind11;

namespace fastdata::bindings {
namespace {

using Ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

py::array_t<uint8_t> decode_batch_into(NvImageCodecBatch& self, const py::sequence& datas, uintptr_t out,
                                       int64_t out_bytes, const Ints& offsets, const Ints& heights,
                                       const Ints& widths, uintptr_t cuda_stream) {
  const size_t n = static_cast<size_t>(py::len(datas));
  if (offsets.ndim() != 1 || heights.ndim() != 1 || widths.ndim() != 1 || static_cast<size_t>(offsets.size()) != n ||
      static_cast<size_t>(heights.size()) != n || static_cast<size_t>(widths.size()) != n) {
    throw py::value_error("datas, offsets, heights and widths must have one length (1-D arrays)");
  }
  if (out == 0 && n > 0) throw py::value_error("out is a null address");
  const int64_t* off = offsets.data();
  const int64_t* h = heights.data();
  const int64_t* w = widths.data();
  BufferViews views;
  std::vector<EncodedRow> rows(n);
  for (size_t i = 0; i < n; ++i) {
    // The library writes height * width * 3 bytes at the offset: it must lie inside out.
    if (h[i] <= 0 || w[i] <= 0 || h[i] > 65535 || w[i] > 65535) {
      throw py::value_error("row " + std::to_string(i) + ": size " + std::to_string(h[i]) + "x" +
                            std::to_string(w[i]) + " is not a JPEG's");
    }
    if (off[i] < 0 || out_bytes < h[i] * w[i] * 3 || off[i] > out_bytes - h[i] * w[i] * 3) {
      throw py::value_error("row " + std::to_string(i) + ": its pixels would lie outside the output buffer");
    }
    const Py_buffer& view = views.add(datas[i]);
    rows[i] = EncodedRow{static_cast<const uint8_t*>(view.buf), static_cast<size_t>(view.len), off[i], h[i], w[i]};
  }
  std::vector<GpuDecodeStatus> statuses;
  {
    ReleasedGil nogil;
    statuses = self.decode(rows, reinterpret_cast<uint8_t*>(out), reinterpret_cast<void*>(cuda_stream));
  }
  py::array_t<uint8_t> result(static_cast<py::ssize_t>(n));
  for (size_t i = 0; i < n; ++i) result.mutable_data()[i] = static_cast<uint8_t>(statuses[i]);
  return result;
}

}  // namespace

void register_nvimgcodec(py::module_& m) {
  py::class_<NvImageCodecInstance, std::shared_ptr<NvImageCodecInstance>>(
      m, "NvImageCodecInstance",
      "An nvImageCodec instance (libnvimgcodec loaded from `library` at run time, its codec extensions "
      "loaded): the NvImageCodecBatch decoders made on it share it.")
      .def(py::init([](const std::string& library) {
             ReleasedGil nogil;  // loading the codec extensions takes about a second, GIL-free
             return std::make_shared<NvImageCodecInstance>(library);
           }),
           py::arg("library"))
      .def_property_readonly("library_version", &NvImageCodecInstance::library_version,
                             "nvImageCodec's version, major * 1000 + minor * 100 + patch.")
      .def_property_readonly("create_seconds", &NvImageCodecInstance::create_seconds,
                             "Seconds nvimgcodecInstanceCreate took (loading the codec extensions).");

  py::class_<NvImageCodecBatch>(m, "NvImageCodecBatch",
                                "One nvImageCodec decoder, made on `instance`, that decodes a batch slice into one "
                                "buffer in one call, with the GIL released. device_id None: host buffers (the "
                                "CPU-only backend).")
      .def(py::init([](std::shared_ptr<NvImageCodecInstance> instance, std::optional<int> device_id,
                       int max_cpu_threads, const std::vector<int32_t>& backend_kinds, const std::string& options) {
             ReleasedGil nogil;
             return new NvImageCodecBatch(std::move(instance), device_id.value_or(nvimgcodec_abi::kDeviceCpuOnly),
                                          max_cpu_threads, backend_kinds, options);
           }),
           py::arg("instance"), py::arg("device_id"), py::arg("max_cpu_threads"), py::arg("backend_kinds"),
           py::arg("options"))
      .def("decode", &decode_batch_into, py::arg("datas"), py::arg("out"), py::arg("out_bytes"),
           py::arg("offsets"), py::arg("heights"), py::arg("widths"), py::arg("cuda_stream"),
           "Decode datas[i] (stored orientation, HWC RGB uint8, rows of widths[i] * 3 bytes) to address "
           "out + offsets[i] of a buffer of out_bytes (device memory, or host memory for the CPU-only "
           "backend) on CUDA stream cuda_stream (0: default). Returns uint8 statuses per row: 0 decoded, "
           "1 refused by nvImageCodec, 2 header unreadable, 3 header size differs from heights/widths.")
      .def_property_readonly("host_buffers", &NvImageCodecBatch::host_buffers,
                             "Whether it decodes into host memory (the CPU-only backend).")
      .def_property_readonly("instance", &NvImageCodecBatch::instance, "The NvImageCodecInstance it was made on.")
      .def_property_readonly("create_seconds", &NvImageCodecBatch::create_seconds,
                             "Seconds nvimgcodecDecoderCreate took.");
}

}  // namespace fastdata::bindings
