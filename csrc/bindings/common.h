// Helpers every binding file shares: buffer views held for one call, the per-thread decode
// scratch of the calling thread, and the conversion of Python batch items to SampleInputs.
// All of them run with the GIL held.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
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

// A str path as the file system spells it, i.e. os.fsencode(path): a file name that is not
// valid UTF-8 comes from os.listdir as a str with lone surrogates (surrogateescape), which a
// plain UTF-8 cast refuses ("Unable to cast Python instance of type str", #16 item 11).
// ValueError for an empty path or one with a NUL byte (`row` names it).
std::string fs_path(const py::handle& path, size_t row);

// Bytes read by the engine, handed to Python without a copy: a uint8 array owning them.
py::array_t<uint8_t> owned_array(std::vector<uint8_t>&& bytes);

// str items are paths the native threads read; anything else must be a byte buffer.
std::vector<SampleInput> inputs_from_items(const py::sequence& items, BufferViews* views);

// The benchmark hooks take encoded buffers only (no file reads in what they time).
std::vector<SampleInput> buffers_only(const py::list& datas, BufferViews* views);

}  // namespace fastdata::bindings
