/* binary_residual (formats/binary.py): the nearest of a few values against their midpoints, a vector of lanes
 * at a time (lanes.h). */
#include "lanes.h"
#include "stream.h"

#define RESIDUAL_MAX_POINTS 32

typedef struct {
    const float *x;
    float *out;
    int points, streamed;
    int32_t keys[RESIDUAL_MAX_POINTS];
    float values[RESIDUAL_MAX_POINTS + 1];
} residual_job;

/* A float's bits as an integer that orders like the float, with -0 just below +0 (NaN: anywhere). */
static int32_t order_key(float value) {
    int32_t bits = (int32_t)lb_bits(value);
    return bits ^ ((bits >> 31) & 0x7fffffff);
}

/* The nearest value: values[the number of thresholds x has reached], a threshold being the smallest float32
 * that goes to the upper neighbour (formats/binary.py computes them exactly: nearest to the exact grid, ties
 * away from zero, a zero midpoint decided by the sign bit). x and the thresholds compare as order keys, so -0
 * stays below a +0 threshold. The thresholds ascend, so x reaches p = 0 .. index - 1 and no more: picking
 * values[p + 1] wherever it does, point by point, leaves values[index] (selects on whole vectors, no table
 * lookup). NaN is put back at the end. */
ALWAYS_INLINE void residual_lanes(const residual_job *job, int points, const float *x, float *out, int64_t n) {
    lanes_i keys[RESIDUAL_MAX_POINTS];
    lanes_f values[RESIDUAL_MAX_POINTS + 1];
    for (int p = 0; p < points; p++) keys[p] = (lanes_i){0} + job->keys[p];
    for (int p = 0; p <= points; p++) values[p] = lanes_float(job->values[p]);
    for (int64_t i = 0; i < n; i += LANES) {
        lanes_f v, result = values[0];
        int64_t length = n - i < LANES ? n - i : LANES;
        if (length == LANES) memcpy(&v, x + i, sizeof v);
        else v = (lanes_f)lanes_load_tail(x + i, length);
        lanes_i bits = (lanes_i)v, key = bits ^ ((bits >> 31) & 0x7fffffff);
        for (int p = 0; p < points; p++) {
            lanes_i past = key >= keys[p];
            result = (lanes_f)(((lanes_i)values[p + 1] & past) | ((lanes_i)result & ~past));
        }
        lanes_i nan = v != v;
        result = (lanes_f)(((lanes_i)v & nan) | ((lanes_i)result & ~nan));
        if (length == LANES) memcpy(out + i, &result, sizeof result);
        else memcpy(out + i, &result, (size_t)length * sizeof(float));
    }
}

static void residual_span(const void *context, const float *x, float *out, int64_t n) {
    const residual_job *job = context;
    switch (job->points) { /* the common grids with a constant count (levels 1 and 2: 1 and 3 points) */
    case 1: residual_lanes(job, 1, x, out, n); break;
    case 3: residual_lanes(job, 3, x, out, n); break;
    default: residual_lanes(job, job->points, x, out, n); break;
    }
}

static void residual_range(const void *context, int64_t begin, int64_t end) {
    const residual_job *job = context;
    lb_spans(job, job->x, job->out, job->streamed, begin, end, residual_span);
}

/* points <= RESIDUAL_MAX_POINTS thresholds (ascending), points + 1 values. */
void lb_residual_f32(const float *x, float *out, int64_t n, int points, const float *thresholds,
                     const float *values, int half, int threads) {
    residual_job job;
    job.x = x, job.out = out, job.points = points, job.streamed = lb_storage(n, threads, half);
    for (int p = 0; p < points; p++) job.keys[p] = order_key(thresholds[p]);
    for (int p = 0; p <= points; p++) job.values[p] = values[p];
    lb_parallel(n, 16, threads, residual_range, &job);
}
