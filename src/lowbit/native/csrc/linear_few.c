/* Weight-only Linear for one to four input rows (a decoder's token at a time), codes decoded in registers:
 * each group of packed bytes is widened to int32 lanes, turned into float weights and dotted with the input
 * rows at once, so a weight row is read once and never written back as floats (linear.c widens it into a
 * buffer first, which pays off only over many input rows).
 * - int4 (LB_INT4_ZERO, LB_INT4_MIN): on AVX-512 each group's sixteen possible weights computed once, as the
 *   reference computes them, and looked up by code; on AVX2 each code converted and scaled by the reference's
 *   formula: its dequantized values bit for bit either way; inputs split even / odd columns (linear.c).
 * - int8: the codes as floats, the per-channel scale applied to the sum (as linear.c), or per group
 *   code * scale (ggml's Q8_0).
 * The sums run in float32 lanes with fused multiply-adds: another summation order than a float32 matmul of
 * the dequantized weight, within the same rounding bounds. Two weight rows at a time share each input vector;
 * AVX-512 builds take four input rows in one tile, AVX2 builds two (sixteen registers). Builds with neither
 * instruction set decline (lb_linear_few returns 0) and linear.c widens instead. */
#include "linear.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#if defined(__AVX512F__)
#define FEW_LANES 16
#define FEW_TILE_MAX 4
#else
#define FEW_LANES 8
#define FEW_TILE_MAX 2
#endif

#if defined(__clang__)
#define FEW_FUSED
#define FEW_CONTRACT _Pragma("clang fp contract(fast)")
#else
#define FEW_FUSED __attribute__((optimize("fp-contract=fast")))
#define FEW_CONTRACT
#endif
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float few_f __attribute__((vector_size(FEW_LANES * 4)));
typedef int32_t few_i __attribute__((vector_size(FEW_LANES * 4)));

static inline few_i bytes_unsigned(const uint8_t *p) {
#if FEW_LANES == 16
    return (few_i)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    return (few_i)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#endif
}

static inline few_i bytes_signed(const int8_t *p) {
#if FEW_LANES == 16
    return (few_i)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    return (few_i)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
#endif
}

static inline few_f load_f(const float *p) { few_f v; memcpy(&v, p, sizeof v); return v; }
/* Every lane v (GCC lowers a lane-by-lane fill to one masked broadcast per lane). */
#if FEW_LANES == 16
static inline few_f splat_f(float v) { return (few_f)_mm512_set1_ps(v); }
#else
static inline few_f splat_f(float v) { return (few_f)_mm256_set1_ps(v); }
#endif
static inline few_i splat_i(int32_t v) { return (few_i){0} + v; }
static inline float sum_f(few_f v) {
    float total = 0.0f;
    for (int j = 0; j < FEW_LANES; j++) total += v[j];
    return total;
}

/* The product rounded before anything is added to it (the tiles contract a * b + c into one rounding; ggml's
 * Q4_1 weight is a product and a sum, each rounded; with its float16 d the product is exact anyway, but the
 * kernel takes any float32 scale). */
#if FEW_LANES == 16
static inline few_f rounded(few_f v) { __asm__("" : "+v"(v)); return v; }
#else
static inline few_f rounded(few_f v) { __asm__("" : "+x"(v)); return v; }
#endif

/* A group's sixteen weights, one per code j = 0..15: (j - zero) * scale (LB_INT4_ZERO) or j * scale + minimum
 * (LB_INT4_MIN), each the reference's float32 value (j - zero is exact); and the weights of the codes in the
 * low four bits of each int32 lane, looked up: AVX-512 permutes one register by four index bits. */
