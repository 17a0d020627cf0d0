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
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back(&ThreadPool::thread_main, this, i, false);
    name_thread(workers_.back());
  }
}

void ThreadPool::name_thread(std::thread& t) const {
  // An OS thread name (top -H, /proc/<pid>/task/*/comm, fastdata-bench's per-thread CPU
  // seconds) that says whose threads these are. Set by the creator, so that it is there as
  // soon as the thread exists (glibc writes /proc/self/task/<tid>/comm for that), and by the
  // thread itself (thread_main: prctl, for a sandbox without /proc); failure only loses it.
#ifdef __linux__
  (void)pthread_setname_np(t.native_handle(), thread_name_.c_str());
#else
  (void)t;
#endif
}

bool ThreadPool::made_here() const { return ::getpid() == owner_pid_; }

ThreadPool::~ThreadPool() {
  {
    // The enqueued loops' callers hold buffers those loops write: each one finishes first.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_.empty(); });
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
  if (queue_thread_.joinable()) queue_thread_.join();
}

void ThreadPool::check_process(const char* what) const {
  if (made_here()) return;
  throw std::runtime_error(std::string("this thread pool was created in process ") + std::to_string(owner_pid_) +
                           " before a fork; its threads do not exist in process " + std::to_string(::getpid()) +
                           ": " + what);
}

ThreadPool::Loop* ThreadPool::claimable(bool queue_thread) const {
  for (const LoopPtr& loop : active_) {
    if (queue_thread && !loop->async) continue;  // its scratch slot is not the synchronous caller's
    if (loop->after_previous && pending_.front() != loop) continue;
    return loop.get();
  }
  return nullptr;
}

size_t ThreadPool::claim(Loop* loop) {
  const size_t i = loop->next++;
  if (loop->next == loop->n) {
    for (auto it = active_.begin(); it != active_.end(); ++it) {
      if (it->get() == loop) {
        active_.erase(it);
        break;
      }
    }
  }
  return i;
}

void ThreadPool::run_row(Loop* loop, size_t i, int worker, std::unique_lock<std::mutex>& lock) {
  // loop stays alive until its last row is counted: its caller (parallel_for) or pending_ holds it.
  lock.unlock();
  (*loop->fn)(i, worker);
  lock.lock();
  if (++loop->finished < loop->n) return;
  if (loop->async) {
    deliver(lock);
  } else {
    done_.notify_all();
  }
}

void ThreadPool::deliver(std::unique_lock<std::mutex>& lock) {
  if (delivering_) return;  // that thread reaches this loop after the ones before it
  delivering_ = true;
  while (!pending_.empty() && pending_.front()->finished == pending_.front()->n) {
    const LoopPtr loop = pending_.front();
    lock.unlock();
    try {
      if (loop->on_done) loop->on_done();
    } catch (...) {
    }
    // What the loop's functions hold (a whole batch's state) is released outside the lock.
    loop->on_done = nullptr;
    loop->owned = nullptr;
    lock.lock();
    pending_.pop_front();
    if (!pending_.empty() && pending_.front()->after_previous && pending_.front()->next < pending_.front()->n) {
      wake_.notify_all();  // it may be claimed now
    }
  }
  delivering_ = false;
  if (pending_.empty()) done_.notify_all();  // the destructor waits for this
}

void ThreadPool::thread_main(int worker, bool queue_thread) {
#ifdef __linux__
  (void)pthread_setname_np(pthread_self(), thread_name_.c_str());  // see name_thread
#endif
  if (!lower_thread_priority(nice_increment_)) priority_failures_.fetch_add(1);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    Loop* loop = nullptr;
    wake_.wait(lock, [&] { return (loop = claimable(queue_thread)) != nullptr || stopping_; });
    if (loop == nullptr) return;  // stopping: every enqueued loop is done, no synchronous one runs
    const size_t i = claim(loop);
    run_row(loop, i, worker, lock);
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, int)>& fn) {
  if (!workers_.empty()) check_process("create a new one here");
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  const auto loop = std::make_shared<Loop>();
  loop->fn = &fn;
  loop->n = n;
  std::unique_lock<std::mutex> lock(mutex_);
  active_.push_back(loop);
  wake_.notify_all();
  while (loop->next < loop->n) run_row(loop.get(), claim(loop.get()), 0, lock);
  done_.wait(lock, [&] { return loop->finished == loop->n; });
}

void ThreadPool::enqueue(size_t n, std::function<void(size_t, int)> fn, std::function<void()> on_done,
                         bool after_previous) {
  check_process("create a new one here");
  const auto loop = std::make_shared<Loop>();
  loop->owned = std::move(fn);
  loop->fn = &loop->owned;
  loop->on_done = std::move(on_done);
  loop->n = n;
  loop->async = true;
  loop->after_previous = after_previous;
  std::unique_lock<std::mutex> lock(mutex_);
  // Made here rather than with the workers: a pool only ever used synchronously has no idle
  // thread, and like a worker it takes its creator's priority, lowered by nice_increment.
  if (!queue_thread_.joinable()) {
    queue_thread_ = std::thread(&ThreadPool::thread_main, this, size(), true);
    name_thread(queue_thread_);
  }
  pending_.push_back(loop);
  if (n == 0) {
    deliver(lock);  // at once if nothing enqueued before it is still to be done
    return;
  }
  try {
    active_.push_back(loop);
  } catch (...) {  // out of memory: a loop in pending_ that nobody can claim would block every later on_done
    pending_.pop_back();
    throw;
  }
  wake_.notify_all();
}

}  // namespace fastdata
