// Releasing the GIL around native work in a way that survives interpreter exit.
//
// CPython up to 3.13 ends a thread that takes the GIL back after the interpreter began
// finalizing with pthread_exit(), which unwinds the C++ stack with a "forced unwind". When
// that unwind reaches a noexcept frame (any destructor, such as pybind11's
// gil_scoped_release), the C++ runtime calls std::terminate: "terminate called without an
// active exception" and SIGABRT instead of the exit status the program chose. A Loader's
// daemon producer thread still inside Engine::run when Ctrl-C ended the program died that
// way (#16 item 3). Here the GIL is taken back in one function that catches the forced
// unwind and parks the thread for good instead, as CPython 3.14 itself does: the process is
// exiting, and the thread holds nothing anyone waits for (its native work has finished).
#pragma once
#include <Python.h>

#include <chrono>
#include <cxxabi.h>
#include <thread>

namespace fastdata {

// Takes the GIL back with `state`; never returns when the interpreter is finalizing.
inline void take_gil_back(PyThreadState* state) {
  try {
    PyEval_RestoreThread(state);
  } catch (abi::__forced_unwind&) {
    // Leaving this handler would have to rethrow; a thread parked here never leaves it.
    for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
  }
}

// RAII: the GIL is released for this object's lifetime (use instead of gil_scoped_release).
class ReleasedGil {
 public:
  ReleasedGil() : state_(PyEval_SaveThread()) {}
  ~ReleasedGil() { take_gil_back(state_); }
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

  // RAII inside a ReleasedGil region: the GIL is held again for this object's lifetime
  // (e.g. to allocate a numpy array from a callback of the native code).
  class Held {
   public:
    explicit Held(ReleasedGil& region) : region_(region) { take_gil_back(region_.state_); }
    ~Held() { region_.state_ = PyEval_SaveThread(); }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;

   private:
    ReleasedGil& region_;
  };

 private:
  PyThreadState* state_;
};

}  // namespace fastdata