static inline few_f group_weights(const linear_job *job, int64_t at, few_f codes) {
    const few_f scale = splat_f(job->scale[at]);
    if (job->kind == LB_INT4_MIN) return rounded(codes * scale) + splat_f(job->minimum[at]);
    return (codes - splat_f((float)job->zero_point[at])) * scale;
}
#if FEW_LANES == 16
typedef few_f int4_weights;
static inline int4_weights int4_group(const linear_job *job, int64_t at, int with_minimum) {
    (void)with_minimum; /* the table holds either kind's values */
    return group_weights(job, at, (few_f){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
}
static inline few_f int4_lookup(few_i codes, int4_weights table, int with_minimum) {
    (void)with_minimum;
    return (few_f)_mm512_permutexvar_ps((__m512i)codes, (__m512)table);
}
#else
/* AVX2: each code converted and scaled directly, one formula per kind (a constant in each tile): measured
 * 12-18 % faster on an AVX2 build than two 8-entry permutes and a blend, and than one formula for both kinds. */
typedef struct { few_i zero; few_f scale, minimum; } int4_weights;
static inline int4_weights int4_group(const linear_job *job, int64_t at, int with_minimum) {
    return (int4_weights){splat_i(with_minimum ? 0 : job->zero_point[at]), splat_f(job->scale[at]),
                          splat_f(with_minimum ? job->minimum[at] : 0.0f)};
}
static inline few_f int4_lookup(few_i codes, int4_weights group, int with_minimum) {
    if (with_minimum) return rounded(__builtin_convertvector(codes & 15, few_f) * group.scale) + group.minimum;
    return __builtin_convertvector((codes & 15) - group.zero, few_f) * group.scale;
}
#endif

/* Input rows m .. m + ROWS - 1 against int4 weight rows n and n + 1 (pair = 0: row n alone, read twice);
 * MINIMUM: 1 for LB_INT4_MIN, 0 for LB_INT4_ZERO. */
#define INT4_TILE(ROWS, KIND, MINIMUM) \
    FEW_FUSED static void int4_##KIND##_##ROWS(const linear_job *job, int64_t m, int64_t n, int pair) { \
        FEW_CONTRACT \
        const int64_t K = job->inner, half_k = K / 2, groups = K / job->group, half = job->group / 2; \
        const uint8_t *row0 = (const uint8_t *)job->codes + n * half_k, *row1 = pair ? row0 + half_k : row0; \
        const int64_t at0 = n * groups, at1 = pair ? at0 + groups : at0; \
        const float *x = job->x + m * K; \
        few_f a[ROWS][2]; \
        memset(a, 0, sizeof a); \
        for (int64_t g = 0; g < groups; g++) { \
            const int4_weights t0 = int4_group(job, at0 + g, MINIMUM), t1 = int4_group(job, at1 + g, MINIMUM); \
            for (int64_t j = g * half; j < (g + 1) * half; j += FEW_LANES) { \
                const few_i c0 = bytes_unsigned(row0 + j), c1 = bytes_unsigned(row1 + j); \
                const few_f low0 = int4_lookup(c0, t0, MINIMUM), high0 = int4_lookup(c0 >> 4, t0, MINIMUM); \
                const few_f low1 = int4_lookup(c1, t1, MINIMUM), high1 = int4_lookup(c1 >> 4, t1, MINIMUM); \
                for (int r = 0; r < ROWS; r++) { \
                    const few_f even = load_f(x + r * K + j), odd = load_f(x + r * K + half_k + j); \
                    a[r][0] += even * low0; a[r][0] += odd * high0; \
                    a[r][1] += even * low1; a[r][1] += odd * high1; \
                } \
            } \
        } \
        for (int r = 0; r < ROWS; r++) { \
            lb_linear_store(job, m + r, n, sum_f(a[r][0])); \
            if (pair) lb_linear_store(job, m + r, n + 1, sum_f(a[r][1])); \
        } \
    }

/* The same for int8 weight rows: codes as floats (LB_INT8_CHANNEL: any inner size, a scalar tail; the scale
 * applied to the sum by the store) or codes times their group's scale (LB_INT8_GROUP). */
#define INT8_TILE(ROWS) \
    FEW_FUSED static void int8_tile_##ROWS(const linear_job *job, int64_t m, int64_t n, int pair) { \
        FEW_CONTRACT \
        const int64_t K = job->inner, body = K - K % FEW_LANES; \
        const int8_t *row0 = (const int8_t *)job->codes + n * K, *row1 = pair ? row0 + K : row0; \
        const int grouped = job->kind == LB_INT8_GROUP; \
        const int64_t group = grouped ? job->group : K, groups = K / group; \
        const float *scale0 = job->scale + n * groups, *scale1 = pair ? scale0 + groups : scale0; \
        const float *x = job->x + m * K; \
        few_f a[ROWS][2]; \
        memset(a, 0, sizeof a); \
        for (int64_t k = 0; k < body; k += FEW_LANES) { \
            few_f w0 = __builtin_convertvector(bytes_signed(row0 + k), few_f); \
            few_f w1 = __builtin_convertvector(bytes_signed(row1 + k), few_f); \
            if (grouped) { w0 *= splat_f(scale0[k / group]); w1 *= splat_f(scale1[k / group]); } \
            for (int r = 0; r < ROWS; r++) { \
                const few_f in = load_f(x + r * K + k); \
                a[r][0] += in * w0; a[r][1] += in * w1; \
            } \
        } \
        for (int r = 0; r < ROWS; r++) { \
            float s0 = sum_f(a[r][0]), s1 = sum_f(a[r][1]); \
            for (int64_t k = body; k < K; k++) { s0 += x[r * K + k] * row0[k]; s1 += x[r * K + k] * row1[k]; } \
            lb_linear_store(job, m + r, n, s0); \
            if (pair) lb_linear_store(job, m + r, n + 1, s1); \
        } \
    }

INT4_TILE(1, zero, 0)
INT4_TILE(2, zero, 0)
INT4_TILE(1, min, 1)
INT4_TILE(2, min, 1)
INT8_TILE(1)
INT8_TILE(2)
#if FEW_TILE_MAX == 4
INT4_TILE(4, zero, 0)
INT4_TILE(4, min, 1)
INT8_TILE(4)
#endif

typedef void (*few_tile)(const linear_job *, int64_t, int64_t, int);

int lb_linear_few(const linear_job *job, int64_t first, int64_t last) {
    const int int4 = lb_linear_packed(job);
    if (job->rows > LB_FEW_ROWS || (int4 && (job->group / 2) % FEW_LANES)) return 0;
    if (job->kind == LB_INT8_GROUP && job->group % FEW_LANES) return 0; /* a group's scale per whole vector */
    const int minimum = job->kind == LB_INT4_MIN;
    few_tile one = int4 ? (minimum ? int4_min_1 : int4_zero_1) : int8_tile_1;
    few_tile two = int4 ? (minimum ? int4_min_2 : int4_zero_2) : int8_tile_2;
#if FEW_TILE_MAX == 4
    few_tile four = int4 ? (minimum ? int4_min_4 : int4_zero_4) : int8_tile_4;
#endif
    for (int64_t n = first; n < last; n += 2) {
        const int pair = n + 1 < last;
        int64_t m = 0;
#if FEW_TILE_MAX == 4
        for (; m + 4 <= job->rows; m += 4) four(job, m, n, pair);
#endif
        for (; m + 2 <= job->rows; m += 2) two(job, m, n, pair);
        for (; m < job->rows; m++) one(job, m, n, pair);
    }
    return 1;
}

#else
int lb_linear_few(const linear_job *job, int64_t first, int64_t last) {
    (void)job; (void)first; (void)last;
    return 0;
}
#endif
