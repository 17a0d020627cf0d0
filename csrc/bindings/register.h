// One register_*() per binding file; module.cpp calls them in this order (types first, so
// that the signatures of later functions name the bound types).
#pragma once
#include <pybind11/pybind11.h>

namespace fastdata::bindings {

void register_types(pybind11::module_& m);      // types.cpp: TransformSpec, statuses, plan, report, errors
void register_decode(pybind11::module_& m);     // decode.cpp: probe, decode_full, jpeg_info
void register_engine(pybind11::module_& m);     // engine.cpp: Engine, sample_crop_boxes
void register_transcode(pybind11::module_& m);  // transcode.cpp: transcode_to_baseline
void register_filters(pybind11::module_& m);    // filters.cpp: axis_filters (the GPU resampler's tables)
void register_nvimgcodec(pybind11::module_& m); // nvimgcodec.cpp: NvImageCodecBatch (the gpu decoder's batch call)
void register_testing(pybind11::module_& m);    // testing.cpp: benchmark floors and test switches
void register_test_encoder(pybind11::module_& m); // test_encoder.cpp: progressive JPEGs with any scan script

}  // namespace fastdata::bindings
