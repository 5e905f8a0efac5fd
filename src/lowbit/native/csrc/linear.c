/* int8 weight-only Linear in float32: out = x @ (codes * scale)^T + bias, computed as (x . codes[n]) * scale[n]
 * in float32 with 16-lane partial sums (not bit-identical to a float32 matmul of the dequantized weight: a
 * different summation order, like any two float32 GEMMs; tests compare within float32 rounding bounds). */
#include <stdlib.h>
#include "common.h"

typedef float lb_v16 __attribute__((vector_size(64)));

static inline lb_v16 load16(const float *p) { lb_v16 v; memcpy(&v, p, sizeof v); return v; }
static inline float sum16(lb_v16 v) {
    float total = 0.0f;
    for (int j = 0; j < 16; j++) total += v[j];
    return total;
}

typedef struct {
    const float *x; const int8_t *codes; const float *scale, *bias; float *out;
    int64_t rows, inner, columns;
    volatile int failed;
} linear_job;

static void dot_rows(const linear_job *job, const float *weight, int64_t n) {
    const int64_t K = job->inner, body = K & ~(int64_t)15;
    int64_t m = 0;
    for (; m + 4 <= job->rows; m += 4) {
        const float *x0 = job->x + m * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
        lb_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t k = 0; k < body; k += 16) {
            lb_v16 w = load16(weight + k);
            a0 += load16(x0 + k) * w; a1 += load16(x1 + k) * w;
            a2 += load16(x2 + k) * w; a3 += load16(x3 + k) * w;
        }
        float s0 = sum16(a0), s1 = sum16(a1), s2 = sum16(a2), s3 = sum16(a3);
        for (int64_t k = body; k < K; k++) {
            s0 += x0[k] * weight[k]; s1 += x1[k] * weight[k]; s2 += x2[k] * weight[k]; s3 += x3[k] * weight[k];
        }
        float sums[4] = {s0, s1, s2, s3};
        for (int r = 0; r < 4; r++) {
            float value = sums[r] * job->scale[n];
            job->out[(m + r) * job->columns + n] = job->bias ? value + job->bias[n] : value;
        }
    }
    for (; m < job->rows; m++) {
        const float *x0 = job->x + m * K;
        lb_v16 a0 = {0};
        for (int64_t k = 0; k < body; k += 16) a0 += load16(x0 + k) * load16(weight + k);
        float s0 = sum16(a0);
        for (int64_t k = body; k < K; k++) s0 += x0[k] * weight[k];
        float value = s0 * job->scale[n];
        job->out[m * job->columns + n] = job->bias ? value + job->bias[n] : value;
    }
}

static void linear_range(const void *context, int64_t begin, int64_t end) {
    linear_job *job = (linear_job *)context;
    const int64_t unit = job->rows * job->inner;
    float *weight = malloc(sizeof(float) * (size_t)job->inner);
    if (!weight) { job->failed = 1; return; }
    for (int64_t n = begin / unit; n < end / unit; n++) {
        const int8_t *codes = job->codes + n * job->inner;
        for (int64_t k = 0; k < job->inner; k++) weight[k] = (float)codes[k];
        dot_rows(job, weight, n);
    }
    free(weight);
}

/* x [rows, inner] f32, codes [columns, inner] int8, scale [columns], bias [columns] or NULL -> out [rows, columns].
 * Returns 0, or -1 when a work buffer could not be allocated (out is then incomplete). */
int lb_int8_linear_f32(const float *x, const int8_t *codes, const float *scale, const float *bias, float *out,
                       int64_t rows, int64_t inner, int64_t columns, int threads) {
    linear_job job = {x, codes, scale, bias, out, rows, inner, columns, 0};
    if (rows <= 0 || inner <= 0 || columns <= 0) return 0;
    lb_parallel(columns * rows * inner, rows * inner, threads, linear_range, &job);
    return job.failed ? -1 : 0;
}
