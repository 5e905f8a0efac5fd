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
#include <stdlib.h>
#include "lanes.h"
#include "phases.h"
#include "sign.h"

/* ---------------------------------------------------------------- group statistics --------------------- */

enum { SELECT_NOT_NAN, SELECT_POSITIVE, SELECT_ABOVE };
#define PIECE 65536 /* elements a thread sums alone (more when there are many groups) */

/* Per piece (PIECE elements, one thread; when every group is one run, the pieces hold whole groups and share
 * one row of slots, as no two threads touch a group) and group. Pass 1 (SELECT_NOT_NAN or SELECT_POSITIVE): the largest
 * kept magnitude, the smallest positive one and the count. Pass 2: the float64 sum of f32(kept / unit), and
 * for SELECT_ABOVE (whose pass 1 is SELECT_NOT_NAN's) its count. Magnitudes are held as their float32 bits:
 * nonnegative floats order as their bits do, so integer max / min give the float max / min (and vectorise
 * without fast-math). masked_mean's "all selected equal: the max" rule needs no smallest magnitude here:
 * then every term is exactly 1 and the certified mean is unit * 1, the max (see certified_mean). */
typedef struct {
    const float *x;
    int64_t n, groups, inner, pieces, piece;
    int select, pass;
    const float *delta, *unit; /* per group */
    int32_t *top, *positive; /* [pieces][groups], bits */
    int64_t *count;
    double *sum;
} stats_job;

/* The bits of the magnitude a selection keeps, 0 for an element it leaves out (binary.masked_mean's `kept`),
 * and the selection mask: mean_abs keeps every non-NaN (inf as 0), the unipolar scale the finite positives,
 * the ternary scale the finite magnitudes above delta (the bits of a float >= +0). */
ALWAYS_INLINE lanes_i lanes_kept(const lanes_i *bits, int select, const lanes_i *delta, lanes_i *selected) {
    lanes_i raw = *bits, magnitude = raw & 0x7fffffff;
    switch (select) {
    case SELECT_NOT_NAN: *selected = magnitude <= 0x7f800000; return magnitude & (magnitude < 0x7f800000);
    case SELECT_POSITIVE: *selected = (raw > 0) & (raw < 0x7f800000); return raw & *selected;
    default: *selected = (magnitude > *delta) & (magnitude < 0x7f800000); return magnitude & *selected;
    }
}

/* Pass 1 over one group's run x[0..length) into the slot s. Four sets of accumulators: a compare and a
 * blend per max / min take several cycles, which one set would wait for. */
typedef struct {
    lanes_i top, positive, count;
} tops_lanes;

ALWAYS_INLINE void tops_step(tops_lanes *a, const lanes_i *raw, int select) {
    lanes_i selected, zero = lanes_of(0), kept = lanes_kept(raw, select, &zero, &selected);
    a->top = lanes_max(a->top, kept);
    a->positive = lanes_min(a->positive, kept | ((kept == 0) & NONE));
    a->count -= selected;
}

ALWAYS_INLINE void tops_merge(tops_lanes *a, const tops_lanes *b) {
    a->top = lanes_max(a->top, b->top), a->positive = lanes_min(a->positive, b->positive), a->count += b->count;
}

ALWAYS_INLINE void stats_run_tops(const stats_job *job, int select, const float *x, int64_t length, int64_t s) {
    tops_lanes a[4];
    for (int k = 0; k < 4; k++) a[k] = (tops_lanes){lanes_of(0), lanes_of(NONE), lanes_of(0)};
    int64_t i = 0;
    for (; i + 4 * LANES <= length; i += 4 * LANES)
        for (int k = 0; k < 4; k++) {
            lanes_i raw = lanes_load(x + i + k * LANES);
            tops_step(&a[k], &raw, select);
        }
    for (; i < length; i += LANES) {
        lanes_i raw = length - i >= LANES ? lanes_load(x + i) : lanes_load_tail(x + i, length - i);
        tops_step(&a[0], &raw, select);
    }
    tops_merge(&a[0], &a[1]), tops_merge(&a[2], &a[3]), tops_merge(&a[0], &a[2]);
    int32_t top = lanes_max_of(a[0].top), positive = lanes_min_of(a[0].positive);
    job->top[s] = top > job->top[s] ? top : job->top[s];
    job->positive[s] = positive < job->positive[s] ? positive : job->positive[s];
    job->count[s] += lanes_sum_of(a[0].count);
}


