/* lb_parallel: split a loop over threads. Worker threads take the caller's floating-point control state
 * (rounding direction, flush-to-zero), so a chunk rounds exactly as the caller would.
 *
 * Two ways to get threads, chosen when the library is built (build.py):
 * - OpenMP, when the process's torch runs on GNU OpenMP: the library then links the same libgomp (one
 *   runtime per process, found by its soname), so its parallel regions run on torch's own worker threads,
 *   already started and often still spinning from torch's last op. A region costs a few microseconds, and
 *   nothing competes with torch for the cores.
 * - Threads created for the call (pthreads, the caller among them) otherwise, and in a forked child: GNU
 *   OpenMP's pool does not survive fork (a child that enters a region its parent's pool had served waits
 *   forever; torch's own ops hang there too), while a new thread works. */
#include <fenv.h>
#include <pthread.h>
#include "common.h"
#include "phases.h"
#include "stream.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LB_HAS_MXCSR 1
#endif

#define LB_MAX_THREADS 256
/* Below this many elements a job runs on the caller's thread alone. Threads of our own cost tens of
 * microseconds to start and compete with torch's OpenMP workers, which keep spinning for a while after each
 * parallel region (a QAT step quantizes between GEMMs: 1.06-1.14x fp32 single-threaded against 1.09-1.16x
 * with threads from 2^20 elements, Zen 5, 2 cores). From 4M elements they still pay off. */
#define LB_PTHREADS_FROM ((int64_t)1 << 22)
/* On torch's OpenMP pool a region costs about as much as copying 2^15 floats. */
#define LB_OPENMP_FROM ((int64_t)1 << 16)

typedef struct {
    fenv_t environment;
#ifdef LB_HAS_MXCSR
    unsigned int mxcsr;
#endif
} lb_float_state;

static void lb_save_state(lb_float_state *state) {
    fegetenv(&state->environment);
#ifdef LB_HAS_MXCSR
    state->mxcsr = _mm_getcsr();
#endif
}

static void lb_load_state(const lb_float_state *state) {
    fesetenv(&state->environment);
#ifdef LB_HAS_MXCSR
    _mm_setcsr(state->mxcsr);
#endif
}

/* Tests lower every threshold to run the threaded code on small tensors (0: each caller's own threshold). */
static volatile int64_t lb_threads_from_override = 0;
static volatile int lb_forked = 0;

void lb_set_threads_from(int64_t minimum) { lb_threads_from_override = minimum > 0 ? minimum : 0; }

/* 1: parallel regions run on OpenMP (torch's pool), 0: on threads of our own. */
int lb_uses_openmp(void) {
#ifdef _OPENMP
    return !lb_forked;
#else
    return 0;
#endif
}

/* Called in a forked child: by pthread_atfork when the library was loaded before the fork, and by build.py
 * when a forked child loads it (the parent's pool may have run torch's regions already). */
void lb_note_fork(void) { lb_forked = 1; }

__attribute__((constructor)) static void lb_watch_fork(void) { pthread_atfork(NULL, NULL, lb_note_fork); }

/* Past the cache (where outputs stream: lb_streams, stream.h), a pass is handed out in chunks, each to the
 * first thread free, about LB_CHUNKS a thread (whole grains, none under LB_CHUNK_FROM elements): the caller
 * waits for the last thread, and on a shared machine one thread's static share of a pass from memory ran late
 * often enough to matter (Zen 4 guest, 4096 x 4096: libgomp's waits 8 % of TWN's samples with shares, 1 % with
 * chunks; benchmarks/RESULTS.md). Within the cache each thread keeps its static share, whose data may still be
 * in its own core's cache from the call before (chunks made 2112 x 384 float32 8-44 % slower). Every chunk is
 * a run of whole grains, as a static share is, so no result depends on which thread ran what. */
#define LB_CHUNKS 16
#define LB_CHUNK_FROM ((int64_t)1 << 15)
#define LB_MAX_PHASES 8
static volatile int64_t lb_chunks_override = 0;
static volatile int64_t lb_chunks_run_total = 0;
/* Tests and measurements: chunks a thread (1: one share each, the static split; 0: the library's rule). */
void lb_set_chunks(int64_t chunks) { lb_chunks_override = chunks > 0 ? chunks : 0; }

/* Tests: how many chunks the threads have run (a static share counts as one; a call on one thread none). */
int64_t lb_chunks_run_count(void) { return __atomic_load_n(&lb_chunks_run_total, __ATOMIC_RELAXED); }

/* The chunk size for n elements on `threads` threads, in elements (a multiple of grain). */
static int64_t lb_chunk_size(int64_t n, int64_t grain, int threads, int dynamic) {
    int64_t units = (n + grain - 1) / grain, chunks = dynamic && lb_streams(n, threads) ? LB_CHUNKS : 1;
    if (lb_chunks_override) chunks = lb_chunks_override;
    int64_t per = (units + threads * chunks - 1) / (threads * chunks), least = (LB_CHUNK_FROM + grain - 1) / grain;
    if (!lb_chunks_override && chunks > 1 && per < least) per = least;
    return per * grain;
}

/* Runs fn over [0, n) in chunks of `per` from the shared counter *next, to whichever thread asks first. */
static void lb_take_chunks(int64_t n, int64_t per, int64_t *next, lb_range_fn run, const void *context) {
    for (;;) {
        int64_t begin = __atomic_fetch_add(next, per, __ATOMIC_RELAXED);
        if (begin >= n) return;
        __atomic_fetch_add(&lb_chunks_run_total, 1, __ATOMIC_RELAXED);
        run(context, begin, begin + per < n ? begin + per : n);
    }
}

