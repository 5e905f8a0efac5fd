/* HQQ's half-quadratic fit of int4 group scales and integer zero points (lowbit.ops.hqq) with a tile of weight
 * rows in the vector lanes, over the transposed weight ([inputs, rows]) as gptq.c. Each group's steps run while
 * its weights sit in the first-level cache: five sums per step (squared residual, codes, squared codes, the
 * kept residual, codes times the kept residual), then the closed-form scale and zero point per row.
 *
 * The element arithmetic is ops/hqq.py's (this file keeps -ffp-contract=off): x * (1 / scale) + zero, round half
 * even, the pull of each residual capped at 1 / sqrt(|r| beta^2) (p = 0.5, the module's default; other p take the
 * torch code), beta growing by the same float64 factor. The sums run in input order, where torch picks its own,
 * so a step whose error ties another's to float32 rounding may keep either (tests/native/test_gptq_kernels.py). */
#include <float.h>
#include "int4_groups.h"

typedef struct {
    const float *columns; /* [inner, rows] */
    uint8_t *codes;       /* [rows, inner] */
    float *scale, *zero;  /* [inner / group, rows] */
    int64_t rows, inner, group;
    int iterations, scale_type;
    double beta_start, kappa;
} hqq_job;

/* The sums of one step over a group for each row (x: the group's first input's rows). */
static void step(const hqq_job *job, const float *x, int64_t count, const float *scale, const float *zero,
                 float cap_factor, float *error, float *code_sum, float *square_sum, float *kept_sum, float *cross) {
    for (int64_t n = 0; n < count; n++) error[n] = code_sum[n] = square_sum[n] = kept_sum[n] = cross[n] = 0.0f;
    for (int64_t c = 0; c < job->group; c++) {
        const float *row = x + c * job->rows;
        for (int64_t n = 0; n < count; n++) {
            const float shifted = row[n] * (1.0f / scale[n]) + zero[n];
            const float q = clamp_code(rintf(shifted)), r = shifted - q, magnitude = fabsf(r);
            const float cap = 1.0f / sqrtf(magnitude * cap_factor);
            const float kept = copysignf(cap < magnitude ? cap : magnitude, r);
            error[n] += r * r, code_sum[n] += q, square_sum[n] += q * q, kept_sum[n] += kept, cross[n] += q * kept;
        }
    }
}

/* The group's (scale, zero point) of lowest squared error met over the steps, per row. */
static void optimise(const hqq_job *job, const float *x, int64_t count, const float *low, const float *high,
                     float *best_scale, float *best_zero) {
    float scale[TILE], zero[TILE], best[TILE], error[TILE], code_sum[TILE], square_sum[TILE], kept_sum[TILE];
    float cross[TILE];
    const float count_f = (float)job->group;
    for (int64_t n = 0; n < count; n++) {
        float s = (high[n] - low[n]) / 15.0f;
        scale[n] = s < 1e-30f ? 1e-30f : s;
        zero[n] = clamp_code(rintf(-low[n] / scale[n]));
    }
    double beta = job->beta_start;
    for (int step_index = 0; step_index <= job->iterations; step_index++, beta *= job->kappa) {
        const float cap_factor = (float)(beta * beta); /* beta^(1 / (1 - p)) at p = 0.5 */
        step(job, x, count, scale, zero, cap_factor, error, code_sum, square_sum, kept_sum, cross);
        for (int64_t n = 0; n < count; n++) {
            float e = sqrtf(error[n]) * scale[n], squares = sqrtf(square_sum[n]); /* torch: norms, squared */
            e = e * e, squares = squares * squares;
            if (step_index == 0 || e < best[n]) best[n] = e, best_scale[n] = scale[n], best_zero[n] = zero[n];
            const float z = zero[n];
            const float spread = squares - 2.0f * z * code_sum[n] + count_f * (z * z);
            const float lift = (cross[n] - z * kept_sum[n]) / (spread > 1e-30f ? spread : 1e-30f);
            const float moved = (spread > 0.0f) & (lift > -1.0f) ? scale[n] * (1.0f + lift) : scale[n];
            const float centre = (code_sum[n] + kept_sum[n]) / count_f - z;
            const float next_zero = clamp_code(rintf(code_sum[n] / count_f - centre * scale[n] / moved));
            const float a = high[n] / (15.0f - next_zero + 0.5f), b = -low[n] / (next_zero + 0.5f);
            const float unclipped = a > b ? a : b;
            scale[n] = moved > unclipped ? moved : unclipped, zero[n] = next_zero;
        }
    }
}

