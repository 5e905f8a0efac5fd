/* binary_residual (formats/binary.py): the nearest of a few values against their midpoints, a vector of lanes
 * at a time (lanes.h). */
#include "lanes.h"
#include "stream.h"

#define RESIDUAL_MAX_POINTS 32

typedef struct {
    const float *x;
    float *out;
    int points, streamed;
    float thresholds[RESIDUAL_MAX_POINTS], values[RESIDUAL_MAX_POINTS + 1];
} residual_job;

/* The nearest value: values[the number of exact midpoints <= x]. A rounded midpoint m whose exact one lies
 * above it counts only when x > m, i.e. x >= the next float32 above m (the thresholds below). The exact
 * midpoints ascend, so x >= threshold p holds for p = 0 .. index - 1 and fails after: picking values[p + 1]
 * wherever it holds, point by point, leaves values[index] (selects on whole vectors, no table lookup). NaN
 * passes no threshold, and is put back at the end. */
ALWAYS_INLINE void residual_lanes(const residual_job *job, int points, const float *x, float *out, int64_t n) {
    lanes_f thresholds[RESIDUAL_MAX_POINTS], values[RESIDUAL_MAX_POINTS + 1];
    for (int p = 0; p < points; p++) thresholds[p] = lanes_float(job->thresholds[p]);
    for (int p = 0; p <= points; p++) values[p] = lanes_float(job->values[p]);
    for (int64_t i = 0; i < n; i += LANES) {
        lanes_f v, result = values[0];
        int64_t length = n - i < LANES ? n - i : LANES;
        if (length == LANES) memcpy(&v, x + i, sizeof v);
        else v = (lanes_f)lanes_load_tail(x + i, length);
        for (int p = 0; p < points; p++) {
            lanes_i past = v >= thresholds[p];
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

/* points <= RESIDUAL_MAX_POINTS midpoints (ascending), points + 1 values. */
void lb_residual_f32(const float *x, float *out, int64_t n, int points, const float *midpoints,
                     const int *above, const float *values, int half, int threads) {
    residual_job job;
    job.x = x, job.out = out, job.points = points, job.streamed = lb_storage(n, threads, half);
    for (int p = 0; p < points; p++) { /* the next float32 up where the exact midpoint lies above (m finite) */
        uint32_t bits = lb_bits(midpoints[p]);
        if (above[p]) bits = bits == 0x80000000u ? 1u : (bits >> 31 ? bits - 1 : bits + 1);
        job.thresholds[p] = lb_float(bits);
    }
    for (int p = 0; p <= points; p++) job.values[p] = values[p];
    lb_parallel(n, 16, threads, residual_range, &job);
}
