// pybind11 surface of fastdata._C, joined from one file per topic. Every binding checks and
// converts its arguments with the GIL held and runs the work with the GIL released (through
// ReleasedGil, released_gil.h: a thread still working at interpreter exit must not abort); no
// Python object is touched by a worker thread. fastdata/_C.pyi is the typed stub of what
// is registered here (tests/package/test_c_stub.py keeps the two in step).
#include <pybind11/pybind11.h>

#include "bindings/register.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastdata native core: libjpeg-turbo decode with fused crop/resize/flip on native threads";
  fastdata::bindings::register_types(m);
  fastdata::bindings::register_decode(m);
  fastdata::bindings::register_engine(m);
  fastdata::bindings::register_transcode(m);
  fastdata::bindings::register_filters(m);
  fastdata::bindings::register_nvimgcodec(m);
  fastdata::bindings::register_testing(m);
  fastdata::bindings::register_test_encoder(m);
}
