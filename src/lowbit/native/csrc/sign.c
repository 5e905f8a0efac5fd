/* Sign formats (formats/binary.py, ternary.py): element passes, and the per-group statistics (mean |x| and
 * friends) that binary / ternary scales and thresholds come from.
 *
 * Groups: x is viewed as [outer, groups, inner] and a group is one index of the middle dimension (per
 * tensor: groups = 1; per channel on an axis: groups = that dimension's length).
 *
 * The eager statistics sum float32 terms f32(m / unit) in float64 in torch's order, then round the mean to
 * float32. A sum in another order can differ in its last bits, so the mean here is certified instead: every
 * float64 sum of n nonnegative terms, in any order, is within (n - 1) u of the exact sum (u = 2^-53); ours
 * is too (with our own depth), so when the float32 rounding of the whole interval of possible quotients is
 * one float, that float is torch's result. Otherwise (rare: the quotient lies next to a float32 midpoint)
 * the caller takes the eager path. */
#include <float.h>
#include <stdlib.h>
#include "common.h"

/* ---------------------------------------------------------------- group statistics --------------------- */

enum { SELECT_NOT_NAN, SELECT_POSITIVE, SELECT_ABOVE };
#define PIECE 65536 /* elements a thread sums alone (more when there are many groups) */

/* Per piece (PIECE elements, one thread) and group: the largest kept magnitude (pass 1), then the count,
 * the smallest selected magnitude and the float64 sum of f32(kept / unit) (pass 2). */
typedef struct {
    const float *x;
    int64_t n, groups, inner, pieces, piece;
    int select, pass;
    const float *delta, *unit; /* per group */
    float *top, *bottom, *least; /* [pieces][groups]; least: the smallest nonzero term */
    int64_t *count;
    double *sum;
} stats_job;

/* The magnitude a selection keeps, or 0 for an element it leaves out (binary.masked_mean's `kept`):
 * mean_abs keeps every non-NaN (inf as 0), the unipolar scale the finite positives, the ternary scale the
 * finite magnitudes above delta. */
static inline float stats_kept(float v, int select, float delta, int *selected) {
    float magnitude = fabsf(v);
    switch (select) {
    case SELECT_NOT_NAN: *selected = v == v; return magnitude <= FLT_MAX ? magnitude : 0.0f;
    case SELECT_POSITIVE: *selected = v > 0.0f && v <= FLT_MAX; return *selected ? v : 0.0f;
    default: *selected = magnitude > delta && magnitude <= FLT_MAX; return *selected ? magnitude : 0.0f;
    }
}

#define STATS_TOP(SELECT) \
    for (; i < length; i++) { \
        int selected; \
        float kept = stats_kept(x[i], SELECT, delta, &selected); \
        high = kept > high ? kept : high; \
    }
#define STATS_SUM_ONE(SELECT, k, v) \
    do { \
        int selected; \
        float kept = stats_kept(v, SELECT, delta, &selected), term = kept / unit; \
        lanes[k] += (double)term; \
        low[k] = selected && kept < low[k] ? kept : low[k]; \
        least[k] = term > 0.0f && term < least[k] ? term : least[k]; \
        counts[k] += selected; \
    } while (0)
#define STATS_SUM(SELECT) \
    for (; i + 8 <= length; i += 8) \
        for (int k = 0; k < 8; k++) STATS_SUM_ONE(SELECT, k, x[i + k]); \
    for (; i < length; i++) STATS_SUM_ONE(SELECT, 0, x[i]);
#define STATS_SELECT(SELECT_BODY) \
    switch (job->select) { \
    case SELECT_NOT_NAN: SELECT_BODY(SELECT_NOT_NAN); break; \
    case SELECT_POSITIVE: SELECT_BODY(SELECT_POSITIVE); break; \
    default: SELECT_BODY(SELECT_ABOVE); break; \
    }

/* Eight lanes at a time with GCC vector types (the lanes' order does not matter: tops, bottoms and counts
 * are exact, and the sum is certified for any order). Masks are -1 / 0 per lane. */
typedef float stats_f8 __attribute__((vector_size(32)));
typedef int32_t stats_i8 __attribute__((vector_size(32)));
typedef double stats_d8 __attribute__((vector_size(64)));

static inline stats_f8 stats_select8(stats_i8 mask, stats_f8 yes, stats_f8 no) {
    return (stats_f8)(((stats_i8)yes & mask) | ((stats_i8)no & ~mask));
}

