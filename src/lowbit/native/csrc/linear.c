/* Weight-only Linear layers in float32, without rebuilding the float weight: each weight row is widened once
 * into a float buffer and dotted with every input row (float32 partial sums in vector lanes). Not bit-identical to a
 * float32 matmul of the dequantized weight (another summation order, like any two float32 GEMMs; tests
 * compare within float32 rounding bounds).
 * - int8: out = (x . codes[n]) * scale[n] + bias[n] (per-channel scale applied to the sum);
 * - int4: two codes per byte (low nibble first), per group g: weight = (code - zero_point[n, g]) * scale[n, g],
 *   the reference's dequantized value exactly; out = x . weight[n] + bias[n]. The even and the odd columns are
 *   summed as two halves (inputs split once per call), so the nibbles widen into contiguous runs.
 * - ggml's Q4_1 (code * d + m per block of 32, two roundings) and Q8_0 (code * d) the same way: the kinds of
 *   linear.h's enum lb_weight_kind, through lb_weight_linear_f32.
 * Input rows are taken four at a time against two weight rows (a 4 x 2 tile of sums in registers), with fused
 * multiply-adds. */
#include <stdlib.h>
#include "linear.h"

/* Sixteen lanes (one register) where the compiler targets AVX-512, eight elsewhere: GCC splits a 64-byte
 * vector through the stack without AVX-512 (lanes.h), which made this file 3-6x slower on AVX2 builds. */
#if defined(__AVX512F__)
#define LINEAR_LANES 16
#else
#define LINEAR_LANES 8
#endif
typedef float lb_vec __attribute__((vector_size(LINEAR_LANES * 4)));

/* The dot products may fuse a * b + c (this file only: the quantizers keep -ffp-contract=off). Clang ignores
 * GCC's optimize attribute and takes its own pragma inside the function. */
#if defined(__clang__)
#define LB_FUSED_MULTIPLY_ADD
#define LB_CONTRACT _Pragma("clang fp contract(fast)")
#else
#define LB_FUSED_MULTIPLY_ADD __attribute__((optimize("fp-contract=fast")))
#define LB_CONTRACT
#endif

static inline lb_vec load_lanes(const float *p) { lb_vec v; memcpy(&v, p, sizeof v); return v; }
static inline float sum_lanes(lb_vec v) {
    float total = 0.0f;
    for (int j = 0; j < LINEAR_LANES; j++) total += v[j];
    return total;
}

#define store lb_linear_store

/* Input rows m .. m + ROWS - 1 against weight rows n and n + 1 (widened: w0, w1): a ROWS x 2 tile of vector
 * sums held in registers, each loaded vector used twice or ROWS times. */
#define LB_TILE(ROWS) \
    LB_FUSED_MULTIPLY_ADD static void tile_##ROWS(const linear_job *job, const float *w0, const float *w1, \
                                                  int64_t m, int64_t n, int pair) { \
        LB_CONTRACT \
        const int64_t K = job->inner, body = K - K % LINEAR_LANES; \
        const float *x = job->x + m * K; \
        lb_vec a[ROWS][2]; \
        memset(a, 0, sizeof a); \
        for (int64_t k = 0; k < body; k += LINEAR_LANES) { \
            lb_vec v0 = load_lanes(w0 + k), v1 = load_lanes(w1 + k); \
            for (int r = 0; r < ROWS; r++) { \
                lb_vec in = load_lanes(x + r * K + k); \
                a[r][0] += in * v0; a[r][1] += in * v1; \
            } \
        } \
        for (int r = 0; r < ROWS; r++) { \
            float s0 = sum_lanes(a[r][0]), s1 = sum_lanes(a[r][1]); \
            for (int64_t k = body; k < K; k++) { s0 += x[r * K + k] * w0[k]; s1 += x[r * K + k] * w1[k]; } \
            store(job, m + r, n, s0); \
            if (pair) store(job, m + r, n + 1, s1); \
        } \
    }
LB_TILE(4)
LB_TILE(1)

/* Every input row against weight rows n and n + 1 (pair = 0: an odd last column n alone, w1 = w0). */
static void dot_rows(const linear_job *job, const float *w0, const float *w1, int64_t n, int pair) {
    int64_t m = 0;
    for (; m + 4 <= job->rows; m += 4) tile_4(job, w0, w1, m, n, pair);
    for (; m < job->rows; m++) tile_1(job, w0, w1, m, n, pair);
}

/* A fixed trip count: straight vector code (a conversion of a byte vector with __builtin_convertvector is
 * done lane by lane by GCC). Products and sums round separately here (no contraction outside the dots). */
static inline void widen16(const uint8_t *restrict bytes, float *restrict low, float *restrict high, float zero,
                           float scale, float minimum, int with_minimum) {
    for (int j = 0; j < 16; j++) {
        if (with_minimum) {
            low[j] = (float)(bytes[j] & 15) * scale + minimum;
            high[j] = (float)(bytes[j] >> 4) * scale + minimum;
        } else {
            low[j] = ((float)(bytes[j] & 15) - zero) * scale;
            high[j] = ((float)(bytes[j] >> 4) - zero) * scale;
        }
    }
}

static void widen_int8(const linear_job *job, float *restrict weight, int64_t n) {
    const int8_t *codes = (const int8_t *)job->codes + n * job->inner;
    if (job->kind == LB_INT8_CHANNEL) {
        for (int64_t k = 0; k < job->inner; k++) weight[k] = (float)codes[k];
        return;
    }
    const int64_t groups = job->inner / job->group;
    for (int64_t g = 0; g < groups; g++) {
        const float scale = job->scale[n * groups + g];
        for (int64_t k = g * job->group; k < (g + 1) * job->group; k++) weight[k] = (float)codes[k] * scale;
    }
}

