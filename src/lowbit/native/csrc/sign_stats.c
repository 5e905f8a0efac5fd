/* The sign formats' per-group statistics (formats/binary.py masked_mean, as binary and ternary use it).
 *
 * The eager mean sums the selected float32 magnitudes in float64 in torch's order and rounds sum / count to
 * float32 once. A sum in another order can differ in its last bits, so the mean here is certified instead:
 * every float64 sum of n nonnegative terms, in any order, is within (n - 1) u of the exact sum (u = 2^-53);
 * ours is too (with our own depth), so when the float32 rounding of the whole interval of possible quotients
 * is one float, that float is torch's result. Where it is not, the sum may still be exact in every order (all
 * terms multiples of a bit that 2^53 of cover the sum): a second, serial pass finds the smallest positive
 * term to tell. Otherwise (rare: the quotient lies next to a float32 midpoint) the caller runs the eager
 * path. One pass over x gives a mean. */
#include <math.h>
#include <stdlib.h>
#include "lanes.h"
#include "sign.h"

#define PIECE 65536 /* elements a thread sums alone (more when there are many groups) */

/* ---------------------------------------------------------------- the sums of one run ---------------- */

/* The bits of the magnitude a selection keeps, 0 for an element it leaves out (masked_mean's `kept`), and
 * the selection mask (the bits of a float >= +0 order as the float does). */
ALWAYS_INLINE lanes_i lanes_kept(const lanes_i *bits, int select, const lanes_i *delta, lanes_i *selected) {
    lanes_i raw = *bits, magnitude = raw & 0x7fffffff;
    switch (select) {
    case SELECT_NOT_NAN: *selected = magnitude <= 0x7f800000; return magnitude & (magnitude < 0x7f800000);
    case SELECT_POSITIVE: *selected = (raw > 0) & (raw < 0x7f800000); return raw & *selected;
    default: *selected = (magnitude > *delta) & (magnitude < 0x7f800000); return magnitude & *selected;
    }
}

#if defined(__AVX512F__)
/* AVX-512: the selections as mask registers, counted by popcount, the kept lanes widened by zero-masking
 * converts (half the vector instructions of the generic code). */
typedef struct {
    __m512d sum[4];
    int64_t count;
} run_sums;

