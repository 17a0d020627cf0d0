// A fixed pool of native worker threads running parallel loops: synchronous ones
// (parallel_for: the calling thread works too, one such loop at a time) and asynchronous ones
// (enqueue: returns at once). Loops are claimed row by row in the order they were started,
// and there is no barrier between them: once every row of a loop has been claimed, a free
// thread takes a row of the next one, so the last rows of one batch do not leave the other
// threads idle while the next batch waits (Engine::start_run queues batches this way).
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
#include <deque>
#include <functional>
#include <memory>
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
  // nice_increment > 0: the workers (and the queue thread) run that much below the priority of
  // the thread that created them (lower_thread_priority); the calling thread of parallel_for
  // keeps its own. thread_name: their OS name (at most 15 characters are kept).
  ThreadPool(int threads, int nice_increment, std::string thread_name);
  // Every enqueued loop finishes (its on_done called) first; then the threads are joined. Only
  // in the process that made them (made_here()).
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  bool made_here() const;  // false in a process forked after this pool was made
  // Throws std::runtime_error (its message ends with what) where !made_here().
  void check_process(const char* what) const;
  // False when a worker or the queue thread could not lower its priority as asked (it runs at
  // the normal one).
  bool priority_lowered() const { return priority_failures_.load() == 0; }

  // Calls fn(i, worker) for i in [0, n) across the pool; worker in [0, size()) names the
  // thread, for per-thread scratch (the caller is 0). Returns when every call has returned.
  // fn must not throw. One call at a time; loops enqueued before it keep their place: the
  // workers finish claiming their rows first, the caller works on its own loop at once.
  // Throws std::runtime_error in a process forked after this pool was made (workers > 0).
  void parallel_for(size_t n, const std::function<void(size_t, int)>& fn);

  // Calls fn(i, worker) for i in [0, n) on the workers (1..size()-1) and on the pool's queue
  // thread (worker == size(): per-thread scratch needs size() + 1 slots; it is made at the
  // first call and takes rows of enqueued loops only), then on_done() once every call has
  // returned, on the thread that ran the last row, or for n == 0 on the calling thread when
  // no loop enqueued before is still to be done. Returns at once. on_done calls keep the order
  // the loops were enqueued in (a loop that finishes before an earlier one waits for it). fn
  // must not throw; an exception from on_done is dropped.
  // after_previous: no row is claimed before every loop enqueued before it is done (the old
  // barrier between queued runs, for A/B measurements).
  // Throws std::runtime_error in a process forked after this pool was made.
  void enqueue(size_t n, std::function<void(size_t, int)> fn, std::function<void()> on_done,
               bool after_previous = false);

 private:
  struct Loop {
    const std::function<void(size_t, int)>* fn = nullptr;  // a synchronous loop: the caller's
    std::function<void(size_t, int)> owned;                // an enqueued loop's own (fn points here)
    std::function<void()> on_done;
    size_t n = 0;
    size_t next = 0;      // rows claimed
    size_t finished = 0;  // rows whose call has returned
    bool async = false;
    bool after_previous = false;
  };
  using LoopPtr = std::shared_ptr<Loop>;

  void name_thread(std::thread& t) const;
  void thread_main(int worker, bool queue_thread);
  // Under mutex_: the first loop in active_ this thread may take a row of (nullptr: none).
  Loop* claimable(bool queue_thread) const;
  // Under mutex_: claims loop's next row; the loop leaves active_ with its last row.
  size_t claim(Loop* loop);
  // Runs row i, then counts it finished (lock is held on entry and on return).
  void run_row(Loop* loop, size_t i, int worker, std::unique_lock<std::mutex>& lock);
  // Under mutex_ (lock): calls on_done of the finished loops at the head of pending_, in order,
  // outside the lock; one thread at a time does so (delivering_).
  void deliver(std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  std::thread queue_thread_;  // made at the first enqueue
  const pid_t owner_pid_;     // the process whose threads these are
  const int nice_increment_;
  const std::string thread_name_;
  std::atomic<int> priority_failures_{0};
  std::mutex mutex_;
  std::mutex run_mutex_;  // one parallel_for at a time
  std::condition_variable wake_;  // a loop became claimable, or stopping_
  std::condition_variable done_;  // a synchronous loop finished, or pending_ emptied
  std::deque<LoopPtr> active_;    // loops with rows still unclaimed, in the order started
  std::deque<LoopPtr> pending_;   // enqueued loops whose on_done has not returned, in order
  bool delivering_ = false;       // a thread is calling on_done of pending_'s head
  bool stopping_ = false;
};

}  // namespace fastdata
