// Helpers every binding file shares: buffer views held for one call, the per-thread decode
// scratch of the calling thread, and the conversion of Python batch items to SampleInputs.
// All of them run with the GIL held.
#pragma once
#include <pybind11/pybind11.h>

#include <vector>

#include "core/engine.h"
#include "core/sample.h"

namespace fastdata::bindings {

namespace py = pybind11;

// Holds PyBUF_SIMPLE views (contiguous bytes) of Python objects for the duration of a call.
class BufferViews {
 public:
  BufferViews() = default;
  BufferViews(const BufferViews&) = delete;
  BufferViews& operator=(const BufferViews&) = delete;
  ~BufferViews();
  const Py_buffer& add(const py::handle& obj, bool writable = false);

 private:
  std::vector<Py_buffer> views_;  // Py_buffer is trivially movable before release
};

// Decode state of the calling thread, reused between calls (probe, decode_full, hooks).
SampleScratch& thread_scratch();

// str items are paths the native threads read; anything else must be a byte buffer.
std::vector<SampleInput> inputs_from_items(const py::sequence& items, BufferViews* views);

// The benchmark hooks take encoded buffers only (no file reads in what they time).
std::vector<SampleInput> buffers_only(const py::list& datas, BufferViews* views);

}  // namespace fastdata::bindings
