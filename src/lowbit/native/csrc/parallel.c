/* lb_parallel: split a loop over threads created for the call. Worker threads take the caller's floating-
 * point control state (rounding direction, flush-to-zero), so a chunk rounds exactly as the caller would. */
#include <fenv.h>
#include <pthread.h>
#include "common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LB_HAS_MXCSR 1
#endif

#define LB_MAX_THREADS 256
/* Below this many elements a job runs on the caller's thread alone: starting a thread costs tens of
 * microseconds, and a thread of ours competes with torch's OpenMP workers, which keep spinning for a while
 * after each parallel region (a QAT step quantizes between GEMMs: 1.06-1.14x fp32 single-threaded against
 * 1.09-1.16x with threads from 2^20 elements, Zen 5, 2 cores). From 4M elements threads still pay off. */
#define LB_PARALLEL_MIN ((int64_t)1 << 22)

typedef struct {
    lb_range_fn fn;
    const void *context;
    int64_t begin, end;
    fenv_t environment;
#ifdef LB_HAS_MXCSR
    unsigned int mxcsr;
#endif
} lb_chunk;

static void *lb_run_chunk(void *argument) {
    lb_chunk *chunk = argument;
    fesetenv(&chunk->environment);
#ifdef LB_HAS_MXCSR
    _mm_setcsr(chunk->mxcsr);
#endif
    chunk->fn(chunk->context, chunk->begin, chunk->end);
    return NULL;
}

/* Tests lower every threshold to run the threaded code on small tensors (0: each caller's own threshold). */
static volatile int64_t lb_threads_from_override = 0;

void lb_set_threads_from(int64_t minimum) { lb_threads_from_override = minimum > 0 ? minimum : 0; }

void lb_parallel(int64_t n, int64_t grain, int threads, lb_range_fn fn, const void *context) {
    lb_parallel_from(n, grain, threads, LB_PARALLEL_MIN, fn, context);
}

void lb_parallel_from(int64_t n, int64_t grain, int threads, int64_t minimum, lb_range_fn fn, const void *context) {
    if (grain < 1) grain = 1;
    if (threads > LB_MAX_THREADS) threads = LB_MAX_THREADS;
    if (lb_threads_from_override) minimum = lb_threads_from_override;
    if (threads <= 1 || n < minimum) { fn(context, 0, n); return; }
    int64_t units = (n + grain - 1) / grain, per = (units + threads - 1) / threads;
    pthread_t handles[LB_MAX_THREADS];
    lb_chunk chunks[LB_MAX_THREADS];
    int started[LB_MAX_THREADS] = {0}, count = 0;
    for (int64_t begin = 0; begin < n; begin += per * grain, count++) {
        lb_chunk *chunk = &chunks[count];
        chunk->fn = fn; chunk->context = context; chunk->begin = begin;
        chunk->end = begin + per * grain < n ? begin + per * grain : n;
        fegetenv(&chunk->environment);
#ifdef LB_HAS_MXCSR
        chunk->mxcsr = _mm_getcsr();
#endif
        if (count > 0) started[count] = pthread_create(&handles[count], NULL, lb_run_chunk, chunk) == 0;
    }
    fn(context, chunks[0].begin, chunks[0].end);
    for (int index = 1; index < count; index++) {
        if (started[index]) pthread_join(handles[index], NULL);
        else fn(context, chunks[index].begin, chunks[index].end); /* no thread: run it here */
    }
}
