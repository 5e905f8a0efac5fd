/* Outputs written past the cache. A float32 result larger than the cache can hold is evicted before anything
 * reads it, so writing it through the cache costs a read of every line first (the store misses and fetches
 * the line it overwrites whole) and a write-back later. Non-temporal stores skip the read: a pass that reads
 * x once and writes out once then moves two tensors' worth of memory instead of three, as x.clone() does.
 *
 * A kernel computes a streamed output a tile at a time into a buffer that stays in the L1 cache
 * (lb_sink_place), then copies the tile out with non-temporal stores (lb_sink_flush); the values are the
 * same floats either way. Whether a call streams is decided once per call from its output's size
 * (lb_streams). */
#ifndef LOWBIT_STREAM_H
#define LOWBIT_STREAM_H

#include <stdint.h>
#include <string.h>
#include "common.h"
#include "half.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__AVX__)
#include <immintrin.h>
#endif

#define LB_TILE 2048 /* floats: 8 KB of L1 */

/* The output size in bytes from which calls stream (stream.c: the last-level cache, at most 32 MiB). */
int64_t lb_stream_from(void);

/* Whether a call of this many output elements on `threads` threads streams. One thread leaves the memory
 * bus idle part of the time, so the reads that streaming saves cost little there: at 4096 x 4096 (Zen 4,
 * benchmarks/streamed.py and paired runs) one thread's streamed pass was 0.79-1.12 times the plain one,
 * varying by format and by run, against 0.72-0.91 on two threads for every format measured. */
int lb_streams(int64_t elements, int threads);

/* out[0, n) = tile[0, n): the whole 64-byte lines with non-temporal stores, the partial lines at either
 * end with plain ones (other threads may write the rest of those lines). */
static inline void lb_stream_copy(float *out, const float *tile, int64_t n) {
#if defined(__SSE2__)
    int64_t head = (int64_t)(((64 - ((uintptr_t)out & 63)) & 63) / 4);
    if (((uintptr_t)out & 3) || head >= n) { memcpy(out, tile, (size_t)n * sizeof(float)); return; }
    memcpy(out, tile, (size_t)head * sizeof(float));
    int64_t k = head;
    for (; k + 16 <= n; k += 16) {
#if defined(__AVX512F__)
        _mm512_stream_ps(out + k, _mm512_loadu_ps(tile + k));
#elif defined(__AVX__)
        _mm256_stream_ps(out + k, _mm256_loadu_ps(tile + k));
        _mm256_stream_ps(out + k + 8, _mm256_loadu_ps(tile + k + 8));
#else
        for (int j = 0; j < 16; j += 4) _mm_stream_ps(out + k + j, _mm_loadu_ps(tile + k + j));
#endif
    }
    memcpy(out + k, tile + k, (size_t)(n - k) * sizeof(float));
#else
    memcpy(out, tile, (size_t)n * sizeof(float)); /* no non-temporal stores in portable C */
#endif
}

/* Non-temporal stores are weakly ordered: a thread fences after its last one, before anyone reads out. */
static inline void lb_stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* Software prefetch for the block kernels past the cache (block_common.h's groups of blocks): before each
 * group, the lines LB_PREFETCH_AHEAD floats (a 4 KiB page) past it are asked into the L2 cache. Those kernels
 * compute enough per line that the hardware's prefetchers fell behind on a Zen 4 guest (4096 x 4096, two
 * threads, x clone: block_minifloat 1.17-1.56 -> 1.03-1.18, block_log 1.06-1.24 -> 0.82-1.02, mxint8 1.09-1.20
 * -> 0.94-0.99; benchmarks/RESULTS.md), while the element-wise and sign passes, whose arithmetic is lighter, ran
 * slower with it (e4m3 0.87-1.09 -> 1.06-1.14, TWN 1.80-1.95 -> 2.01-2.09), and affine's blocks (q4s) gained
 * nothing clear: they do without. */
#define LB_PREFETCH_AHEAD 1024
int64_t lb_prefetch_distance(void); /* floats ahead, 0: none (stream.c; benchmarks set it) */
static inline void lb_prefetch(const float *x, int64_t n, int64_t ahead) {
    for (const char *from = (const char *)(x + ahead), *to = (const char *)(x + ahead + n); from < to; from += 64)
        __builtin_prefetch(from, 0, 2);
}