/* Pass 2 over one group's run: the terms f32(kept / unit) (a float32 division, as eager's) into four
 * float64 accumulators; the divisions bound the speed. */
ALWAYS_INLINE void stats_run_sums(const stats_job *job, int select, const float *x, int64_t length, int64_t group,
                                  int64_t s) {
    lanes_i delta = lanes_of((int32_t)lb_bits(job->delta[group])), count = lanes_of(0);
    lanes_f unit = lanes_float(job->unit[group]);
    half_d sum0 = {0}, sum1 = {0}, sum2 = {0}, sum3 = {0};
    int64_t i = 0;
    for (; i + 2 * LANES <= length; i += 2 * LANES) {
        lanes_i selected0, selected1, raw0 = lanes_load(x + i), raw1 = lanes_load(x + i + LANES);
        lanes_i kept0 = lanes_kept(&raw0, select, &delta, &selected0), kept1 = lanes_kept(&raw1, select, &delta, &selected1);
        lanes_f term0 = (lanes_f)kept0 / unit, term1 = (lanes_f)kept1 / unit;
        sum0 += lanes_low(term0), sum1 += lanes_high(term0), sum2 += lanes_low(term1), sum3 += lanes_high(term1);
        count -= selected0 + selected1;
    }
    for (; i < length; i += LANES) {
        lanes_i selected, raw = length - i >= LANES ? lanes_load(x + i) : lanes_load_tail(x + i, length - i);
        lanes_f term = (lanes_f)lanes_kept(&raw, select, &delta, &selected) / unit;
        sum0 += lanes_low(term), sum1 += lanes_high(term);
        count -= selected;
    }
    half_d total = (sum0 + sum1) + (sum2 + sum3);
    double whole = 0.0;
    for (int k = 0; k < LANES / 2; k++) whole += total[k];
    job->sum[s] += whole;
    if (select == SELECT_ABOVE) job->count[s] += lanes_sum_of(count);
}

/* Groups of stride 1 (inner == 1: per channel on the last axis): x[0..length) holds one element of each of
 * the groups from `group` on, whose slots start at s; element k updates slot s + k (plain loops over the
 * slots, which GCC vectorises). */
ALWAYS_INLINE int32_t element_kept(int32_t raw, int select, int32_t delta, int32_t *selected) {
    int32_t magnitude = raw & 0x7fffffff;
    switch (select) {
    case SELECT_NOT_NAN: *selected = magnitude <= 0x7f800000; return magnitude < 0x7f800000 ? magnitude : 0;
    case SELECT_POSITIVE: *selected = (raw > 0) & (raw < 0x7f800000); return *selected ? raw : 0;
    default: *selected = (magnitude > delta) & (magnitude < 0x7f800000); return *selected ? magnitude : 0;
    }
}

ALWAYS_INLINE void stats_row_tops(const stats_job *job, int select, const float *x, int64_t length, int64_t s) {
    int32_t *restrict top = job->top + s, *restrict positive = job->positive + s;
    int64_t *restrict count = job->count + s;
    for (int64_t k = 0; k < length; k++) {
        int32_t raw, selected, kept;
        memcpy(&raw, x + k, sizeof raw);
        kept = element_kept(raw, select, 0, &selected);
        int32_t key = kept > 0 ? kept : NONE;
        top[k] = kept > top[k] ? kept : top[k];
        positive[k] = key < positive[k] ? key : positive[k];
        count[k] += selected;
    }
}

