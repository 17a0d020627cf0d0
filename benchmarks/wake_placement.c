// Where Linux puts a thread woken by a SCHED_IDLE thread that keeps its core busy: on the waker's
// core (which runs only SCHED_IDLE work, and which the scheduler's idle-core search counts as
// available), behind the waker, while another core idles? Or on an idle core?
//
// Why: hybrid's native threads run under SCHED_IDLE beside the GPU side's threads
// (fastdata/loader/pipeline.py, GPU_NATIVE_IDLE). The forty-second session's proof left 2.7 of
// 16 cores unused while 2.3 native threads on average sat runnable. If woken native threads were
// stacked on busy cores, this probe would show it without a GPU.
//
// Threads of the given policy: A spins and, every 5 ms, posts a semaphore; B waits on it, then
// uses 2 ms of CPU; CROWD more threads only spin. Printed: B's wakes, the share of them on A's
// core, the mean delay from the post to B running, and the wall time B's 2 ms of CPU took (~4 ms
// when B shares a core with a spinning thread).
// With no crowd, B's own core is free while it sleeps, so the kernel puts it back there whatever
// it thinks of cores that run SCHED_IDLE work: 2-core box (kernel 6.18, forty-third session, six
// 2-s runs), 0-1% on the waker's core under every policy, the 2 ms taking 2.02-2.08 ms. The case
// that would cost hybrid cores needs a crowd of cores - 2 (all cores busy but one, which B's
// wake should find): with SCHED_IDLE, B's 2 ms taking ~4 ms there against ~2 ms with the
// other policies would mean B was put beside a spinning thread while a core idled. That needs
// three cores or more, so it has not run on the 2-core box.
//
//   gcc -O2 -pthread -o /tmp/wake_placement benchmarks/wake_placement.c
//   /tmp/wake_placement idle|nice19|normal [SECONDS [CROWD]]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int policy_idle, nice_value;
static sem_t posted_sem;
static atomic_int stop;
static _Atomic double posted_at;
static atomic_int waker_cpu;
static long wakes, on_waker_core;
static double delay_sum, work_wall_sum;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double thread_cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void lower_priority(void) {
  if (policy_idle) {
    const struct sched_param param = {0};
    const int rc = pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
    if (rc != 0) {
      fprintf(stderr, "SCHED_IDLE refused: %s\n", strerror(rc));
      exit(1);
    }
  } else if (nice_value != 0 && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice_value) != 0) {
    perror("setpriority");
    exit(1);
  }
}

static void spin(double seconds) {
  const double end = now() + seconds;
  volatile unsigned long x = 1;
  while (now() < end) x = x * 6364136223846793005UL + 1;
}

static void* waker(void* unused) {
  (void)unused;
  lower_priority();
  double next = now();
  while (!atomic_load(&stop)) {
    spin(0.0001);
    if (now() >= next) {
      atomic_store(&waker_cpu, sched_getcpu());
      atomic_store(&posted_at, now());
      if (sem_post(&posted_sem) != 0) {
        perror("sem_post");
        exit(1);
      }
      next = now() + 0.005;
    }
  }
  return NULL;
}

static void* crowd_member(void* unused) {
  (void)unused;
  lower_priority();
  while (!atomic_load(&stop)) spin(0.001);
  return NULL;
}

static void* woken(void* unused) {
  (void)unused;
  lower_priority();
  for (;;) {
    while (sem_wait(&posted_sem) != 0) {}  // EINTR only
    if (atomic_load(&stop)) return NULL;
    const double t = now();
    delay_sum += t - atomic_load(&posted_at);
    wakes++;
    if (sched_getcpu() == atomic_load(&waker_cpu)) on_waker_core++;
    const double c0 = thread_cpu();
    while (thread_cpu() - c0 < 0.002) {}
    work_wall_sum += now() - t;
  }
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4 || (strcmp(argv[1], "idle") && strcmp(argv[1], "nice19") && strcmp(argv[1], "normal"))) {
    fprintf(stderr, "usage: %s idle|nice19|normal [SECONDS [CROWD]]\n", argv[0]);
    return 2;
  }
  policy_idle = strcmp(argv[1], "idle") == 0;
  nice_value = strcmp(argv[1], "nice19") == 0 ? 19 : 0;
  const double seconds = argc >= 3 ? atof(argv[2]) : 3.0;
  const long crowd = argc == 4 ? strtol(argv[3], NULL, 10) : 0;
  if (!(seconds > 0 && seconds <= 600) || crowd < 0 || crowd > 1024) {
    fprintf(stderr, "SECONDS must be in (0, 600], CROWD in 0..1024\n");
    return 2;
  }
  if (sem_init(&posted_sem, 0, 0) != 0) {
    perror("sem_init");
    return 1;
  }
  pthread_t a, b, crowd_ids[1024];
  int rc = pthread_create(&a, NULL, waker, NULL);
  if (rc == 0) rc = pthread_create(&b, NULL, woken, NULL);
  for (long i = 0; rc == 0 && i < crowd; i++) rc = pthread_create(&crowd_ids[i], NULL, crowd_member, NULL);
  if (rc != 0) {
    fprintf(stderr, "pthread_create failed: %s\n", strerror(rc));
    return 1;
  }
  struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (nanosleep(&pause, &pause) != 0) {}
  atomic_store(&stop, 1);
  sem_post(&posted_sem);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  for (long i = 0; i < crowd; i++) pthread_join(crowd_ids[i], NULL);
  if (wakes == 0) {
    fprintf(stderr, "no wake in %.1f s\n", seconds);
    return 1;
  }
  printf("%-6s crowd %ld: wakes %ld, on the waker's core %.0f%%, post to running %.0f us, 2 ms of CPU took %.2f ms\n",
         argv[1], crowd, wakes, 100.0 * (double)on_waker_core / (double)wakes, 1e6 * delay_sum / (double)wakes,
         1e3 * work_wall_sum / (double)wakes);
  return 0;
}
