#include "core/serial_queue.h"
#include "core/thread_pool.h"

#include <pthread.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace fastdata {

SerialQueue::SerialQueue(int nice_increment, std::string thread_name)
    : owner_pid_(::getpid()),
      nice_increment_(nice_increment),
      thread_name_(std::move(thread_name).substr(0, 15)),
      thread_(&SerialQueue::thread_main, this) {}

bool SerialQueue::made_here() const { return ::getpid() == owner_pid_; }

SerialQueue::~SerialQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void SerialQueue::submit(std::function<void()> job) {
  if (!made_here()) {
    throw std::runtime_error("this engine's run queue was created in process " + std::to_string(owner_pid_) +
                             " before a fork; its thread does not exist in process " + std::to_string(::getpid()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void SerialQueue::thread_main() {
#ifdef __linux__
  // It decodes: the calling thread of the pool's parallel loops (ThreadPool's worker 0).
  (void)pthread_setname_np(pthread_self(), thread_name_.c_str());
#endif
  if (!lower_thread_priority(nice_increment_)) priority_lowered_.store(false);
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every queued job has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace fastdata