/* stats_kept for eight elements. */
static inline stats_f8 stats_kept8(stats_f8 v, int select, stats_f8 delta, stats_i8 *selected) {
    stats_i8 raw = (stats_i8)v, bits = raw & 0x7fffffff, finite = bits < 0x7f800000;
    switch (select) {
    case SELECT_NOT_NAN: *selected = bits <= 0x7f800000; return (stats_f8)(bits & finite);
    case SELECT_POSITIVE: *selected = (raw > 0) & (raw < 0x7f800000); return (stats_f8)(raw & *selected);
    default: *selected = ((stats_f8)bits > delta) & finite; return (stats_f8)(bits & *selected);
    }
}

#define STATS_TOP8(SELECT) \
    for (; i + 8 <= length; i += 8) { \
        stats_f8 v; \
        stats_i8 selected; \
        memcpy(&v, x + i, sizeof v); \
        stats_f8 kept = stats_kept8(v, SELECT, delta8, &selected); \
        high8 = stats_select8(kept > high8, kept, high8); \
    }
#define STATS_SUM8(SELECT) \
    for (; i + 8 <= length; i += 8) { \
        stats_f8 v; \
        stats_i8 selected; \
        memcpy(&v, x + i, sizeof v); \
        stats_f8 kept = stats_kept8(v, SELECT, delta8, &selected), term = kept / unit8; \
        sum8 += __builtin_convertvector(term, stats_d8); \
        low8 = stats_select8(selected & (kept < low8), kept, low8); \
        least8 = stats_select8((term > 0.0f) & (term < least8), term, least8); \
        count8 -= selected; \
    }

/* One group's run x[0..length) into the slot s. */
static void stats_run(const stats_job *job, const float *x, int64_t length, int64_t group, int64_t s) {
    float delta = job->delta[group];
    stats_f8 delta8 = {delta, delta, delta, delta, delta, delta, delta, delta};
    int64_t i = 0;
    if (job->pass == 1) {
        stats_f8 high8 = {0, 0, 0, 0, 0, 0, 0, 0};
        STATS_SELECT(STATS_TOP8)
        float high = job->top[s];
        for (int k = 0; k < 8; k++) high = high8[k] > high ? high8[k] : high;
        STATS_SELECT(STATS_TOP)
        job->top[s] = high;
        return;
    }
    float unit = job->unit[group], low[8], least[8];
    stats_f8 unit8 = {unit, unit, unit, unit, unit, unit, unit, unit}, low8, least8;
    stats_d8 sum8 = {0, 0, 0, 0, 0, 0, 0, 0};
    stats_i8 count8 = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < 8; k++) low8[k] = least8[k] = INFINITY;
    STATS_SELECT(STATS_SUM8)
    double lanes[8];
    int64_t counts[8];
    for (int k = 0; k < 8; k++) lanes[k] = sum8[k], counts[k] = count8[k], low[k] = low8[k], least[k] = least8[k];
    STATS_SELECT(STATS_SUM)
    job->sum[s] += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (int k = 0; k < 8; k++) {
        job->count[s] += counts[k];
        job->bottom[s] = low[k] < job->bottom[s] ? low[k] : job->bottom[s];
        job->least[s] = least[k] < job->least[s] ? least[k] : job->least[s];
    }
}

static void stats_range(const void *context, int64_t begin, int64_t end) {
    const stats_job *job = context;
    for (int64_t start = begin; start < end; start += job->piece) {
        int64_t stop = start + job->piece < end ? start + job->piece : end, slot = (start / job->piece) * job->groups;
        for (int64_t i = start; i < stop;) {
            int64_t group = (i / job->inner) % job->groups, run_end = stop;
            if (job->groups > 1) run_end = job->inner > 1 ? (i / job->inner + 1) * job->inner : i + 1;
            run_end = run_end < stop ? run_end : stop;
            stats_run(job, job->x + i, run_end - i, group, slot + group);
            i = run_end;
        }
    }
}

typedef struct {
    stats_job job;
    void *memory;
} group_stats;

