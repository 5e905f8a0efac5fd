/* Rounding onto a binary floating-point grid (formats/_float_grid.py: round_to_float_grid on its bit path).
 *
 * step = the exponent field of x lowered by M binades, clamped below at the smallest step (a normal float32,
 * which the caller checks); the value is round(x / step) * step, clamped to +-max. +-inf get a huge finite
 * step and saturate; NaN stays NaN. */
#include "common.h"
#include "stream.h"

typedef struct {
    const float *x;
    float *out;
    int32_t mantissa_shift, smallest_field;
    float max_value;
    int saturate, mode, streamed;
} float_grid_job;

static inline float grid_value(float v, const float_grid_job *job, int mode) {
    float rounded = lb_grid_round(v, job->mantissa_shift, job->smallest_field, mode);
    return job->saturate ? lb_clamp(rounded, job->max_value) : rounded;
}

#define GRID_LOOP(MODE) for (int64_t i = 0; i < n; i++) out[i] = grid_value(x[i], job, MODE)

static void float_grid_span(const void *context, const float *x, float *out, int64_t n) {
    const float_grid_job local = *(const float_grid_job *)context, *job = &local; /* no store to out changes it */
    LB_FOR_EACH_MODE(job->mode, GRID_LOOP)
}

static void float_grid_range(const void *context, int64_t begin, int64_t end) {
    const float_grid_job *job = context;
    lb_spans(job, job->x, job->out, job->streamed, begin, end, float_grid_span);
}

/* x, out: n contiguous float32; 1 <= mantissa_bits; min_exponent - mantissa_bits >= -126 (checked by the
 * caller). */
void lb_float_grid_f32(const float *x, float *out, int64_t n, int mantissa_bits, int min_exponent,
                       float max_value, int saturate, int mode, int half, int threads) {
    float_grid_job job = {x, out, mantissa_bits << 23, (min_exponent - mantissa_bits + 127) << 23,
                          max_value, saturate, mode, lb_storage(n, threads, half)};
    lb_parallel(n, 16, threads, float_grid_range, &job);
}
