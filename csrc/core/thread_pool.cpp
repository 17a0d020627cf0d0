#include "core/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <stdexcept>
#include <string>

namespace fastdata {

bool lower_thread_priority(int increment) {
  if (increment <= 0) return true;
#ifdef __linux__
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  if (increment >= kIdlePriority) {
    const sched_param param{};  // SCHED_IDLE takes priority 0; lowering one's own policy needs no privilege
    if (::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) == 0) return true;
    (void)::setpriority(PRIO_PROCESS, tid, 19);  // refused (a seccomp filter, say): the lowest nice instead
    return false;                                // and the failure counted (priority_lowered)
  }
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);  // -1 is a valid nice value: errno tells
  if (now == -1 && errno != 0) return false;
  return ::setpriority(PRIO_PROCESS, tid, std::min(19, now + increment)) == 0;
#else
  return false;
#endif
}

ThreadPool::ThreadPool(int threads, int nice_increment, std::string thread_name)
    : owner_pid_(::getpid()), nice_increment_(nice_increment), thread_name_(std::move(thread_name).substr(0, 15)) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back(&ThreadPool::worker_main, this, i);
}

bool ThreadPool::made_here() const { return ::getpid() == owner_pid_; }

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(const std::function<void(size_t, int)>& fn, size_t n, int worker) {
  for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i, worker);
}

void ThreadPool::worker_main(int worker) {
  // An OS thread name (top -H, /proc/<pid>/task/*/comm, fastdata-bench's per-thread CPU
  // seconds) that says whose threads these are; failure only loses the name.
#ifdef __linux__
  (void)pthread_setname_np(pthread_self(), thread_name_.c_str());
#endif
  if (!lower_thread_priority(nice_increment_)) priority_failures_.fetch_add(1);
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(size_t, int)>* job;
    size_t n;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = job_size_;
    }
    drain(*job, n, worker);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (++finished_ == workers_.size()) done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, int)>& fn) {
  if (!workers_.empty() && !made_here()) {
    throw std::runtime_error("this thread pool was created in process " + std::to_string(owner_pid_) +
                             " before a fork; its threads do not exist in process " +
                             std::to_string(::getpid()) + ": create a new one here");
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    next_.store(0);
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  drain(fn, n, 0);
  // Every worker takes part in every generation, so none can still hold this job later.
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return finished_ == workers_.size(); });
  job_ = nullptr;
}

}  // namespace fastdata