/* Where a kernel writes its output: straight into out, or (streamed) into a tile that collects consecutive
 * elements and goes out with non-temporal stores when full. A thread writes its range in order, so the tile
 * holds out[start, start + filled); each drain sends the whole 64-byte lines and keeps the few elements of a
 * partial last line for the next, so that only the ends of a thread's range take plain stores. */
typedef struct {
    float *out;
    int64_t start, filled;
    int streamed;
    float tile[LB_TILE + 16] __attribute__((aligned(64)));
} lb_sink;

static inline void lb_sink_open(lb_sink *sink, float *out, int streamed) {
    sink->out = out, sink->start = sink->filled = 0, sink->streamed = streamed;
}

/* How many elements a kernel may place at once: at most a tile when streamed. */
static inline int64_t lb_sink_span(const lb_sink *sink, int64_t wanted) {
    return sink->streamed && wanted > LB_TILE ? LB_TILE : wanted;
}

/* Sends the tile's whole lines out (all of it when `all`), keeping the rest at the tile's front. */
static inline void lb_sink_drain(lb_sink *sink, int all) {
    int64_t send = sink->filled;
    if (!all) {
        uintptr_t end = (uintptr_t)(sink->out + sink->start + sink->filled) & ~(uintptr_t)63;
        uintptr_t begin = (uintptr_t)(sink->out + sink->start);
        send = end > begin ? (int64_t)((end - begin) / sizeof(float)) : 0;
    }
    lb_stream_copy(sink->out + sink->start, sink->tile, send);
    memmove(sink->tile, sink->tile + send, (size_t)(sink->filled - send) * sizeof(float));
    sink->start += send, sink->filled -= send;
}

/* Where to write out[at, at + n) (n <= LB_TILE when streamed): out itself, or the tile. */
static inline float *lb_sink_next(lb_sink *sink, int64_t at, int64_t n) {
    if (!sink->streamed) return sink->out + at;
    if (sink->filled && at != sink->start + sink->filled) lb_sink_drain(sink, 1); /* not consecutive */
    if (sink->filled + n > LB_TILE + 16) lb_sink_drain(sink, 0);
    if (sink->filled + n > LB_TILE + 16) lb_sink_drain(sink, 1); /* less than a line sent: a tiny tail */
    if (!sink->filled) sink->start = at;
    float *place = sink->tile + sink->filled;
    sink->filled += n;
    return place;
}

/* Everything out, then the fence. */
static inline void lb_sink_close(lb_sink *sink) {
    if (!sink->streamed) return;
    lb_sink_drain(sink, 1);
    lb_stream_fence();
}

/* An element-wise kernel's pass over [begin, end) of x into out: fn(job, x + at, where, n) on spans of at
 * most a tile (streamed) or on the whole range at once. With halves (`storage` from lb_storage below 0), x
 * and out hold bfloat16 / float16 values: each tile is widened into float32 in L1, computed, and narrowed
 * into out (half.h), so the pass moves the halves once and no float32 tensor exists. */
typedef void (*lb_span_fn)(const void *job, const float *x, float *out, int64_t n);

/* A pass's storage: LB_HALF_BFLOAT16 / LB_HALF_FLOAT16 for x and out holding halves, else whether its float32
 * output streams (lb_streams). */
enum { LB_HALF_BFLOAT16 = -1, LB_HALF_FLOAT16 = -2 };
static inline int lb_storage(int64_t n, int threads, int half) {
    return half == LB_STORE_BFLOAT16 ? LB_HALF_BFLOAT16 : half == LB_STORE_FLOAT16 ? LB_HALF_FLOAT16
                                                                                  : lb_streams(n, threads);
}

/* GCC cannot see that fn writes every element of `result` it is given (through a function pointer). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
static inline void lb_half_spans(const void *job, const uint16_t *x, uint16_t *out, int kind, int64_t begin,
                                 int64_t end, lb_span_fn fn) {
    float wide[LB_TILE] __attribute__((aligned(64))), result[LB_TILE] __attribute__((aligned(64)));
    for (int64_t at = begin, n; at < end; at += n) {
        n = end - at < LB_TILE ? end - at : LB_TILE;
        lb_widen_halves(x + at, wide, n, kind);
        fn(job, wide, result, n);
        lb_narrow_halves(result, out + at, n, kind);
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* half.h's kind for a storage below 0 */
static inline int lb_half_kind(int storage) { return storage == LB_HALF_BFLOAT16 ? CAST_BFLOAT16 : CAST_FLOAT16; }