ALWAYS_INLINE void stats_row_sums(const stats_job *job, int select, const float *x, int64_t length, int64_t group,
                                  int64_t s) {
    const float *restrict unit = job->unit + group, *restrict delta = job->delta + group;
    double *restrict sum = job->sum + s;
    int64_t *restrict count = job->count + s;
    for (int64_t k = 0; k < length; k++) {
        int32_t raw, selected, kept;
        memcpy(&raw, x + k, sizeof raw);
        kept = element_kept(raw, select, (int32_t)lb_bits(delta[k]), &selected);
        sum[k] += (double)(lb_float((uint32_t)kept) / unit[k]);
        if (select == SELECT_ABOVE) count[k] += selected;
    }
}

/* One group's run x[0..length) into the slot s, or with `row` one element of each group from `group` on (each
 * selection a constant in its copy of the loops). */
static void stats_run(const stats_job *job, const float *x, int64_t length, int64_t group, int64_t s, int row) {
    switch (job->pass * 8 + row * 4 + job->select) {
    case 8 + SELECT_NOT_NAN: stats_run_tops(job, SELECT_NOT_NAN, x, length, s); break;
    case 8 + SELECT_POSITIVE: stats_run_tops(job, SELECT_POSITIVE, x, length, s); break;
    case 12 + SELECT_NOT_NAN: stats_row_tops(job, SELECT_NOT_NAN, x, length, s); break;
    case 12 + SELECT_POSITIVE: stats_row_tops(job, SELECT_POSITIVE, x, length, s); break;
    case 16 + SELECT_NOT_NAN: stats_run_sums(job, SELECT_NOT_NAN, x, length, group, s); break;
    case 16 + SELECT_POSITIVE: stats_run_sums(job, SELECT_POSITIVE, x, length, group, s); break;
    case 16 + SELECT_ABOVE: stats_run_sums(job, SELECT_ABOVE, x, length, group, s); break;
    case 20 + SELECT_NOT_NAN: stats_row_sums(job, SELECT_NOT_NAN, x, length, group, s); break;
    case 20 + SELECT_POSITIVE: stats_row_sums(job, SELECT_POSITIVE, x, length, group, s); break;
    default: stats_row_sums(job, SELECT_ABOVE, x, length, group, s); break;
    }
}

