// The typed contract between fastdata._C and Python: what a batch call returns. These hold
// Python objects (numpy arrays), so they live here, not in core/.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/engine.h"

namespace fastdata::bindings {

namespace py = pybind11;

// One sample that did not come out of the native pass (row of the batch, why, libjpeg's or
// the reader's message). kNotJpeg rows are left for the caller's fallback decoder.
struct SampleFailure {
  size_t row = 0;
  SampleStatus status = SampleStatus::kOk;
  std::string message;
  py::object file_bytes = py::none();  // kNotJpeg read from a path: those bytes (uint8), for the fallback
};

// Engine.run's outcome. Times are summed over native threads.
struct BatchReport {
  std::vector<SampleFailure> failures;
  int warnings = 0;  // libjpeg corrupt-data warnings over the batch (non-strict decodes)
  double read_seconds = 0;
  double decode_seconds = 0;
  double wall_seconds = 0;  // the run's own duration (a started run: its share, BatchTimes in core/engine.h)
};

// Engine.plan's outcome: per sample, the source box in EXIF-oriented pixels, the flip, the
// oriented size, the EXIF orientation and the header facts decoders are chosen by (what the
// header reader parsed, so Python never walks the markers again). Failed rows keep zeros.
struct CropPlan {
  py::array_t<double> boxes;         // float64 [N, 4]: x0, y0, x1, y1
  py::array_t<bool> flips;           // bool [N]
  py::array_t<int32_t> sizes;        // int32 [N, 2]: height, width
  py::array_t<int32_t> orientations; // int32 [N]
  py::array_t<int32_t> components;   // int32 [N]: colour components (1 gray, 3, 4 CMYK/YCCK)
  py::array_t<int32_t> precisions;   // int32 [N]: bits per sample
  py::array_t<bool> arithmetic;      // bool [N]: arithmetic-coded instead of Huffman
  py::array_t<bool> progressive;     // bool [N]: multi-scan (progressive) entropy data
  py::array_t<int32_t> subsamplings; // int32 [N]: Subsampling codes, indices into kSubsamplingNames
  py::array_t<bool> rgb_coded;       // bool [N]: three components libjpeg reads as RGB, not YCbCr
  std::vector<SampleFailure> failures;
};

// Failures (status != kOk) of results, in row order. A non-JPEG's file bytes move into its
// failure, so the fallback decodes what the engine read instead of opening the file again.
std::vector<SampleFailure> failures_of(std::vector<SampleResult>& results);

}  // namespace fastdata::bindings
