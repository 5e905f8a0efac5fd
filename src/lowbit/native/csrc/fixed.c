/* Fixed point (formats/integer.py Integer / Fixed), bit-identical to the eager torch code:
 * clamp(round(x * 2^f), q_min, q_max) * 2^-f. */
#include <float.h>
#include "common.h"
#include "stream.h"

typedef struct {
    const float *x;
    float *out;
    float multiplier, step, q_min, q_max;
    int keep_sign, mode, streamed;
} fixed_job;

static inline float fixed_value(float v, fixed_job job, int keep_sign, int mode) {
    float scaled = v * job.multiplier;
    if (keep_sign && scaled == 0.0f && v != 0.0f) scaled = lb_sign(v) * FLT_MIN; /* underflow keeps the side */
    return lb_clamp_range(lb_round(scaled, mode), job.q_min, job.q_max) * job.step;
}

/* the job's fields copied into locals (stores to out could otherwise alias them), keep_sign a constant */
#define FIXED_LOOP(MODE) \
    if (job.keep_sign) for (int64_t i = 0; i < n; i++) out[i] = fixed_value(x[i], job, 1, MODE); \
    else for (int64_t i = 0; i < n; i++) out[i] = fixed_value(x[i], job, 0, MODE)

static void fixed_span(const void *context, const float *x, float *out, int64_t n) {
    const fixed_job job = *(const fixed_job *)context;
    LB_FOR_EACH_MODE(job.mode, FIXED_LOOP)
}

static void fixed_range(const void *context, int64_t begin, int64_t end) {
    const fixed_job *job = context;
    lb_spans(job, job->x, job->out, job->streamed, begin, end, fixed_span);
}

/* The format's constants, prepared once per spec by lowbit.native.integer (a ctypes structure). */
typedef struct {
    float multiplier, step, q_min, q_max; /* 2^f, 2^-f, code range */
    int32_t keep_sign, mode;              /* keep_sign: f < 0 under a mode that is not a nearest one */
} lb_fixed_spec;

void lb_fixed_f32(const float *x, float *out, int64_t n, const lb_fixed_spec *spec, int half, int threads) {
    fixed_job job = {x, out, spec->multiplier, spec->step, spec->q_min, spec->q_max, spec->keep_sign, spec->mode,
                     lb_storage(n, threads, half)};
    lb_parallel(n, 64, threads, fixed_range, &job);
}