static void stats_range(const void *context, int64_t begin, int64_t end) {
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

typedef struct {
    stats_job job;
    void *memory;
    int64_t *count; /* per group, pass 1's */
    float *positive;
} group_stats;

static int stats_open(group_stats *stats, const float *x, int64_t outer, int64_t groups, int64_t inner, int threads) {
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
    size_t bytes = (size_t)(slots + groups) * (sizeof(double) + sizeof(int64_t) + 2 * sizeof(int32_t));
    char *memory = malloc(bytes);
    if (!memory) return 0;
    stats_job *job = &stats->job;
    stats->memory = memory;
    job->x = x, job->n = n, job->groups = groups, job->inner = inner, job->pieces = pieces, job->piece = piece;
    job->sum = (double *)memory;
    job->count = (int64_t *)(job->sum + slots + groups);
    stats->count = job->count + slots;
    job->top = (int32_t *)(stats->count + groups);
    job->positive = job->top + slots;
    stats->positive = (float *)(job->positive + slots);
    return 1;
}

/* Pass 1's result per group (SELECT_NOT_NAN or SELECT_POSITIVE): unit[g] = the group's largest kept magnitude,
 * or 1 where it is 0; the largest itself into top[g] (each array: one float per group); the count and the
 * smallest positive kept magnitude kept in `stats` for stats_means. */
static void stats_tops(group_stats *stats, float *top, float *unit) {
    stats_job *job = &stats->job;
    for (int64_t g = 0; g < job->groups; g++) {
        int32_t high = 0, positive = NONE;
        int64_t count = 0;
        for (int64_t p = 0; p < job->pieces; p++) {
            int64_t s = p * job->groups + g;
            high = job->top[s] > high ? job->top[s] : high;
            positive = job->positive[s] < positive ? job->positive[s] : positive;
            count += job->count[s];
        }
        top[g] = lb_float((uint32_t)high);
        unit[g] = high > 0 ? top[g] : 1.0f;
        stats->count[g] = count;
        stats->positive[g] = positive == NONE ? INFINITY : lb_float((uint32_t)positive);
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

/* Pass 2's result: mean[g] = binary.masked_mean of the selection, from the groups' tops and units of pass 1
 * (for SELECT_ABOVE those of SELECT_NOT_NAN: the same wherever something is above delta). 0 when a mean is
 * not certain, or is 0 over a nonempty selection (eager paths then differ in the sign of zeros). */
static int stats_means(group_stats *stats, float *mean, int zero_ok) {
    stats_job *job = &stats->job;
    int select = job->select;
    int64_t depth = (job->n < job->piece ? job->n : job->piece) + job->pieces;
    for (int64_t g = 0; g < job->groups; g++) {
        double total = 0.0;
        int64_t count = select == SELECT_ABOVE ? 0 : stats->count[g];
        for (int64_t p = 0; p < job->pieces; p++) {
            total += job->sum[p * job->groups + g];
            count += select == SELECT_ABOVE ? job->count[p * job->groups + g] : 0;
        }
        /* a lower bound of the positive terms (division by unit > 0 is monotone): the smallest positive kept
         * magnitude's, or for SELECT_ABOVE delta's (every kept one is above it); 0 where it underflows, whose
         * quantum below is float32's smallest, of which every float is a multiple */
        float least = (select == SELECT_ABOVE ? job->delta[g] : stats->positive[g]) / job->unit[g];
        if (count == 0) mean[g] = 0.0f;
        else if (!certified_mean(total, count, depth, least, job->unit[g], &mean[g])) return 0;
        if (!zero_ok && count > 0 && mean[g] == 0.0f) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- whole formats ------------------------ */

/* A format as phases over one split of x (lb_parallel_phases): the groups' tops, one or two means, then the
 * element pass. Between phases, one thread reduces the pieces' slots and readies the next phase. */
enum { STEP_TOPS, STEP_MEAN, STEP_TWN_DELTA, STEP_ELEMENTS }; /* STEP_TWN_DELTA: a mean, then delta = 0.75 mean */

typedef struct {
    group_stats stats;
    element_job elements;
    int steps[4], selects[4], count;
    float *delta, *value, *top, *unit, *mean;
} sign_plan;

static void plan_start(sign_plan *plan, int phase) {
    stats_job *job = &plan->stats.job;
    int64_t slots = job->pieces * job->groups;
    int step = plan->steps[phase];
    if (step == STEP_ELEMENTS) return;
    job->select = plan->selects[phase], job->pass = step == STEP_TOPS ? 1 : 2;
    job->delta = plan->delta, job->unit = plan->unit;
    for (int64_t s = 0; s < slots; s++) {
        if (step == STEP_TOPS) job->top[s] = 0, job->positive[s] = NONE;
        job->sum[s] = 0.0, job->count[s] = 0;
    }
}

static void plan_phase(void *context, int64_t begin, int64_t end, int phase) {
    sign_plan *plan = context;
    if (plan->steps[phase] == STEP_ELEMENTS) lb_sign_element_range(&plan->elements, begin, end);
    else stats_range(&plan->stats.job, begin, end);
}

/* After phase `phase`: its result per group, then the next phase's start; 0 where the eager path must run. */
static int plan_between(void *context, int phase) {
    sign_plan *plan = context;
    int64_t groups = plan->stats.job.groups;
    switch (plan->steps[phase]) {
    case STEP_TOPS: stats_tops(&plan->stats, plan->top, plan->unit); break;
    case STEP_TWN_DELTA:
        if (!stats_means(&plan->stats, plan->mean, 1)) return 0;
        for (int64_t g = 0; g < groups; g++) plan->delta[g] = 0.75f * plan->mean[g];
        break;
    default: /* STEP_MEAN: the scale; a zero one over a nonempty selection goes eager (ternary) */
        if (!stats_means(&plan->stats, plan->value, plan->elements.kind != ELEMENT_TERNARY)) return 0;
    }
    plan_start(plan, phase + 1);
    return 1;
}

static void plan_add(sign_plan *plan, int step, int select) {
    plan->steps[plan->count] = step, plan->selects[plan->count] = select, plan->count++;
}

/* Runs the plan's steps (the element pass added last) over x; frees what it allocated. */
static int plan_run(sign_plan *plan, int64_t outer, int64_t groups, int64_t inner, int threads) {
    int64_t n = outer * groups * inner, grain = 16;
    int ok = 1;
    plan_add(plan, STEP_ELEMENTS, 0);
    if (plan->count > 1) {
        ok = stats_open(&plan->stats, plan->elements.x, outer, groups, inner, threads);
        grain = plan->stats.job.piece;
        plan->stats.job.groups = groups;
    }
    if (ok) {
        plan_start(plan, 0);
        ok = lb_parallel_phases(n, grain, threads, plan->count, plan_phase, plan_between, plan);
    }
    free(plan->stats.memory), free(plan->delta);
    return ok;
}

/* Per-group arrays delta, value, top, unit, mean and the element pass's job; 0 when out of memory. */
static int plan_open(sign_plan *plan, const float *x, float *out, int64_t groups, int64_t inner, int kind) {
    float *arrays = calloc(5 * (size_t)groups, sizeof(float));
    *plan = (sign_plan){.stats = {.memory = NULL}};
    if (!arrays) return 0;
    plan->delta = arrays, plan->value = arrays + groups, plan->top = arrays + 2 * groups;
    plan->unit = arrays + 3 * groups, plan->mean = arrays + 4 * groups;
    plan->elements = (element_job){x, out, groups, inner, kind, plan->delta, plan->value};
    return 1;
}

/* formats/ternary.py: delta = threshold (fixed) or 0.75 mean |x| per group (TWN); the value is the given
 * alpha[g], the TWN scale (scaled) or 1. Returns 1, or 0 where the eager path must run (see stats_means). */
int lb_ternary_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int fixed,
                   float threshold, int scaled, const float *alpha, int threads) {
    sign_plan plan;
    if (!plan_open(&plan, x, out, groups, inner, ELEMENT_TERNARY)) return 0;
    for (int64_t g = 0; g < groups; g++) {
        plan.delta[g] = fixed ? threshold : 0.0f;
        plan.value[g] = alpha ? alpha[g] : 1.0f;
    }
    if (!fixed || (scaled && !alpha)) plan_add(&plan, STEP_TOPS, SELECT_NOT_NAN);
    if (!fixed) plan_add(&plan, STEP_TWN_DELTA, SELECT_NOT_NAN);
    if (scaled && !alpha) plan_add(&plan, STEP_MEAN, SELECT_ABOVE);
    return plan_run(&plan, outer, groups, inner, threads);
}

/* formats/binary.py (deterministic): the value is the given alpha[g], mean |x| (bipolar) or the mean of the
 * finite positives (unipolar) per group when scaled, or 1. Returns 1, or 0 where the eager path must run. */
int lb_binary_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int bipolar,
                  int scaled, const float *alpha, int threads) {
    sign_plan plan;
    int select = bipolar ? SELECT_NOT_NAN : SELECT_POSITIVE;
    if (!plan_open(&plan, x, out, groups, inner, bipolar ? ELEMENT_BIPOLAR : ELEMENT_UNIPOLAR)) return 0;
    for (int64_t g = 0; g < groups; g++) plan.value[g] = alpha ? alpha[g] : 1.0f;
    if (scaled && !alpha) plan_add(&plan, STEP_TOPS, select), plan_add(&plan, STEP_MEAN, select);
    return plan_run(&plan, outer, groups, inner, threads);
}