static inline void lb_spans(const void *job, const float *x, float *out, int streamed, int64_t begin, int64_t end,
                            lb_span_fn fn) {
    if (streamed < 0) {
        lb_half_spans(job, (const uint16_t *)(const void *)x, (uint16_t *)(void *)out, lb_half_kind(streamed), begin,
                      end, fn);
        return;
    }
    lb_sink sink;
    lb_sink_open(&sink, out, streamed);
    for (int64_t at = begin, n; at < end; at += n) {
        n = lb_sink_span(&sink, end - at);
        fn(job, x + at, lb_sink_next(&sink, at, n), n);
    }
    lb_sink_close(&sink);
}

/* A range function written for float32 tensors, run over halves: [begin, end) counts `unit`-element units
 * (blocks of rows, rows); unit i starts at element i / per_row * row_length + i % per_row * unit (units tile
 * the rows, the last of a row maybe shorter). Runs of whole units of at most a tile are widened into a float32
 * tile, the range function computes them into another on a copy of its job whose x, out and storage say "these
 * tiles, float32", and the result is narrowed into out (half.h). The float32 code runs unchanged (a widening
 * inside a kernel's own loops made its float32 path slower). */
#define LB_JOB_MAX 256 /* bytes: the largest job a range function may have here */

typedef struct {
    lb_range_fn fn;
    const void *job;
    size_t job_size, x_at, out_at, storage_at; /* where the job keeps x, out and its storage (lb_storage) */
    const uint16_t *x;
    uint16_t *out;
    int64_t unit, per_row, row_length;
    int kind;
} lb_half_tiles;

/* The plan for fn over `job` (job_size bytes, holding x, out and storage at those addresses), or 0 in
 * `usable` where a unit is longer than a tile or the job too large. */
static inline lb_half_tiles lb_half_tiles_of(lb_range_fn fn, const void *job, size_t job_size, const float *const *x,
                                             float *const *out, const int *storage, int64_t unit, int64_t per_row,
                                             int64_t row_length, int *usable) {
    const char *base = (const char *)job;
    lb_half_tiles plan = {fn, job, job_size, (size_t)((const char *)x - base), (size_t)((const char *)out - base),
                          (size_t)((const char *)storage - base), (const uint16_t *)(const void *)*x,
                          (uint16_t *)(void *)*out, unit, per_row, row_length, lb_half_kind(*storage)};
    *usable = unit >= 1 && unit <= LB_TILE && job_size <= LB_JOB_MAX;
    return plan;
}

static inline int64_t lb_unit_start(const lb_half_tiles *plan, int64_t index) {
    return index / plan->per_row * plan->row_length + index % plan->per_row * plan->unit;
}

static inline void lb_half_tiles_range(const void *context, int64_t begin, int64_t end) {
    const lb_half_tiles *plan = context;
    int64_t unit = plan->unit, per_tile = LB_TILE / unit;
    _Alignas(64) char job[LB_JOB_MAX];
    float wide[LB_TILE] __attribute__((aligned(64))), result[LB_TILE] __attribute__((aligned(64)));
    memcpy(job, plan->job, plan->job_size);
    *(int *)(void *)(job + plan->storage_at) = 0;
    for (int64_t first = begin / unit, last = end / unit, stop; first < last; first = stop) {
        stop = last - first < per_tile ? last : first + per_tile;
        int64_t from = lb_unit_start(plan, first), to = lb_unit_start(plan, stop);
        lb_widen_halves(plan->x + from, wide, to - from, plan->kind);
        /* x and out as seen from element `from`: the tiles hold x[from, to) and out[from, to) */
        const float *x = (const float *)(uintptr_t)((uintptr_t)wide - (uintptr_t)from * sizeof(float));
        float *out = (float *)(uintptr_t)((uintptr_t)result - (uintptr_t)from * sizeof(float));
        memcpy(job + plan->x_at, &x, sizeof x);
        memcpy(job + plan->out_at, &out, sizeof out);
        plan->fn(job, first * unit, stop * unit);
        lb_narrow_halves(result, plan->out + from, to - from, plan->kind);
    }
}

#endif
