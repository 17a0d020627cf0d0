// Benchmark floors and test switches: not part of the library's decode path.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/common.h"
#include "bindings/released_gil.h"
#include "bindings/register.h"
#include "core/augment.h"
#include "core/decoder.h"
#include "core/engine.h"
#include "core/huffman.h"
#include "core/normalize.h"
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

// The decoder's region decode: stored (unoriented) rows [y0, y1) and columns [x0, x1) of
// the image scaled by 1/denom, as uint8 [h, w, 3], and the warnings.
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

// Engine::run's claim order for rows of these encoded sizes; is_path[i]: row i is a path (its
// size unknown before reading) rather than a buffer.
std::vector<size_t> claim_order_py(const std::vector<size_t>& sizes, const std::vector<bool>& is_path) {
  if (is_path.size() != sizes.size()) throw py::value_error("sizes and is_path must have one length");
  std::vector<SampleInput> inputs(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    inputs[i].size = sizes[i];
    if (is_path[i]) inputs[i].path = "row" + std::to_string(i);
  }
  return claim_order(inputs);
}

bool set_claim_largest_first_py(bool enabled) {
  const bool was = claim_largest_first();
  set_claim_largest_first(enabled);
  return was;
}

bool set_overlap_runs_py(bool enabled) {
  const bool was = overlap_runs();
  set_overlap_runs(enabled);
  return was;
}

bool set_fast_huffman(bool enabled) {
  const bool was = fast_huffman_enabled();
  set_fast_huffman_enabled(enabled);
  return was;
}

// The normalize path's portable float32 -> float16 / bfloat16 rounding, value by value.
py::array_t<uint16_t> half_bits_py(py::array_t<float, py::array::c_style | py::array::forcecast> values, bool bf16) {
  py::array_t<uint16_t> out(values.size());
  const float* in = values.data();
  uint16_t* o = out.mutable_data();
  for (py::ssize_t i = 0; i < values.size(); ++i) o[i] = bf16 ? bfloat16_bits(in[i]) : float16_bits(in[i]);
  return out;
}

}  // namespace

void register_testing(py::module_& m) {
  m.def("_half_bits", &half_bits_py, py::arg("values"), py::arg("bfloat16"),
        "Testing: float16 (or bfloat16) bits of float32 values, by the normalize path's portable rounding.");
  m.def("entropy_floor", &entropy_floor_py, py::arg("datas"), py::arg("spec"), py::arg("seed"), py::arg("epoch"),
        "Benchmark floor: entropy-decode only the rows each sample's crop needs (one thread).");
  m.def("plain_decode", &plain_decode_py, py::arg("datas"),
        "Benchmark baseline: libjpeg-turbo full decode to RGB into one reused buffer (one thread).");
  m.def("_set_fast_huffman", &set_fast_huffman, py::arg("enabled"),
        "Testing/A-B switch: decode baseline and progressive JPEGs with fastdata's Huffman decoder "
        "(default) or libjpeg-turbo's own. Returns the previous setting.");
  m.def("_fast_huffman_scans", &fast_huffman_scans,
        "Scans decoded by fastdata's Huffman decoder so far in this process (for tests).");
  m.def("_set_fast_progressive", [](bool enabled) {
          const bool was = fast_progressive_enabled();
          set_fast_progressive_enabled(enabled);
          return was;
        }, py::arg("enabled"),
        "A/B switch: progressive JPEGs with fastdata's Huffman decoder (default) or libjpeg-turbo's own, "
        "baseline ones unchanged. Returns the previous setting.");
  m.def("_fast_progressive_scans", &fast_progressive_scans,
        "Progressive scans decoded by fastdata's Huffman decoder so far in this process (for tests).");
  m.def("_restart_index_jumps", &restart_index_jumps,
        "Jumps over skipped restart intervals with a restart index so far in this process (for tests).");
  m.def("_set_claim_largest_first", &set_claim_largest_first_py, py::arg("enabled"),
        "Testing/A-B switch: the engine's threads claim a run's rows largest first (default) or in "
        "the rows' own order. Returns the previous setting.");
  m.def("_set_overlap_runs", &set_overlap_runs_py, py::arg("enabled"),
        "Testing/A-B switch: the rows of a started run are claimed as soon as those of the runs started "
        "before it all are (default), or only once those runs have finished (the old barrier between runs). "
        "Read when a run starts. Returns the previous setting.");
  m.def("_overlap_runs", &overlap_runs, "Whether started runs overlap (_set_overlap_runs).");
  m.def("_claim_order", &claim_order_py, py::arg("sizes"), py::arg("is_path"),
        "Testing: the order Engine::run's threads take rows of these encoded sizes in.");
  m.def("_decode_region", &decode_region_py, py::arg("data"), py::arg("denom"), py::arg("x0"), py::arg("y0"),
        py::arg("x1"), py::arg("y1"), py::arg("strict"),
        "Testing: the decoder's region decode (stored orientation), uint8 [h, w, 3], and the warnings.");
}

}  // namespace fastdata::bindings
