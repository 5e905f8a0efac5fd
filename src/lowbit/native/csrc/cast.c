/* bfloat16 / float16 tensors around the float32 kernels (backend._native_result): the float32 result
 * narrowed back in one pass by casting.saturating_cast's rule (half.h); torch's isfinite / where / cast took
 * about 25 times a copy of the tensor for this. */
#include "common.h"
#include "half.h"

typedef struct {
    const float *x;
    uint16_t *out;
    int kind; /* half.h's CAST_* */
} cast_job;

static void narrow_range(const void *context, int64_t begin, int64_t end) {
    const cast_job *job = context;
    lb_narrow_halves(job->x + begin, job->out + begin, end - begin, job->kind);
}

/* half: LB_STORE_BFLOAT16 or LB_STORE_FLOAT16 (common.h) */
void lb_narrow_f32(const float *x, void *out, int64_t n, int half, int threads) {
    cast_job job = {x, out, half == LB_STORE_BFLOAT16 ? CAST_BFLOAT16 : CAST_FLOAT16};
    lb_parallel(n, 64, threads, narrow_range, &job);
}
