/* Sign formats (formats/binary.py, ternary.py) as whole kernels: the per-group means their scales and
 * thresholds come from (sign_stats.c), then the element pass (sign_elements.c), over one split of x.
 *
 * Groups: x is viewed as [outer, groups, inner] and a group is one index of the middle dimension (per
 * tensor: groups = 1; per channel on an axis: groups = that dimension's length). */
#include <stdlib.h>
#include "phases.h"
#include "sign.h"
#include "stream.h"

/* A format as phases over one split of x (lb_parallel_phases): one or two means, then the element pass.
 * Between phases, one thread reduces the pieces' slots and readies the next phase. */
enum { STEP_MEAN, STEP_TWN_DELTA, STEP_ELEMENTS }; /* STEP_TWN_DELTA: a mean, then delta = 0.75 mean */

typedef struct {
    stats_job stats;
    element_job elements;
    int steps[3], selects[3], count;
    int windowed; /* TWN per tensor: its two means may come from one pass over x (sign_window.c) */
    int storage;  /* stream.h's lb_storage: below 0, x and out hold halves (half_phase) */
    float *delta, *value, *mean;
} sign_plan;

static void plan_start(sign_plan *plan, int phase) {
    if (plan->steps[phase] != STEP_ELEMENTS) lb_stats_start(&plan->stats, plan->selects[phase], plan->delta);
}

/* A phase over halves. The element pass: stream.h's lb_half_tiles_range (tiles widened, the float32 pass run
 * on them, narrowed into out). A statistics pass: tiles of x widened into float32 within one piece (a piece's
 * slot takes the tile's sums), lb_stats_range run on a copy of the job that sees the tile; a statistic's terms
 * pass through one more addition a tile (extra_depth). With a group per column, statistics tiles hold whole
 * blocks of 8 rows where they fit (sign_stats.c sums 8 rows at a time; a row split between tiles goes element
 * by element). */
#define HALF_ROWS_TILE (4 * LB_TILE)
static void half_phase(const sign_plan *plan, int64_t begin, int64_t end, int phase) {
    if (plan->steps[phase] == STEP_ELEMENTS) {
        const element_job *elements = &plan->elements;
        int usable;
        lb_half_tiles tiles = lb_half_tiles_of(lb_sign_element_range, elements, sizeof *elements, &elements->x,
                                               &elements->out, &elements->streamed, 1, 1, 1, &usable);
        (void)usable; /* units of one element: always */
        lb_half_tiles_range(&tiles, begin, end);
        return;
    }
    float wide[HALF_ROWS_TILE] __attribute__((aligned(64)));
    stats_job stats = plan->stats;
    const uint16_t *x = (const uint16_t *)(const void *)plan->elements.x;
    int64_t groups = stats.groups, rows = groups > 1 && stats.inner == 1 ? 8 * groups : 0, tile = LB_TILE;
    if (rows) tile = rows <= HALF_ROWS_TILE ? HALF_ROWS_TILE / rows * rows : LB_TILE;
    for (int64_t from = begin, to; from < end; from = to) {
        to = end - from < tile ? end : from + tile;
        if (to > (from / stats.piece + 1) * stats.piece) to = (from / stats.piece + 1) * stats.piece;
        lb_widen_halves(x + from, wide, to - from, lb_half_kind(plan->storage));
        stats.x = (const float *)(uintptr_t)((uintptr_t)wide - (uintptr_t)from * sizeof(float)); /* sees the tile */
        lb_stats_range(&stats, from, to);
    }
}

static void plan_phase(void *context, int64_t begin, int64_t end, int phase) {
    sign_plan *plan = context;
    const stats_window *window = &plan->stats.window;
    if (plan->storage < 0) {
        half_phase(plan, begin, end, phase);
        return;
    }
    if (plan->steps[phase] == STEP_ELEMENTS) lb_sign_element_range(&plan->elements, begin, end);
    else if (window->high && phase == 0) lb_window_range(&plan->stats, begin, end); /* TWN's delta, with the window */
    else if (window->served) lb_window_resolve(&plan->stats, begin, end);            /* its scale from the window */
    else lb_stats_range(&plan->stats, begin, end);
}