/* Min-max rounding's or the fit's parameters, whichever gives the lower squared error (the fit's on a tie), and
 * the codes for them. */
static void settle(const hqq_job *job, const float *x, int64_t count, const float *low, const float *high,
                   const float *fit_scale, const float *fit_zero, float *scale, float *zero, uint8_t *codes) {
    float plain_scale[TILE], plain_zero[TILE], tuned_scale[TILE], plain_error[TILE], tuned_error[TILE];
    const float third = (float)(1.0 / 15);
    for (int64_t n = 0; n < count; n++) {
        float s = (high[n] - low[n]) * third;
        s = stored(s < FLT_MIN ? FLT_MIN : s, job->scale_type);
        plain_scale[n] = s <= 0.0f ? 1.0f : s;
        plain_zero[n] = clamp_code(-rintf(low[n] * (1.0f / plain_scale[n])));
        const float t = stored(fit_scale[n], job->scale_type);
        tuned_scale[n] = t < FLT_MIN ? FLT_MIN : t;
        plain_error[n] = tuned_error[n] = 0.0f;
    }
    for (int64_t c = 0; c < job->group; c++) {
        const float *row = x + c * job->rows;
        for (int64_t n = 0; n < count; n++) {
            const float p = (clamp_code(rintf(row[n] * (1.0f / plain_scale[n])) + plain_zero[n]) - plain_zero[n]) *
                            plain_scale[n] - row[n];
            const float t = (clamp_code(rintf(row[n] * (1.0f / tuned_scale[n])) + fit_zero[n]) - fit_zero[n]) *
                            tuned_scale[n] - row[n];
            plain_error[n] += p * p, tuned_error[n] += t * t;
        }
    }
    for (int64_t n = 0; n < count; n++) {
        const int tuned = tuned_error[n] <= plain_error[n];
        scale[n] = tuned ? tuned_scale[n] : plain_scale[n], zero[n] = tuned ? fit_zero[n] : plain_zero[n];
    }
    for (int64_t c = 0; c < job->group; c++) {
        const float *row = x + c * job->rows;
        for (int64_t n = 0; n < count; n++)
            codes[n * job->inner + c] = (uint8_t)clamp_code(rintf(row[n] * (1.0f / scale[n])) + zero[n]);
    }
}

static void hqq_range(const void *context, int64_t begin, int64_t end) {
    const hqq_job *job = context;
    float low[TILE], high[TILE], fit_scale[TILE], fit_zero[TILE];
    for (int64_t n0 = begin; n0 < end; n0 += TILE) {
        const int64_t count = end - n0 < TILE ? end - n0 : TILE;
        for (int64_t first = 0; first < job->inner; first += job->group) {
            const float *x = job->columns + first * job->rows + n0;
            for (int64_t n = 0; n < count; n++) low[n] = high[n] = x[n];
            for (int64_t c = 1; c < job->group; c++)
                for (int64_t n = 0; n < count; n++) {
                    const float v = x[c * job->rows + n];
                    low[n] = v < low[n] ? v : low[n], high[n] = v > high[n] ? v : high[n];
                }
            for (int64_t n = 0; n < count; n++) {
                low[n] = low[n] > 0.0f ? 0.0f : low[n];
                high[n] = high[n] < 0.0f ? 0.0f : high[n];
            }
            optimise(job, x, count, low, high, fit_scale, fit_zero);
            const int64_t at = (first / job->group) * job->rows + n0;
            settle(job, x, count, low, high, fit_scale, fit_zero, job->scale + at, job->zero + at,
                   job->codes + n0 * job->inner + first);
        }
    }
}

/* columns: the weight transposed [inner, rows] -> codes [rows, inner], scale and zero point [inner / group, rows]
 * (float32; the scale already rounded to its storage dtype). Returns 0, or -1 for sizes it does not take. */
int lb_hqq_fit_f32(const float *columns, uint8_t *codes, float *scale, float *zero, int64_t rows, int64_t inner,
                   int64_t group, int iterations, int scale_type, double beta_start, double kappa, int threads) {
    if (rows <= 0 || inner <= 0 || group <= 0 || inner % group || iterations < 0 || scale_type < 0 ||
        scale_type > SCALE_FLOAT16)
        return -1;
    hqq_job job = {columns, codes, scale, zero, rows, inner, group, iterations, scale_type, beta_start, kappa};
    lb_parallel_from(rows, TILE, threads, 2 * TILE, hqq_range, &job);
    return 0;
}