static void widen(const linear_job *job, float *restrict weight, int64_t n) {
    if (!lb_linear_packed(job)) {
        widen_int8(job, weight, n);
        return;
    }
    /* int4: the low nibbles' weights first, then the high ones' (the input rows were split the same way:
     * even columns first), so both halves are written contiguously */
    const uint8_t *packed = (const uint8_t *)job->codes + n * (job->inner / 2);
    const int64_t groups = job->inner / job->group, half = job->group / 2;
    const int with_minimum = job->kind == LB_INT4_MIN;
    float *restrict low = weight, *restrict high = weight + job->inner / 2;
    for (int64_t g = 0; g < groups; g++) {
        const float scale = job->scale[n * groups + g];
        const float zero = with_minimum ? 0.0f : (float)job->zero_point[n * groups + g];
        const float minimum = with_minimum ? job->minimum[n * groups + g] : 0.0f;
        const uint8_t *restrict bytes = packed + g * half;
        int64_t j = 0;
        for (; half % 16 == 0 && j < half; j += 16) /* groups of 32, 64, ...: sixteen bytes at a time */
            widen16(bytes + j, low + g * half + j, high + g * half + j, zero, scale, minimum, with_minimum);
        for (; j < half; j++) {
            low[g * half + j] = with_minimum ? (float)(bytes[j] & 15) * scale + minimum
                                             : ((float)(bytes[j] & 15) - zero) * scale;
            high[g * half + j] = with_minimum ? (float)(bytes[j] >> 4) * scale + minimum
                                              : ((float)(bytes[j] >> 4) - zero) * scale;
        }
    }
}

static void linear_range(const void *context, int64_t begin, int64_t end) {
    linear_job *job = (linear_job *)context;
    const int64_t unit = job->rows * job->inner, last = end / unit;
    if (job->rows <= LB_FEW_ROWS && lb_linear_few(job, begin / unit, last)) return;
    float *weight = malloc(2 * sizeof(float) * (size_t)job->inner);
    if (!weight) { job->failed = 1; return; }
    for (int64_t n = begin / unit; n < last; n += 2) {
        int pair = n + 1 < last;
        widen(job, weight, n);
        if (pair) widen(job, weight + job->inner, n + 1);
        dot_rows(job, weight, pair ? weight + job->inner : weight, n, pair);
    }
    free(weight);
}

/* Threads of our own pay off from about 4M multiply-adds (starting one costs tens of microseconds); on torch's
 * OpenMP pool from far fewer (parallel.c). Work is counted in multiply-adds, split by whole columns. */
#define LB_LINEAR_THREADS_FROM ((int64_t)1 << 22)

/* x [rows, inner] f32, codes (see enum lb_weight_kind), scale [columns] (LB_INT8_CHANNEL) or [columns, inner /
 * group], zero_point (LB_INT4_ZERO) / minimum (LB_INT4_MIN) [columns, inner / group] or NULL, bias [columns] or
 * NULL -> out [rows, columns]. Returns 0, or -1 for sizes it does not take or a work buffer it could not
 * allocate (out is then incomplete). */
int lb_weight_linear_f32(const float *x, const void *codes, const uint8_t *zero_point, const float *scale,
                         const float *minimum, const float *bias, float *out, int64_t rows, int64_t inner,
                         int64_t columns, int64_t group, int kind, int threads) {
    if (rows <= 0 || inner <= 0 || columns <= 0 || kind < LB_INT8_CHANNEL || kind > LB_INT8_GROUP) return -1;
    if (kind != LB_INT8_CHANNEL && (group <= 0 || inner % group)) return -1;
    if ((kind == LB_INT4_ZERO && !zero_point) || (kind == LB_INT4_MIN && !minimum)) return -1;
    linear_job job = {x, codes, scale, bias, out, rows, inner, columns, zero_point, minimum, group, kind, 0};
    float *split = NULL; /* packed int4: each input row as its even columns, then its odd ones */
    if (kind == LB_INT4_ZERO || kind == LB_INT4_MIN) {
        if (group % 2 || !(split = malloc(sizeof(float) * (size_t)(rows * inner)))) return -1;
        for (int64_t m = 0; m < rows; m++)
            for (int64_t k = 0; k < inner; k += 2) {
                split[m * inner + k / 2] = x[m * inner + k];
                split[m * inner + inner / 2 + k / 2] = x[m * inner + k + 1];
            }
        job.x = split;
    }
    lb_parallel_from(columns * rows * inner, rows * inner, threads, LB_LINEAR_THREADS_FROM, linear_range, &job);
    free(split);
    return job.failed ? -1 : 0;
}

/* The int8 per-channel and int4 zero-point forms of lb_weight_linear_f32 (their original entry points). */
int lb_int8_linear_f32(const float *x, const int8_t *codes, const float *scale, const float *bias, float *out,
                       int64_t rows, int64_t inner, int64_t columns, int threads) {
    if (rows <= 0 || inner <= 0 || columns <= 0) return 0;
    return lb_weight_linear_f32(x, codes, NULL, scale, NULL, bias, out, rows, inner, columns, 0, LB_INT8_CHANNEL,
                                threads);
}

int lb_int4_linear_f32(const float *x, const uint8_t *packed, const uint8_t *zero_point, const float *scale,
                       const float *bias, float *out, int64_t rows, int64_t inner, int64_t columns, int64_t group,
                       int threads) {
    return lb_weight_linear_f32(x, packed, zero_point, scale, NULL, bias, out, rows, inner, columns, group,
                                LB_INT4_ZERO, threads);
}