typedef struct {
    lb_range_fn fn;
    const void *context;
    int64_t n, per, *next;
    lb_float_state state;
} lb_shared_pass;

static void *lb_run_pass(void *argument) {
    const lb_shared_pass *pass = argument;
    lb_load_state(&pass->state);
    lb_take_chunks(pass->n, pass->per, pass->next, pass->fn, pass->context);
    return NULL;
}

/* Threads of our own, the caller among them; chunks a thread could not be started for go to the others. */
static void lb_pthreads(int64_t n, int64_t per, int threads, lb_range_fn fn, const void *context) {
    pthread_t handles[LB_MAX_THREADS];
    int started[LB_MAX_THREADS] = {0};
    int64_t next = 0, chunks = (n + per - 1) / per;
    lb_shared_pass pass = {.fn = fn, .context = context, .n = n, .per = per, .next = &next};
    lb_save_state(&pass.state);
    if (threads > chunks) threads = (int)chunks;
    for (int index = 1; index < threads; index++)
        started[index] = pthread_create(&handles[index], NULL, lb_run_pass, &pass) == 0;
    lb_take_chunks(n, per, &next, fn, context);
    for (int index = 1; index < threads; index++)
        if (started[index]) pthread_join(handles[index], NULL);
}

#ifdef _OPENMP
static void lb_openmp(int64_t n, int64_t per, int threads, lb_range_fn fn, const void *context) {
    lb_float_state caller;
    int64_t next = 0;
    lb_save_state(&caller);
#pragma omp parallel num_threads(threads)
    {
        lb_float_state own;
        lb_save_state(&own);
        lb_load_state(&caller);
        lb_take_chunks(n, per, &next, fn, context);
        lb_load_state(&own); /* torch's worker keeps its own state */
    }
}
#endif

static void lb_split(int64_t n, int64_t grain, int threads, int64_t minimum, int dynamic, lb_range_fn fn,
                     const void *context) {
    int openmp = lb_uses_openmp();
    if (grain < 1) grain = 1;
    if (threads > LB_MAX_THREADS) threads = LB_MAX_THREADS;
    if (openmp && minimum > LB_OPENMP_FROM) minimum = LB_OPENMP_FROM;
    if (lb_threads_from_override) minimum = lb_threads_from_override;
    if (threads <= 1 || n < minimum) { fn(context, 0, n); return; }
    int64_t per = lb_chunk_size(n, grain, threads, dynamic);
#ifdef _OPENMP
    if (openmp) { lb_openmp(n, per, threads, fn, context); return; }
#endif
    lb_pthreads(n, per, threads, fn, context);
}

/* The format kernels: past the cache, chunks to the first thread free; within it, a share a thread. */
void lb_parallel(int64_t n, int64_t grain, int threads, lb_range_fn fn, const void *context) {
    lb_split(n, grain, threads, LB_PTHREADS_FROM, 1, fn, context);
}

/* The int8 linear and token kernels (their own thresholds): a share a thread, each reusing its own rows. */
void lb_parallel_from(int64_t n, int64_t grain, int threads, int64_t minimum, lb_range_fn fn, const void *context) {
    lb_split(n, grain, threads, minimum, 0, fn, context);
}

/* Phases over one split of [0, n) (lb_parallel's): fn(context, begin, end, phase) on every chunk for phase 0,
 * 1, ...; between two phases, when every chunk is done, between(context, phase) on one thread, whose 0 ends
 * the job. On torch's pool one region holds every phase, with barriers between them: a region costs two or
 * three times a barrier and a single section (3.5 against 1.1-1.6 us, 2 threads, Zen 5). Returns 1 when
 * every phase ran. */
typedef struct {
    lb_phase_fn fn;
    void *context;
    int phase;
} lb_phase_call;

static void lb_run_phase(const void *argument, int64_t begin, int64_t end) {
    const lb_phase_call *call = argument;
    call->fn(call->context, begin, end, call->phase);
}

int lb_parallel_phases(int64_t n, int64_t grain, int threads, int phases, lb_phase_fn fn, lb_between_fn between,
                       void *context) {
    if (grain < 1) grain = 1;
    if (threads > LB_MAX_THREADS) threads = LB_MAX_THREADS;
#ifdef _OPENMP
    int64_t minimum = lb_threads_from_override ? lb_threads_from_override : LB_OPENMP_FROM;
    if (lb_uses_openmp() && threads > 1 && n >= minimum && phases <= LB_MAX_PHASES) {
        int64_t per = lb_chunk_size(n, grain, threads, 1), next[LB_MAX_PHASES] = {0};
        int complete = 1;
        lb_float_state caller;
        lb_save_state(&caller);
#pragma omp parallel num_threads(threads)
        {
            lb_float_state own;
            lb_save_state(&own);
            lb_load_state(&caller);
            for (int phase = 0; phase < phases; phase++) {
                lb_phase_call call = {fn, context, phase};
                lb_take_chunks(n, per, &next[phase], lb_run_phase, &call);
                if (phase + 1 == phases) break;
#pragma omp barrier
#pragma omp single
                complete = between(context, phase);
                if (!complete) break; /* every thread reads it after the single's barrier */
            }
            lb_load_state(&own);
        }
        return complete;
    }
#endif
    for (int phase = 0; phase < phases; phase++) {
        lb_phase_call call = {fn, context, phase};
        lb_parallel(n, grain, threads, lb_run_phase, &call);
        if (phase + 1 < phases && !between(context, phase)) return 0;
    }
    return 1;
}

