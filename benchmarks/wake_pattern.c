// K threads at normal priority that wake often and work briefly: the pattern of a GPU decoder's
// host threads (decode lanes, resample, nvImageCodec's pool, the producer) beside native decode.
// Each thread: sleep SLEEP_US, then spin WORK_US, until its parent (the probe) is gone or kills
// it. Timer slack is set to 1 ns so that a sleep lasts about what was asked (the default 50 us
// slack made a 50-us sleep last ~128 us on the 2-core box).
//
//   gcc -O2 -pthread -o /tmp/wake_pattern benchmarks/wake_pattern.c
//   /tmp/wake_pattern K SLEEP_US WORK_US
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static long sleep_us, work_us;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void* wake_and_work(void* unused) {
  (void)unused;
  if (prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) != 0) {  // per thread
    perror("prctl(PR_SET_TIMERSLACK)");
    exit(1);
  }
  const struct timespec nap = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
  volatile unsigned long sink = 1;
  for (;;) {
    nanosleep(&nap, NULL);  // EINTR only ends this sleep early
    const double end = now() + (double)work_us * 1e-6;
    while (now() < end)
      for (int i = 0; i < 256; i++) sink = sink * 2862933555777941757UL + 3037000493UL;
  }
  return NULL;
}

// A whole non-negative number in [0, max], or -1.
static long parse(const char* text, long max) {
  char* end = NULL;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0 || v > max) return -1;
  return v;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s THREADS SLEEP_US WORK_US\n", argv[0]);
    return 2;
  }
  const long threads = parse(argv[1], 256);
  sleep_us = parse(argv[2], 10000000);
  work_us = parse(argv[3], 10000000);
  if (threads < 1 || sleep_us < 0 || work_us < 0) {
    fprintf(stderr, "THREADS must be 1..256, SLEEP_US and WORK_US whole numbers of microseconds up to 10 s\n");
    return 2;
  }
  // Ends with the probe even when the probe is killed (its cleanup then never runs).
  const pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0UL, 0UL, 0UL) != 0) {
    perror("prctl(PR_SET_PDEATHSIG)");
    return 1;
  }
  if (getppid() != parent) return 1;  // the parent ended before the line above took effect
  pthread_t ids[256];
  for (long i = 0; i < threads; i++) {
    const int rc = pthread_create(&ids[i], NULL, wake_and_work, NULL);
    if (rc != 0) {
      fprintf(stderr, "pthread_create failed: %d\n", rc);
      return 1;
    }
  }
  const int rc = pthread_join(ids[0], NULL);  // returns only on an error: the threads loop until killed
  fprintf(stderr, "pthread_join failed: %d\n", rc);
  return 1;
}