static int stats_open(group_stats *stats, const float *x, int64_t outer, int64_t groups, int64_t inner) {
    int64_t n = outer * groups * inner, piece = PIECE, pieces = (n + piece - 1) / piece;
    while (pieces * groups > (1 << 20)) piece *= 2, pieces = (n + piece - 1) / piece;
    int64_t slots = pieces * groups;
    size_t bytes = (size_t)slots * (3 * sizeof(float) + sizeof(int64_t) + sizeof(double)) + 2 * (size_t)groups * sizeof(float);
    char *memory = malloc(bytes);
    if (!memory) return 0;
    stats_job *job = &stats->job;
    stats->memory = memory;
    job->x = x, job->n = n, job->groups = groups, job->inner = inner, job->pieces = pieces, job->piece = piece;
    job->sum = (double *)memory;
    job->count = (int64_t *)(job->sum + slots);
    job->top = (float *)(job->count + slots);
    job->bottom = job->top + slots;
    job->least = job->bottom + slots;
    return 1;
}

/* Pass 1 over the selection: unit[g] = the group's largest kept magnitude, or 1 where it is 0; the largest
 * itself into top[g] (each array: one float per group). */
static void stats_tops(group_stats *stats, int select, const float *delta, float *top, float *unit, int threads) {
    stats_job *job = &stats->job;
    int64_t slots = job->pieces * job->groups;
    for (int64_t s = 0; s < slots; s++) job->top[s] = 0.0f;
    job->select = select, job->pass = 1, job->delta = delta;
    lb_parallel(job->n, job->piece, threads, stats_range, job);
    for (int64_t g = 0; g < job->groups; g++) {
        float high = 0.0f;
        for (int64_t p = 0; p < job->pieces; p++) high = job->top[p * job->groups + g] > high ? job->top[p * job->groups + g] : high;
        top[g] = high;
        unit[g] = high > 0.0f ? high : 1.0f;
    }
}

/* masked_mean's float32 result from our float64 sum of `count` terms in (0, 1], or 0 when not certain.
 * Terms that are all multiples of 2^q with count <= 2^(53 + q) add exactly in every order (no partial sum
 * needs more than 53 bits); otherwise both sums are within (terms + depth) u of the exact one. */
static int certified_mean(double sum, int64_t count, int64_t depth, float least, float unit, float *mean) {
    int32_t field = (int32_t)(lb_bits(least) >> 23);
    int32_t quantum = field == 0 ? -149 : field - 127 - 23; /* least's last mantissa bit */
    int exact = (double)count <= ldexp(1.0, 53 + quantum);
    double divisor = (double)(count > 1 ? count : 1), quotient = sum / divisor;
    double spread = exact ? 0.0 : (double)(count + depth + 16) * 0x1p-52;
    float low = (float)(quotient * (1.0 - spread)), high = (float)(quotient * (1.0 + spread));
    if (low != high) return 0;
    *mean = unit * low;
    return 1;
}

/* Pass 2: mean[g] = binary.masked_mean of the selection, from the groups' tops and units of pass 1 (for
 * SELECT_ABOVE those of SELECT_NOT_NAN: the same wherever something is above delta). 0 when a mean is not
 * certain, or is 0 over a nonempty selection (eager paths then differ in the sign of zeros). */
