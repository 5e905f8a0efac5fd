/* The float64 sums and counts of a sign statistic over one run of lanes (sign_stats.c, sign_window.c): which
 * lanes a selection keeps, and the accumulators, as mask registers with AVX-512 and as vector compares
 * elsewhere. */
#ifndef LOWBIT_SIGN_SUMS_H
#define LOWBIT_SIGN_SUMS_H

#include <string.h>
#include "lanes.h"
#include "sign.h"

/* ---------------------------------------------------------------- the sums of one run ---------------- */

/* A run's selection constants: delta (the threshold's bits, SELECT_ABOVE) and, for the generic code, the
 * one-compare form of "d < value < +inf" (value: the magnitude, or the raw bits for SELECT_POSITIVE, which is
 * d = 0): value - d - 1 below 0x7f800000 - d - 1 unsigned, as a signed compare after adding INT32_MIN to both
 * sides. d is clamped to [-1, FLT_MAX's bits] first, which keeps every answer (values are >= 0 and below
 * +inf in every kept lane) and keeps 0x7f800000 - d - 1 within [0, 2^31). */
typedef struct {
    lanes_i delta, offset, limit;
} selection;

static inline selection selection_of(int select, float delta) {
    int32_t d = select == SELECT_ABOVE ? (int32_t)lb_bits(delta) : 0;
    int32_t clamped = d < -1 ? -1 : (d > 0x7f7fffff ? 0x7f7fffff : d);
    uint32_t offset = 0x80000000u - (uint32_t)clamped - 1u, limit = 0x80000000u + (0x7f800000u - (uint32_t)clamped - 1u);
    return (selection){lanes_of(d), lanes_of((int32_t)offset), lanes_of((int32_t)limit)};
}

/* The bits of the magnitude a selection keeps, 0 for an element it leaves out (masked_mean's `kept`), and
 * the lanes it counts: the selected ones, or for SELECT_FINITE the non-finite lanes (the run's lanes less
 * these are its count; the bits of a float >= +0 order as the float does). */
ALWAYS_INLINE lanes_i lanes_kept(const lanes_i *bits, int select, const selection *chosen, lanes_i *counted) {
    lanes_i raw = *bits, magnitude = raw & 0x7fffffff;
    if (select == SELECT_FINITE) {
        *counted = magnitude > 0x7f7fffff;
        return magnitude & ~*counted;
    }
    lanes_i value = select == SELECT_POSITIVE ? raw : magnitude;
    *counted = chosen->limit > (lanes_i)((lanes_u)value + (lanes_u)chosen->offset);
    return value & *counted;
}

#if defined(__AVX512F__)
/* AVX-512: the selections as mask registers, counted by popcount, the kept lanes widened by zero-masking
 * converts (half the vector instructions of the generic code). */
typedef struct {
    __m512d sum[4];
    int64_t count;
} run_sums;

ALWAYS_INLINE void sums_vector(run_sums *a, const lanes_i *bits, int select, const selection *chosen, int second) {
    const lanes_i *delta = &chosen->delta;
    const __m512i infinity = _mm512_set1_epi32(0x7f800000);
    __m512i raw = (__m512i)*bits, magnitude = _mm512_and_si512(raw, _mm512_set1_epi32(0x7fffffff)), value = magnitude;
    __mmask16 selected, keep;
    if (select == SELECT_FINITE) {
        keep = selected = _mm512_cmplt_epi32_mask(magnitude, infinity);
    } else if (select == SELECT_POSITIVE) {
        value = raw;
        keep = selected = _mm512_mask_cmplt_epi32_mask(_mm512_cmpgt_epi32_mask(raw, _mm512_setzero_si512()), raw, infinity);
    } else {
        keep = selected = _mm512_mask_cmplt_epi32_mask(_mm512_cmpgt_epi32_mask(magnitude, (__m512i)*delta), magnitude,
                                                       infinity);
    }
    __m512 v = _mm512_castsi512_ps(value);
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    a->sum[2 * second] = _mm512_add_pd(a->sum[2 * second], _mm512_maskz_cvtps_pd((__mmask8)keep, _mm512_castps512_ps256(v)));
    a->sum[2 * second + 1] = _mm512_add_pd(a->sum[2 * second + 1], _mm512_maskz_cvtps_pd((__mmask8)(keep >> 8), high));
    a->count += __builtin_popcount(selected);
}

static inline double sums_total(const run_sums *a) {
    __m512d total = _mm512_add_pd(_mm512_add_pd(a->sum[0], a->sum[1]), _mm512_add_pd(a->sum[2], a->sum[3]));
    double lanes[8], whole = 0.0;
    _mm512_storeu_pd(lanes, total);
    for (int k = 0; k < 8; k++) whole += lanes[k];
    return whole;
}

static inline int64_t sums_count(const run_sums *a, int select, int64_t lanes) { return (void)select, (void)lanes, a->count; }
#else
/* Four float64 accumulators (a float64 add waits on the one before) and the count, as vectors. */
typedef struct {
    half_d sum[4];
    lanes_i count;
} run_sums;

ALWAYS_INLINE void sums_vector(run_sums *a, const lanes_i *bits, int select, const selection *chosen, int second) {
    lanes_i counted, kept = lanes_kept(bits, select, chosen, &counted);
    a->sum[2 * second] += lanes_low((lanes_f)kept), a->sum[2 * second + 1] += lanes_high((lanes_f)kept);
    a->count -= counted;
}

static inline double sums_total(const run_sums *a) {
    half_d total = (a->sum[0] + a->sum[1]) + (a->sum[2] + a->sum[3]);
    double whole = 0.0;
    for (int k = 0; k < LANES / 2; k++) whole += total[k];
    return whole;
}

/* The run's count: its selected lanes, or its `lanes` (padding included) less the non-finite ones (SELECT_FINITE). */
static inline int64_t sums_count(const run_sums *a, int select, int64_t lanes) {
    int64_t counted = lanes_sum_of(a->count);
    return select == SELECT_FINITE ? lanes - counted : counted;
}
#endif

#endif
