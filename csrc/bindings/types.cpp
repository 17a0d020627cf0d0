// Bound types: the transform spec (validated here, once, for every entry point that takes
// one), status codes, and the plan and report a batch call returns.
#include "bindings/types.h"

#include "bindings/common.h"

#include <pybind11/stl.h>

#include <string>

#include "bindings/register.h"
#include "core/augment.h"
#include "core/decoder.h"

namespace fastdata::bindings {

namespace {

constexpr int kMaxSide = 16384;  // the same bound as fastdata.transforms

const char* kind_name(TransformKind k) {
  switch (k) {
    case TransformKind::kRandomResizedCrop: return "RANDOM_RESIZED_CROP";
    case TransformKind::kCenterCrop: return "CENTER_CROP";
    case TransformKind::kFull: return "FULL";
  }
  return "?";
}

const char* status_name(SampleStatus s) {
  switch (s) {
    case SampleStatus::kOk: return "OK";
    case SampleStatus::kNotJpeg: return "NOT_JPEG";
    case SampleStatus::kDecodeError: return "DECODE_ERROR";
    case SampleStatus::kReadError: return "READ_ERROR";
    case SampleStatus::kInternal: return "INTERNAL";
  }
  return "?";
}

// Python's repr of a double (shortest round-trip form), for messages and __repr__.
std::string num(double v) { return py::repr(py::float_(v)).cast<std::string>(); }

// Every field is checked whatever the kind (the defaults are valid), so a spec that reaches
// the engine is always one the crop code can run.
TransformSpec make_spec(TransformKind kind, int out_h, int out_w, double scale_lo, double scale_hi, double ratio_lo,
                        double ratio_hi, double hflip, int resize_to, bool roi) {
  if (kind != TransformKind::kRandomResizedCrop && kind != TransformKind::kCenterCrop &&
      kind != TransformKind::kFull) {
    throw py::value_error("TransformSpec: unknown kind " + std::to_string(static_cast<int>(kind)));
  }
  if (out_h < 1 || out_w < 1 || out_h > kMaxSide || out_w > kMaxSide) {
    throw py::value_error("TransformSpec: out_h and out_w must be within 1..16384, got (" + std::to_string(out_h) +
                          ", " + std::to_string(out_w) + ")");
  }
  // Written so that NaN fails every check.
  if (!(0 < scale_lo && scale_lo <= scale_hi)) {
    throw py::value_error("TransformSpec: scale must satisfy 0 < scale_lo <= scale_hi, got (" +
                          num(scale_lo) + ", " + num(scale_hi) + ")");
  }
  if (!(0 < ratio_lo && ratio_lo <= ratio_hi)) {
    throw py::value_error("TransformSpec: ratio must satisfy 0 < ratio_lo <= ratio_hi, got (" +
                          num(ratio_lo) + ", " + num(ratio_hi) + ")");
  }
  if (!(0.0 <= hflip && hflip <= 1.0)) {
    throw py::value_error("TransformSpec: hflip is a probability in [0, 1], got " + num(hflip));
  }
  if (resize_to < 1) throw py::value_error("TransformSpec: resize_to must be positive, got " + std::to_string(resize_to));
  TransformSpec s;
  s.kind = kind;
  s.out_h = out_h, s.out_w = out_w;
  s.scale_lo = scale_lo, s.scale_hi = scale_hi;
  s.ratio_lo = ratio_lo, s.ratio_hi = ratio_hi;
  s.hflip = hflip;
  s.resize_to = resize_to;
  s.roi = roi;
  return s;
}

std::string spec_repr(const TransformSpec& s) {
  return std::string("TransformSpec(kind=TransformKind.") + kind_name(s.kind) + ", out_h=" + std::to_string(s.out_h) +
         ", out_w=" + std::to_string(s.out_w) + ", scale_lo=" + num(s.scale_lo) + ", scale_hi=" + num(s.scale_hi) +
         ", ratio_lo=" + num(s.ratio_lo) + ", ratio_hi=" + num(s.ratio_hi) + ", hflip=" + num(s.hflip) +
         ", resize_to=" + std::to_string(s.resize_to) + ", roi=" + (s.roi ? "True" : "False") + ")";
}

}  // namespace

std::vector<SampleFailure> failures_of(std::vector<SampleResult>& results) {
  std::vector<SampleFailure> failures;
  for (size_t i = 0; i < results.size(); ++i) {
    SampleResult& r = results[i];
    if (r.status == SampleStatus::kOk) continue;
    SampleFailure f{i, r.status, r.message};
    if (r.status == SampleStatus::kNotJpeg && !r.file_bytes.empty()) f.file_bytes = owned_array(std::move(r.file_bytes));
    failures.push_back(std::move(f));
  }
  return failures;
}

void register_types(py::module_& m) {
  // Every libjpeg failure arrives as fastdata.DecodeError (set from Python at import).
  py::register_exception<DecodeError>(m, "NativeDecodeError", PyExc_ValueError);

  py::enum_<TransformKind>(m, "TransformKind", "Which crop a TransformSpec describes.")
      .value("RANDOM_RESIZED_CROP", TransformKind::kRandomResizedCrop)
      .value("CENTER_CROP", TransformKind::kCenterCrop)
      .value("FULL", TransformKind::kFull);

  py::enum_<SampleStatus>(m, "SampleStatus", "Outcome of one sample of a batch (csrc/core/engine.h).")
      .value("OK", SampleStatus::kOk)
      .value("NOT_JPEG", SampleStatus::kNotJpeg, "left untouched for the caller's fallback decoder")
      .value("DECODE_ERROR", SampleStatus::kDecodeError, "corrupt or unsupported data; the row is zero-filled")
      .value("READ_ERROR", SampleStatus::kReadError, "the file could not be read; the row is zero-filled")
      .value("INTERNAL", SampleStatus::kInternal, "a bug or out of memory; the row is zero-filled");

  py::class_<TransformSpec>(m, "TransformSpec",
                            "What the engine does to each sample: the crop (kind), the output size, the "
                            "RandomResizedCrop ranges and flip probability, CenterCrop's shorter side, and "
                            "whether to decode only the crop's region (roi). Immutable; validated on construction "
                            "(ValueError).")
      .def(py::init(&make_spec), py::kw_only(), py::arg("kind"), py::arg("out_h"), py::arg("out_w"),
           py::arg("scale_lo") = 0.08, py::arg("scale_hi") = 1.0, py::arg("ratio_lo") = 3.0 / 4.0,
           py::arg("ratio_hi") = 4.0 / 3.0, py::arg("hflip") = 0.5, py::arg("resize_to") = 256,
           py::arg("roi") = true)
      .def_readonly("kind", &TransformSpec::kind)
      .def_readonly("out_h", &TransformSpec::out_h)
      .def_readonly("out_w", &TransformSpec::out_w)
      .def_readonly("scale_lo", &TransformSpec::scale_lo)
      .def_readonly("scale_hi", &TransformSpec::scale_hi)
      .def_readonly("ratio_lo", &TransformSpec::ratio_lo)
      .def_readonly("ratio_hi", &TransformSpec::ratio_hi)
      .def_readonly("hflip", &TransformSpec::hflip)
      .def_readonly("resize_to", &TransformSpec::resize_to)
      .def_readonly("roi", &TransformSpec::roi)
      .def("__repr__", &spec_repr);

  py::class_<SampleFailure>(m, "SampleFailure", "A sample the native pass did not write: its row, status and message.")
      .def_readonly("row", &SampleFailure::row)
      .def_readonly("status", &SampleFailure::status)
      .def_readonly("message", &SampleFailure::message)
      .def_readonly("file_bytes", &SampleFailure::file_bytes,
                    "NOT_JPEG from a path: the bytes the engine read (uint8), else None")
      .def("__repr__", [](const SampleFailure& f) {
        return "SampleFailure(row=" + std::to_string(f.row) + ", status=SampleStatus." + status_name(f.status) +
               ", message=" + py::repr(py::str(f.message)).cast<std::string>() + ")";
      });

  py::class_<BatchReport>(m, "BatchReport",
                          "What Engine.run did: failed samples in row order (NOT_JPEG rows untouched, others "
                          "zero-filled), libjpeg warnings, read/decode seconds summed over native threads, and the run's wall "
                          "seconds.")
      .def_readonly("failures", &BatchReport::failures)
      .def_readonly("warnings", &BatchReport::warnings)
      .def_readonly("read_seconds", &BatchReport::read_seconds)
      .def_readonly("decode_seconds", &BatchReport::decode_seconds)
      .def_readonly("wall_seconds", &BatchReport::wall_seconds);

  py::tuple subsampling_names(std::size(kSubsamplingNames));
  for (size_t k = 0; k < std::size(kSubsamplingNames); ++k) subsampling_names[k] = kSubsamplingNames[k];
  m.attr("SUBSAMPLING_NAMES") = subsampling_names;
  py::class_<CropPlan>(m, "CropPlan",
                       "Where each sample's output comes from (Engine.plan): boxes float64 [N, 4] (x0, y0, x1, y1 "
                       "in EXIF-oriented pixels), flips bool [N], sizes int32 [N, 2] (oriented height, width), "
                       "orientations int32 [N], from each header components int32 [N], precisions (bits per "
                       "sample) int32 [N] and arithmetic (coding) bool [N], progressive (multi-scan) bool [N], subsamplings int32 [N] (an index into "
                       "SUBSAMPLING_NAMES), rgb_coded bool [N] (three components libjpeg reads as RGB, not YCbCr), "
                       "and the samples whose header could not be read.")
      .def_readonly("boxes", &CropPlan::boxes)
      .def_readonly("flips", &CropPlan::flips)
      .def_readonly("sizes", &CropPlan::sizes)
      .def_readonly("orientations", &CropPlan::orientations)
      .def_readonly("components", &CropPlan::components)
      .def_readonly("precisions", &CropPlan::precisions)
      .def_readonly("arithmetic", &CropPlan::arithmetic)
      .def_readonly("progressive", &CropPlan::progressive)
      .def_readonly("subsamplings", &CropPlan::subsamplings)
      .def_readonly("rgb_coded", &CropPlan::rgb_coded)
      .def_readonly("failures", &CropPlan::failures);
}

}  // namespace fastdata::bindings