static int stats_means(group_stats *stats, int select, const float *delta, const float *top, const float *unit,
                       float *mean, int zero_ok, int threads) {
    stats_job *job = &stats->job;
    int64_t slots = job->pieces * job->groups;
    for (int64_t s = 0; s < slots; s++) job->sum[s] = 0.0, job->count[s] = 0, job->bottom[s] = job->least[s] = INFINITY;
    job->select = select, job->pass = 2, job->delta = delta, job->unit = unit;
    lb_parallel(job->n, job->piece, threads, stats_range, job);
    int64_t depth = (job->n < job->piece ? job->n : job->piece) + job->pieces;
    for (int64_t g = 0; g < job->groups; g++) {
        double total = 0.0;
        int64_t count = 0;
        float bottom = INFINITY, least = INFINITY;
        for (int64_t p = 0; p < job->pieces; p++) {
            int64_t s = p * job->groups + g;
            total += job->sum[s], count += job->count[s];
            bottom = job->bottom[s] < bottom ? job->bottom[s] : bottom;
            least = job->least[s] < least ? job->least[s] : least;
        }
        float high = count > 0 ? top[g] : 0.0f;
        if (count == 0) mean[g] = 0.0f;
        else if (high == bottom) mean[g] = high;
        else if (!certified_mean(total, count, depth, least, unit[g], &mean[g])) return 0;
        if (!zero_ok && count > 0 && mean[g] == 0.0f) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- element passes ----------------------- */

enum { ELEMENT_TERNARY, ELEMENT_BIPOLAR, ELEMENT_UNIPOLAR };

typedef struct {
    const float *x;
    float *out;
    int64_t groups, inner;
    int kind;
    const float *delta, *value; /* per group: ternary threshold; the scale (1 unscaled) */
} element_job;

static inline float element_value(float v, int kind, float delta, float value) {
    float result;
    if (kind == ELEMENT_TERNARY) /* ((x > delta) - (x < -delta)) * value, for a value >= 0: +-value or +0 */
        result = v > delta ? value : (v < -delta ? -1.0f * value : 0.0f);
    else if (kind == ELEMENT_BIPOLAR)
        result = v >= 0.0f ? value : -1.0f * value;
    else
        result = v > 0.0f ? value : 0.0f * value;
    return v != v ? v : result;
}

#define ELEMENT_RUN(KIND) \
    for (int64_t k = 0; k < length; k++) out[k] = element_value(x[k], KIND, job->delta[g], job->value[g])
#define ELEMENT_ROW(KIND) \
    for (int64_t k = 0; k < length; k++) out[k] = element_value(x[k], KIND, job->delta[g + k], job->value[g + k])

static void element_range(const void *context, int64_t begin, int64_t end) {
    const element_job *job = context;
    for (int64_t i = begin; i < end;) {
        int64_t g = (i / job->inner) % job->groups, length;
        const float *x = job->x + i;
        float *out = job->out + i;
        if (job->groups == 1 || job->inner > 1) { /* one group over the run */
            int64_t run_end = job->groups == 1 ? end : (i / job->inner + 1) * job->inner;
            length = (run_end < end ? run_end : end) - i;
            switch (job->kind) {
            case ELEMENT_TERNARY: ELEMENT_RUN(ELEMENT_TERNARY); break;
            case ELEMENT_BIPOLAR: ELEMENT_RUN(ELEMENT_BIPOLAR); break;
            default: ELEMENT_RUN(ELEMENT_UNIPOLAR); break;
            }
        } else { /* inner == 1: consecutive elements, consecutive groups up to the row's end */
            int64_t run_end = i - g + job->groups;
            length = (run_end < end ? run_end : end) - i;
            switch (job->kind) {
            case ELEMENT_TERNARY: ELEMENT_ROW(ELEMENT_TERNARY); break;
            case ELEMENT_BIPOLAR: ELEMENT_ROW(ELEMENT_BIPOLAR); break;
            default: ELEMENT_ROW(ELEMENT_UNIPOLAR); break;
            }
        }
        i += length;
    }
}

/* kind: ELEMENT_*; delta and value: one float32 per group. */
void lb_sign_elements_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int kind,
                          const float *delta, const float *value, int threads) {
    element_job job = {x, out, groups, inner, kind, delta, value};
    int64_t grain = groups == 1 ? 16 : (inner > 1 ? inner : groups);
    lb_parallel(outer * groups * inner, grain, threads, element_range, &job);
}

/* ---------------------------------------------------------------- binary_residual ---------------------- */

#define RESIDUAL_MAX_POINTS 32

typedef struct {
    const float *x;
    float *out;
    int points;
    float midpoints[RESIDUAL_MAX_POINTS], values[RESIDUAL_MAX_POINTS + 1];
    int above[RESIDUAL_MAX_POINTS];
} residual_job;

/* The index of the nearest value = the number of exact midpoints <= x (a rounded midpoint whose exact one
 * lies above it counts only when x is past it). */
static void residual_range(const void *context, int64_t begin, int64_t end) {
    const residual_job *job = context;
    enum { CHUNK = 512 };
    int32_t index[CHUNK];
    float values[RESIDUAL_MAX_POINTS + 1];
    memcpy(values, job->values, sizeof values);
    for (int64_t start = begin; start < end; start += CHUNK) {
        int64_t length = end - start < CHUNK ? end - start : CHUNK;
        const float *x = job->x + start;
        float *out = job->out + start;
        for (int64_t i = 0; i < length; i++) index[i] = 0;
        for (int p = 0; p < job->points; p++) { /* one midpoint over the chunk: vectorises */
            float midpoint = job->midpoints[p];
            if (job->above[p])
                for (int64_t i = 0; i < length; i++) index[i] += x[i] > midpoint;
            else
                for (int64_t i = 0; i < length; i++) index[i] += x[i] >= midpoint;
        }
        for (int64_t i = 0; i < length; i++) {
            float value = values[index[i]]; /* read for every lane, NaN's too (its index is in range) */
            out[i] = x[i] != x[i] ? x[i] : value;
        }
    }
}

/* points <= RESIDUAL_MAX_POINTS midpoints (ascending), points + 1 values. */
void lb_residual_f32(const float *x, float *out, int64_t n, int points, const float *midpoints,
                     const int *above, const float *values, int threads) {
    residual_job job;
    job.x = x, job.out = out, job.points = points;
    for (int p = 0; p < points; p++) job.midpoints[p] = midpoints[p], job.above[p] = above[p];
    for (int p = 0; p <= points; p++) job.values[p] = values[p];
    lb_parallel(n, 16, threads, residual_range, &job);
}

/* ---------------------------------------------------------------- whole formats ------------------------ */

/* formats/ternary.py: delta = threshold (fixed) or 0.75 mean |x| per group (TWN); the value is the given
 * alpha[g], the TWN scale (scaled) or 1. Returns 1, or 0 where the eager path must run (see stats_means). */
int lb_ternary_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int fixed,
                   float threshold, int scaled, const float *alpha, int threads) {
    group_stats stats = {.memory = NULL};
    int needs_stats = !fixed || (scaled && !alpha);
    float *arrays = calloc(5 * (size_t)groups, sizeof(float));
    if (!arrays || (needs_stats && !stats_open(&stats, x, outer, groups, inner))) { free(arrays); return 0; }
    float *delta = arrays, *value = delta + groups, *top = value + groups, *unit = top + groups, *mean = unit + groups;
    int ok = 1, have_tops = 0;
    if (fixed) {
        for (int64_t g = 0; g < groups; g++) delta[g] = threshold;
    } else {
        stats_tops(&stats, SELECT_NOT_NAN, delta, top, unit, threads), have_tops = 1;
        ok = stats_means(&stats, SELECT_NOT_NAN, delta, top, unit, mean, 1, threads);
        for (int64_t g = 0; g < groups; g++) delta[g] = 0.75f * mean[g];
    }
    if (ok && alpha) {
        for (int64_t g = 0; g < groups; g++) value[g] = alpha[g];
    } else if (ok && scaled) {
        if (!have_tops) stats_tops(&stats, SELECT_NOT_NAN, delta, top, unit, threads);
        ok = stats_means(&stats, SELECT_ABOVE, delta, top, unit, value, 0, threads);
    } else {
        for (int64_t g = 0; g < groups; g++) value[g] = 1.0f;
    }
    if (ok) lb_sign_elements_f32(x, out, outer, groups, inner, ELEMENT_TERNARY, delta, value, threads);
    free(stats.memory), free(arrays);
    return ok;
}

