// K threads at normal priority that wake often and work briefly: the pattern of a GPU decoder's
// host threads (decode lanes, resample, nvImageCodec's pool, the producer) beside native decode.
// Each thread: sleep SLEEP_US, then spin WORK_US, forever (the caller kills the process).
//
//   gcc -O2 -pthread -o /tmp/wake_pattern benchmarks/wake_pattern.c
//   /tmp/wake_pattern K SLEEP_US WORK_US
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long sleep_us, work_us;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void* wake_and_work(void* unused) {
  (void)unused;
  const struct timespec nap = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
  volatile unsigned long sink = 1;
  for (;;) {
    nanosleep(&nap, NULL);
    const double end = now() + (double)work_us * 1e-6;
    while (now() < end)
      for (int i = 0; i < 256; i++) sink = sink * 2862933555777941757UL + 3037000493UL;
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s THREADS SLEEP_US WORK_US\n", argv[0]);
    return 2;
  }
  const int threads = atoi(argv[1]);
  sleep_us = atol(argv[2]);
  work_us = atol(argv[3]);
  if (threads < 1 || threads > 256 || sleep_us < 0 || work_us < 0) {
    fprintf(stderr, "THREADS must be 1..256, SLEEP_US and WORK_US >= 0\n");
    return 2;
  }
  pthread_t ids[256];
  for (int i = 0; i < threads; i++) {
    const int rc = pthread_create(&ids[i], NULL, wake_and_work, NULL);
    if (rc != 0) {
      fprintf(stderr, "pthread_create failed: %d\n", rc);
      return 1;
    }
  }
  pthread_join(ids[0], NULL);  // never returns: the threads loop until the process is killed
  return 0;
}
