// How much one core slows down when N cores work at once, for work that shares nothing.
//
// Why: bench_decode's thread-scaling target (>= 90% of linear) assumes a core does as much
// work with 15 busy neighbours as alone. This probe measures that assumption on the machine
// itself, so a scaling shortfall can be told apart from fastdata's threading:
//   reg  a dependent multiply-add chain in registers: only the core's clock matters
//   l2   a pointer chase around a private 256 KiB ring (fits a core's own L2)
//   l3   a pointer chase around a private 4 MiB ring (spills into the shared L3)
// Each of N threads runs its own copy for --seconds; printed is the mean per-thread speed
// at N relative to N = 1, over interleaved rounds, for N up to the usable CPUs. 100% at
// every N is linear scaling.
//
//   gcc -O2 -pthread -o /tmp/core_contention benchmarks/core_contention.c
//   /tmp/core_contention [seconds per run, default 1.5] [rounds, default 2]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

enum { kKinds = 3, kCounts = 5, kMaxThreads = 16 };
static const char* const kNames[kKinds] = {"reg", "l2", "l3"};
static const size_t kRingBytes[kKinds] = {0, 256 << 10, 4 << 20};
static const int kThreadCounts[kCounts] = {1, 2, 4, 8, 16};

typedef struct {
  int kind;
  double seconds;
  pthread_barrier_t* start;
  double steps_per_s;  // out
  int failed;          // out
} Job;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// A ring visiting every slot once in random order, so the hardware prefetcher cannot help.
// On 2 MiB pages where the kernel allows, so that TLB misses do not depend on where
// malloc put it.
static size_t* make_ring(size_t slots, uint64_t seed) {
  size_t* order = malloc(slots * sizeof(size_t));
  size_t* next = NULL;
  if (posix_memalign((void**)&next, 2u << 20, slots * sizeof(size_t)) != 0) next = NULL;
  if (next != NULL) madvise(next, slots * sizeof(size_t), MADV_HUGEPAGE);  // advice only: may fail
  if (order == NULL || next == NULL) {
    free(order);
    free(next);
    return NULL;
  }
  for (size_t i = 0; i < slots; ++i) order[i] = i;
  for (size_t i = slots - 1; i > 0; --i) {  // Fisher-Yates with xorshift64
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    const size_t j = seed % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (size_t i = 0; i < slots; ++i) next[order[i]] = order[(i + 1) % slots];
  free(order);
  return next;
}

static void* run_job(void* arg) {
  Job* job = arg;
  size_t* ring = NULL;
  if (job->kind > 0) {
    ring = make_ring(kRingBytes[job->kind] / sizeof(size_t), 88172645463325252ull);
    job->failed = ring == NULL;
  }
  pthread_barrier_wait(job->start);
  uint64_t x = 1, batches = 0;
  size_t at = 0;
  const double t0 = now();
  double t = t0;
  do {
    if (job->kind == 0) {
      for (int k = 0; k < 1000000; ++k) x = x * 6364136223846793005ull + 1442695040888963407ull;
    } else if (ring != NULL) {
      for (int k = 0; k < 100000; ++k) at = ring[at];
    }
    ++batches;
    t = now();
  } while (t - t0 < job->seconds);
  job->steps_per_s = batches / (t - t0);
  if (x == 42 && at == 42) puts("");  // keeps both chains live
  free(ring);
  return NULL;
}

// Mean per-thread speed (batches/s) of `threads` threads running `kind` at once; < 0 on failure.
static double measure(int kind, int threads, double seconds) {
  pthread_t ids[kMaxThreads];
  Job jobs[kMaxThreads];
  pthread_barrier_t start;
  if (pthread_barrier_init(&start, NULL, (unsigned)threads) != 0) return -1;
  int started = 0;
  for (; started < threads; ++started) {
    jobs[started] = (Job){kind, seconds, &start, 0, 0};
    if (pthread_create(&ids[started], NULL, run_job, &jobs[started]) != 0) break;
  }
  if (started < threads) {  // the started ones wait at the barrier forever: give up loudly
    fprintf(stderr, "pthread_create failed after %d threads\n", started);
    exit(1);
  }
  double sum = 0;
  int failed = 0;
  for (int i = 0; i < threads; ++i) {
    if (pthread_join(ids[i], NULL) != 0) failed = 1;
    sum += jobs[i].steps_per_s;
    failed |= jobs[i].failed;
  }
  pthread_barrier_destroy(&start);
  return failed ? -1 : sum / threads;
}

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? atof(argv[1]) : 1.5;
  const int rounds = argc > 2 ? atoi(argv[2]) : 2;
  if (seconds <= 0 || rounds < 1) {
    fprintf(stderr, "usage: %s [seconds > 0] [rounds >= 1]\n", argv[0]);
    return 2;
  }
  cpu_set_t usable;
  const int cpus = sched_getaffinity(0, sizeof(usable), &usable) == 0 ? CPU_COUNT(&usable) : 1;
  int counts = 0;  // thread counts with a CPU per thread
  while (counts < kCounts && kThreadCounts[counts] <= cpus) ++counts;
  double speed[kKinds][kCounts] = {{0}};
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < kKinds; ++k) {
      for (int c = 0; c < counts; ++c) {
        const double v = measure(k, kThreadCounts[c], seconds);
        if (v < 0) {
          fprintf(stderr, "%s with %d threads failed (out of memory?)\n", kNames[k], kThreadCounts[c]);
          return 1;
        }
        speed[k][c] += v;
      }
    }
  }
  printf("per-thread speed at N threads vs 1 thread (%d usable CPUs, %d rounds of %.1f s)\n%-5s", cpus, rounds,
         seconds, "N");
  for (int c = 0; c < counts; ++c) printf(" %6d", kThreadCounts[c]);
  printf("\n");
  for (int k = 0; k < kKinds; ++k) {
    printf("%-5s", kNames[k]);
    for (int c = 0; c < counts; ++c) printf(" %5.0f%%", 100 * speed[k][c] / speed[k][0]);
    printf("\n");
  }
  return 0;
}
