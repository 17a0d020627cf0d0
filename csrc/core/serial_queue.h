// One thread that runs queued jobs one after another, in the order they were submitted.
//
// The engine's batch runs go through it when the caller wants them asynchronous
// (Engine::submit): the caller (the Loader's producer thread) queues batch n + 1 while the
// native threads still decode batch n, so the next batch starts the moment one ends, and
// the caller's own work per batch (fetching the next records, the upload, Python) no longer
// leaves the native threads idle. The queue's thread is the pool's calling thread for the
// runs it makes, i.e. one of the engine's decode threads.
//
// Fork: as ThreadPool (thread_pool.h), a queue made before a fork has no thread in the
// child; submit refuses there and its owner leaks it rather than destroy it.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace fastdata {

class SerialQueue {
 public:
  // its thread's priority and OS name, as ThreadPool's workers
  SerialQueue(int nice_increment, std::string thread_name);
  ~SerialQueue();  // runs every job still queued, then joins (only where made_here())
  SerialQueue(const SerialQueue&) = delete;
  SerialQueue& operator=(const SerialQueue&) = delete;

  bool made_here() const;
  bool priority_lowered() const { return priority_lowered_.load(); }

  // Queues job; it runs on the queue's thread after every job submitted before it. job must
  // not throw (the caller's job catches and records its own errors). Throws
  // std::runtime_error in a process forked after the queue was made.
  void submit(std::function<void()> job);

 private:
  void thread_main();

  const pid_t owner_pid_;
  const int nice_increment_;
  const std::string thread_name_;
  std::atomic<bool> priority_lowered_{true};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace fastdata