/* After phase `phase`: its result per group, then the next phase's start; 0 where the eager path must run. */
static int plan_between(void *context, int phase) {
    sign_plan *plan = context;
    int64_t groups = plan->stats.groups;
    if (plan->steps[phase] == STEP_TWN_DELTA) {
        if (!lb_stats_means(&plan->stats, plan->mean, 1)) return 0;
        for (int64_t g = 0; g < groups; g++) plan->delta[g] = 0.75f * plan->mean[g];
        if (plan->stats.window.high) lb_window_serve(&plan->stats, plan->delta);
    } else if (!lb_stats_means(&plan->stats, plan->value, plan->elements.kind != ELEMENT_TERNARY)) {
        return 0; /* STEP_MEAN: the scale; a zero one over a nonempty selection goes eager (ternary) */
    }
    plan_start(plan, phase + 1);
    return 1;
}

static void plan_add(sign_plan *plan, int step, int select) {
    plan->steps[plan->count] = step, plan->selects[plan->count] = select, plan->count++;
}

/* Runs the plan's steps (the element pass added last) over x; frees what it allocated. */
static int plan_run(sign_plan *plan, int64_t outer, int64_t groups, int64_t inner, int half, int threads) {
    int64_t n = outer * groups * inner, grain = 16;
    int ok = 1;
    plan->storage = lb_storage(n, threads, half);
    plan->elements.streamed = plan->storage;
    plan_add(plan, STEP_ELEMENTS, 0);
    if (plan->count > 1) {
        ok = lb_stats_open(&plan->stats, plan->elements.x, outer, groups, inner, threads);
        grain = plan->stats.piece;
        plan->stats.storage = plan->storage;
        if (plan->storage < 0) plan->stats.extra_depth = plan->stats.piece / LB_TILE + 1; /* half_phase's tiles */
        else if (ok && plan->windowed && lb_window_wanted(n)) lb_window_open(&plan->stats);
    }
    if (ok) {
        plan_start(plan, 0);
        ok = lb_parallel_phases(n, grain, threads, plan->count, plan_phase, plan_between, plan);
    }
    lb_window_close(&plan->stats);
    free(plan->stats.memory), free(plan->delta);
    return ok;
}

/* Per-group arrays delta, value, mean and the element pass's job; 0 when out of memory. */
static int plan_open(sign_plan *plan, const float *x, float *out, int64_t groups, int64_t inner, int kind) {
    float *arrays = calloc(3 * (size_t)groups, sizeof(float));
    *plan = (sign_plan){.stats = {.memory = NULL}};
    if (!arrays) return 0;
    plan->delta = arrays, plan->value = arrays + groups, plan->mean = arrays + 2 * groups;
    plan->elements = (element_job){x, out, groups, inner, kind, 0, plan->delta, plan->value};
    return 1;
}

/* formats/ternary.py: delta = threshold (fixed) or 0.75 mean |x| per group (TWN); the value is the given
 * alpha[g], the TWN scale (scaled) or 1. Returns 1, or 0 where memory is short or a scale is 0 over a nonempty
 * selection (see lb_stats_means): the caller runs the eager path. */
int lb_ternary_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int fixed,
                   float threshold, int scaled, const float *alpha, int half, int threads) {
    sign_plan plan;
    if (!plan_open(&plan, x, out, groups, inner, ELEMENT_TERNARY)) return 0;
    for (int64_t g = 0; g < groups; g++) {
        plan.delta[g] = fixed ? threshold : 0.0f;
        plan.value[g] = alpha ? alpha[g] : 1.0f;
    }
    if (!fixed) plan_add(&plan, STEP_TWN_DELTA, SELECT_FINITE);
    if (scaled && !alpha) plan_add(&plan, STEP_MEAN, SELECT_ABOVE);
    plan.windowed = !fixed && scaled && !alpha && groups == 1;
    return plan_run(&plan, outer, groups, inner, half, threads);
}

/* formats/binary.py (deterministic): the value is the given alpha[g], mean |x| (bipolar) or the mean of the
 * finite positives (unipolar) per group when scaled, or 1. Returns 1, or 0 where memory is short. */
int lb_binary_f32(const float *x, float *out, int64_t outer, int64_t groups, int64_t inner, int bipolar,
                  int scaled, const float *alpha, int half, int threads) {
    sign_plan plan;
    int select = bipolar ? SELECT_FINITE : SELECT_POSITIVE;
    if (!plan_open(&plan, x, out, groups, inner, bipolar ? ELEMENT_BIPOLAR : ELEMENT_UNIPOLAR)) return 0;
    for (int64_t g = 0; g < groups; g++) plan.value[g] = alpha ? alpha[g] : 1.0f;
    if (scaled && !alpha) plan_add(&plan, STEP_MEAN, select);
    return plan_run(&plan, outer, groups, inner, half, threads);
}