/* formats/binary.py (deterministic): the value is the given alpha[g], mean |x| (bipolar) or the mean of the
 * finite positives (unipolar) per group when scaled, or 1. Returns 1, or 0 where the eager path must run. */
int lb_binary_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int bipolar,
                  int scaled, const float *alpha, int threads) {
    group_stats stats = {.memory = NULL};
    float *arrays = calloc(3 * (size_t)groups, sizeof(float));
    if (!arrays || (scaled && !alpha && !stats_open(&stats, x, outer, groups, inner))) { free(arrays); return 0; }
    float *value = arrays, *top = value + groups, *unit = top + groups;
    int ok = 1, select = bipolar ? SELECT_NOT_NAN : SELECT_POSITIVE;
    if (alpha) {
        for (int64_t g = 0; g < groups; g++) value[g] = alpha[g];
    } else if (scaled) {
        stats_tops(&stats, select, value, top, unit, threads);
        ok = stats_means(&stats, select, value, top, unit, value, 1, threads);
    } else {
        for (int64_t g = 0; g < groups; g++) value[g] = 1.0f;
    }
    if (ok) lb_sign_elements_f32(x, out, outer, groups, inner, bipolar ? ELEMENT_BIPOLAR : ELEMENT_UNIPOLAR,
                                 value, value, threads);
    free(stats.memory), free(arrays);
    return ok;
}
