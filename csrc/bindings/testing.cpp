// Benchmark floors and test switches: not part of the library's decode path.
#include <pybind11/pybind11.h>

#include <vector>

#include "bindings/common.h"
#include "bindings/released_gil.h"
#include "bindings/register.h"
#include "core/augment.h"
#include "core/decoder.h"
#include "core/huffman.h"
#include "core/sample.h"

namespace fastdata::bindings {

namespace {

void entropy_floor_py(const py::list& datas, const TransformSpec& spec, uint64_t seed, uint64_t epoch) {
  BufferViews views;
  const std::vector<SampleInput> inputs = buffers_only(datas, &views);
  ReleasedGil nogil;
  for (size_t i = 0; i < inputs.size(); ++i) {
    entropy_floor(inputs[i].data, inputs[i].size, spec, SampleKey{seed, epoch, i}, &thread_scratch());
  }
}

void plain_decode_py(const py::list& datas) {
  BufferViews views;
  const std::vector<SampleInput> inputs = buffers_only(datas, &views);
  ReleasedGil nogil;
  JpegDecoder decoder;  // its own, switched to libjpeg-turbo's Huffman decoder for good
  decoder.set_fast_huffman(false);
  for (const auto& in : inputs) {
    const JpegInfo info = decoder.read_header(in.data, in.size, false);
    decoder.decode_region(1, 0, 0, info.width, info.height);  // into the decoder's reused buffer
  }
}

bool set_fast_huffman(bool enabled) {
  const bool was = fast_huffman_enabled();
  set_fast_huffman_enabled(enabled);
  return was;
}

}  // namespace

void register_testing(py::module_& m) {
  m.def("entropy_floor", &entropy_floor_py, py::arg("datas"), py::arg("spec"), py::arg("seed"), py::arg("epoch"),
        "Benchmark floor: entropy-decode only the rows each sample's crop needs (one thread).");
  m.def("plain_decode", &plain_decode_py, py::arg("datas"),
        "Benchmark baseline: libjpeg-turbo full decode to RGB into one reused buffer (one thread).");
  m.def("_set_fast_huffman", &set_fast_huffman, py::arg("enabled"),
        "Testing/A-B switch: decode baseline JPEGs with fastdata's Huffman decoder (default) or "
        "libjpeg-turbo's own. Returns the previous setting.");
  m.def("_fast_huffman_scans", &fast_huffman_scans,
        "Scans decoded by fastdata's Huffman decoder so far in this process (for tests).");
}

}  // namespace fastdata::bindings