ALWAYS_INLINE void sums_vector(run_sums *a, const lanes_i *bits, int select, const lanes_i *delta, int second) {
    const __m512i infinity = _mm512_set1_epi32(0x7f800000);
    __m512i raw = (__m512i)*bits, magnitude = _mm512_and_si512(raw, _mm512_set1_epi32(0x7fffffff)), value = magnitude;
    __mmask16 selected, keep;
    if (select == SELECT_NOT_NAN) {
        selected = _mm512_cmple_epi32_mask(magnitude, infinity), keep = _mm512_cmplt_epi32_mask(magnitude, infinity);
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

static inline int64_t sums_count(const run_sums *a) { return a->count; }
#else
/* Four float64 accumulators (a float64 add waits on the one before) and the count, as vectors. */
typedef struct {
    half_d sum[4];
    lanes_i count;
} run_sums;

ALWAYS_INLINE void sums_vector(run_sums *a, const lanes_i *bits, int select, const lanes_i *delta, int second) {
    lanes_i selected, kept = lanes_kept(bits, select, delta, &selected);
    a->sum[2 * second] += lanes_low((lanes_f)kept), a->sum[2 * second + 1] += lanes_high((lanes_f)kept);
    a->count -= selected;
}

static inline double sums_total(const run_sums *a) {
    half_d total = (a->sum[0] + a->sum[1]) + (a->sum[2] + a->sum[3]);
    double whole = 0.0;
    for (int k = 0; k < LANES / 2; k++) whole += total[k];
    return whole;
}

static inline int64_t sums_count(const run_sums *a) { return lanes_sum_of(a->count); }
#endif

/* One group's run x[0..length) into the slot s. */
ALWAYS_INLINE void run_sums_of(const stats_job *job, int select, const float *x, int64_t length, int64_t group,
                               int64_t s) {
    lanes_i delta = lanes_of(select == SELECT_ABOVE ? (int32_t)lb_bits(job->delta[group]) : 0);
    run_sums a;
    memset(&a, 0, sizeof a);
    int64_t i = 0;
    for (; i + 2 * LANES <= length; i += 2 * LANES) {
        lanes_i raw0 = lanes_load(x + i), raw1 = lanes_load(x + i + LANES);
        sums_vector(&a, &raw0, select, &delta, 0), sums_vector(&a, &raw1, select, &delta, 1);
    }
    for (; i < length; i += LANES) { /* the last partial vector padded with NaN, which no selection keeps */
        lanes_i raw = length - i >= LANES ? lanes_load(x + i) : lanes_load_tail(x + i, length - i);
        sums_vector(&a, &raw, select, &delta, 0);
    }
    job->sum[s] += sums_total(&a);
    job->count[s] += sums_count(&a);
}

/* The same for one element per element of the selection, as plain int32 (the row loops below). */
ALWAYS_INLINE int32_t element_kept(int32_t raw, int select, int32_t delta, int32_t *selected) {
    int32_t magnitude = raw & 0x7fffffff;
    switch (select) {
    case SELECT_NOT_NAN: *selected = magnitude <= 0x7f800000; return magnitude < 0x7f800000 ? magnitude : 0;
    case SELECT_POSITIVE: *selected = (raw > 0) & (raw < 0x7f800000); return *selected ? raw : 0;
    default: *selected = (magnitude > delta) & (magnitude < 0x7f800000); return *selected ? magnitude : 0;
    }
}

/* Groups of stride 1 (inner == 1: per channel on the last axis): x[0..length) holds one element of each of
 * the groups from `group` on, whose slots start at s; element k updates slot s + k (a plain loop over the
 * slots, which GCC vectorises). */
ALWAYS_INLINE void row_sums_of(const stats_job *job, int select, const float *x, int64_t length, int64_t group,
                               int64_t s) {
    const float *restrict delta = job->delta + group;
    double *restrict sum = job->sum + s;
    int64_t *restrict count = job->count + s;
    for (int64_t k = 0; k < length; k++) {
        int32_t raw, selected, kept;
        memcpy(&raw, x + k, sizeof raw);
        kept = element_kept(raw, select, select == SELECT_ABOVE ? (int32_t)lb_bits(delta[k]) : 0, &selected);
        sum[k] += (double)lb_float((uint32_t)kept);
        count[k] += selected;
    }
}

/* The least pass (rare, serial): the smallest positive kept magnitude of a run (row = 0: one group) or of
 * a row's elements (one group each), as bits. */
static void least_of(const stats_job *job, const float *x, int64_t length, int64_t group, int64_t s, int row) {
    for (int64_t k = 0; k < length; k++) {
        int32_t raw, selected, kept;
        int64_t g = group + (row ? k : 0), slot = s + (row ? k : 0);
        memcpy(&raw, x + k, sizeof raw);
        int32_t delta = job->select == SELECT_ABOVE ? (int32_t)lb_bits(job->delta[g]) : 0;
        kept = element_kept(raw, job->select, delta, &selected);
        if (kept > 0 && kept < job->positive[slot]) job->positive[slot] = kept;
    }
}

/* One group's run into the slot s, or with `row` one element of each group from `group` on (each selection
 * a constant in its copy of the loops). */
static void stats_run(const stats_job *job, const float *x, int64_t length, int64_t group, int64_t s, int row) {
    if (job->least) {
        least_of(job, x, length, group, s, row);
        return;
    }
    switch (row * 4 + job->select) {
    case SELECT_NOT_NAN: run_sums_of(job, SELECT_NOT_NAN, x, length, group, s); break;
    case SELECT_POSITIVE: run_sums_of(job, SELECT_POSITIVE, x, length, group, s); break;
    case SELECT_ABOVE: run_sums_of(job, SELECT_ABOVE, x, length, group, s); break;
    case 4 + SELECT_NOT_NAN: row_sums_of(job, SELECT_NOT_NAN, x, length, group, s); break;
    case 4 + SELECT_POSITIVE: row_sums_of(job, SELECT_POSITIVE, x, length, group, s); break;
    default: row_sums_of(job, SELECT_ABOVE, x, length, group, s); break;
    }
}

/* ---------------------------------------------------------------- passes and means ------------------- */

void lb_stats_range(const void *context, int64_t begin, int64_t end) {
    const stats_job *job = context;
    for (int64_t start = begin; start < end; start += job->piece) {
        int64_t stop = start + job->piece < end ? start + job->piece : end;
        int64_t slot = job->pieces == 1 ? 0 : (start / job->piece) * job->groups;
        for (int64_t i = start; i < stop;) {
            int64_t group = (i / job->inner) % job->groups, run_end = stop;
            int row = job->groups > 1 && job->inner == 1;
            if (job->groups > 1) run_end = row ? i - group + job->groups : (i / job->inner + 1) * job->inner;
            run_end = run_end < stop ? run_end : stop;
            stats_run(job, job->x + i, run_end - i, group, slot + group, row);
            i = run_end;
        }
    }
}

int lb_stats_open(stats_job *job, const float *x, int64_t outer, int64_t groups, int64_t inner, int threads) {
    int64_t n = outer * groups * inner, piece = PIECE, pieces = (n + piece - 1) / piece;
    while (pieces * groups > (1 << 20)) piece *= 2, pieces = (n + piece - 1) / piece;
    if (threads > 1 && pieces > 1 && pieces % threads) { /* as many pieces on each thread (3 pieces on 2 threads: 2 and 1) */
        pieces += threads - pieces % threads;
        piece = ((n + pieces - 1) / pieces + 4 * LANES - 1) / (4 * LANES) * (4 * LANES);
        pieces = (n + piece - 1) / piece;
    }
    if (outer == 1 && groups > 1) { /* each group one run: pieces of whole groups, one slot per group */
        piece = (PIECE + inner - 1) / inner * inner, pieces = 1;
    }
    int64_t slots = pieces * groups;
    char *memory = malloc((size_t)slots * (sizeof(double) + sizeof(int64_t) + sizeof(int32_t)));
    *job = (stats_job){.x = x, .n = n, .groups = groups, .inner = inner, .pieces = pieces, .piece = piece,
                       .memory = memory};
    if (!memory) return 0;
    job->sum = (double *)memory;
    job->count = (int64_t *)(job->sum + slots);
    job->positive = (int32_t *)(job->count + slots);
    return 1;
}

void lb_stats_start(stats_job *job, int select, const float *delta) {
    int64_t slots = job->pieces * job->groups;
    job->select = select, job->delta = delta, job->least = 0;
    for (int64_t s = 0; s < slots; s++) job->sum[s] = 0.0, job->count[s] = 0, job->positive[s] = NONE;
}

/* masked_mean's float32 result from our float64 sum of `count` nonnegative float32 terms, each a multiple of
 * the last mantissa bit of `least` (a float at or below every positive term; 0 when not known), or 0 when not
 * certain. Where the exact sum is below 2^53 such bits, every partial sum in every order is exact (so is
 * ours); otherwise both sums are within (terms + depth) u of the exact one. */
static int certified_mean(double sum, int64_t count, int64_t depth, float least, float *mean) {
    int32_t field = (int32_t)(lb_bits(least) >> 23);
    int32_t quantum = field == 0 ? -149 : field - 127 - 23; /* least's last mantissa bit */
    /* an inexact sum of fewer than 2^33 terms is within 2^-20 of the exact one, so one this far below the
     * bound is exact */
    int exact = count + depth < ((int64_t)1 << 33) && sum <= ldexp(1.0, 53 + quantum) * (1.0 - 0x1p-20);
    double divisor = (double)(count > 1 ? count : 1), quotient = sum / divisor;
    double spread = exact ? 0.0 : (double)(count + depth + 16) * 0x1p-52;
    float low = (float)(quotient * (1.0 - spread)), high = (float)(quotient * (1.0 + spread));
    if (low != high) return 0;
    *mean = low;
    return 1;
}

/* Group g's mean from its slots (least: with the positive slots of a least pass, else not knowing the
 * smallest term) and its count. */
static int group_mean(const stats_job *job, int64_t g, int64_t depth, int least, float *mean, int64_t *count_out) {
    double total = 0.0;
    int64_t count = 0;
    int32_t positive = NONE;
    for (int64_t p = 0; p < job->pieces; p++) {
        int64_t s = p * job->groups + g;
        total += job->sum[s], count += job->count[s];
        positive = job->positive[s] < positive ? job->positive[s] : positive;
    }
    *count_out = count;
    if (count == 0) {
        *mean = 0.0f;
        return 1;
    }
    return certified_mean(total, count, depth, least ? lb_float((uint32_t)positive) : 0.0f, mean);
}

int lb_stats_means(stats_job *job, float *mean, int zero_ok) {
    int64_t depth = (job->n < job->piece ? job->n : job->piece) + job->pieces;
    int least = 0;
    for (int64_t g = 0; g < job->groups; g++) {
        int64_t count;
        if (!group_mean(job, g, depth, least, &mean[g], &count)) {
            if (least) return 0;
            job->least = least = 1; /* once: every group's smallest term, then this group again */
            lb_stats_range(job, 0, job->n);
            if (!group_mean(job, g, depth, least, &mean[g], &count)) return 0;
        }
        if (!zero_ok && count > 0 && mean[g] == 0.0f) return 0;
    }
    return 1;
}
