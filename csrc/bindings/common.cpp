#include "bindings/common.h"

#include <string>
#include <utility>

namespace fastdata::bindings {

BufferViews::~BufferViews() {
  for (auto& v : views_) PyBuffer_Release(&v);
}

const Py_buffer& BufferViews::add(const py::handle& obj, bool writable) {
  views_.emplace_back();
  if (PyObject_GetBuffer(obj.ptr(), &views_.back(), writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
    views_.pop_back();
    throw py::error_already_set();
  }
  return views_.back();
}

SampleScratch& thread_scratch() {
  thread_local SampleScratch scratch;
  return scratch;
}

std::string fs_path(const py::handle& path, size_t row) {
  PyObject* encoded = PyUnicode_EncodeFSDefault(path.ptr());
  if (encoded == nullptr) throw py::error_already_set();
  std::string out = py::reinterpret_steal<py::bytes>(encoded);
  if (out.empty()) throw py::value_error("empty file path at row " + std::to_string(row));
  if (out.find('\0') != std::string::npos) throw py::value_error("file path with a NUL byte at row " + std::to_string(row));
  return out;
}

py::array_t<uint8_t> owned_array(std::vector<uint8_t>&& bytes) {
  auto* owned = new std::vector<uint8_t>(std::move(bytes));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
  return py::array_t<uint8_t>({static_cast<py::ssize_t>(owned->size())}, owned->data(), free_when_done);
}

std::vector<SampleInput> inputs_from_items(const py::sequence& items, BufferViews* views) {
  const size_t n = static_cast<size_t>(py::len(items));
  std::vector<SampleInput> inputs(n);
  for (size_t i = 0; i < n; ++i) {
    py::handle item = items[i];
    if (py::isinstance<py::str>(item)) {
      inputs[i].path = fs_path(item, i);
    } else {
      const Py_buffer& v = views->add(item);
      inputs[i].data = static_cast<const uint8_t*>(v.buf);
      inputs[i].size = static_cast<size_t>(v.len);
    }
  }
  return inputs;
}

std::vector<SampleInput> buffers_only(const py::list& datas, BufferViews* views) {
  std::vector<SampleInput> inputs = inputs_from_items(datas, views);
  for (const auto& in : inputs) {
    if (!in.path.empty()) throw py::type_error("benchmark hooks take encoded buffers, not paths");
  }
  return inputs;
}

}  // namespace fastdata::bindings
