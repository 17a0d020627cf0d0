// A fixed pool of native worker threads running one parallel loop at a time.
// The calling thread works too, so a pool of size 1 has no extra thread.
//
// fork() copies only the calling thread: in a child the workers do not exist. A pool made
// before a fork refuses to run there (it would wait for them forever), and it must not be
// destroyed there either: joining would wait for threads that are not there, and destroying
// a condition variable the parent's workers waited on blocks for good. Its owner leaks it in
// a child (see made_here; Engine does).
#pragma once
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fastdata {

// lower_thread_priority's increment that asks for SCHED_IDLE instead of nice steps: a waking
// thread of any other policy takes the thread's core at once, and beside busy threads it gets a
// weight of 3 against nice 0's 1024 (at nice 10 and 19, 110 and 15, and the waker can wait its turn).
constexpr int kIdlePriority = 20;

// Lowers the calling thread's scheduling priority by `increment` nice steps (Linux: nice is
// per thread), capped at 19, or to SCHED_IDLE for kIdlePriority (nice 19 where that is refused,
// and false). True on success or when increment <= 0.
bool lower_thread_priority(int increment);

class ThreadPool {
 public:
  // nice_increment > 0: the workers run that much below the creating thread's priority
  // (lower_thread_priority); the calling thread of a loop keeps its own. thread_name: the
  // workers' OS name (at most 15 characters are kept).
  ThreadPool(int threads, int nice_increment, std::string thread_name);
  ~ThreadPool();  // joins the workers; only in the process that made them (made_here())
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  bool made_here() const;  // false in a process forked after this pool was made
  // False when a worker could not lower its priority as asked (it runs at the normal one).
  bool priority_lowered() const { return priority_failures_.load() == 0; }

  // Calls fn(i, worker) for i in [0, n) across the pool; worker in [0, size()) names the
  // thread, for per-thread scratch. Returns when every call has returned. fn must not throw.
  // Throws std::runtime_error in a process forked after this pool was made (workers > 0).
  void parallel_for(size_t n, const std::function<void(size_t, int)>& fn);

 private:
  void worker_main(int worker);
  void drain(const std::function<void(size_t, int)>& fn, size_t n, int worker);

  std::vector<std::thread> workers_;
  const pid_t owner_pid_;  // the process whose threads workers_ are
  const int nice_increment_;
  const std::string thread_name_;
  std::atomic<int> priority_failures_{0};
  std::mutex mutex_;
  std::mutex run_mutex_;  // one parallel_for at a time
  std::condition_variable wake_, done_;
  const std::function<void(size_t, int)>* job_ = nullptr;
  size_t job_size_ = 0;
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;  // workers done with the current generation
  unsigned long generation_ = 0;
  bool stopping_ = false;
};

}  // namespace fastdata
