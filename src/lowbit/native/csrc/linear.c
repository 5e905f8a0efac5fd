/* Weight-only Linear layers in float32, without rebuilding the float weight: each weight row is widened once
 * into a float buffer and dotted with every input row (16-lane float32 partial sums). Not bit-identical to a
 * float32 matmul of the dequantized weight (another summation order, like any two float32 GEMMs; tests
 * compare within float32 rounding bounds).
 * - int8: out = (x . codes[n]) * scale[n] + bias[n] (per-channel scale applied to the sum);
 * - int4: two codes per byte (low nibble first), per group g: weight = (code - zero_point[n, g]) * scale[n, g],
 *   the reference's dequantized value exactly; out = x . weight[n] + bias[n]. */
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
    const float *x; const void *codes; const float *scale, *bias; float *out;
    int64_t rows, inner, columns;
    const uint8_t *zero_point; /* int4 only: [columns, inner / group]; NULL for int8 */
    int64_t group;
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
            float value = job->zero_point ? sums[r] : sums[r] * job->scale[n];
            job->out[(m + r) * job->columns + n] = job->bias ? value + job->bias[n] : value;
        }
    }
    for (; m < job->rows; m++) {
        const float *x0 = job->x + m * K;
        lb_v16 a0 = {0};
        for (int64_t k = 0; k < body; k += 16) a0 += load16(x0 + k) * load16(weight + k);
        float s0 = sum16(a0);
        for (int64_t k = body; k < K; k++) s0 += x0[k] * weight[k];
        float value = job->zero_point ? s0 : s0 * job->scale[n];
        job->out[m * job->columns + n] = job->bias ? value + job->bias[n] : value;
    }
}

static void widen_int4(const linear_job *job, float *weight, int64_t n) {
    const uint8_t *packed = (const uint8_t *)job->codes + n * (job->inner / 2);
    const int64_t groups = job->inner / job->group;
    for (int64_t g = 0; g < groups; g++) {
        const float zero = (float)job->zero_point[n * groups + g], scale = job->scale[n * groups + g];
        for (int64_t k = g * job->group; k < (g + 1) * job->group; k += 2) {
            uint8_t byte = packed[k / 2];
            weight[k] = ((float)(byte & 15) - zero) * scale;
            weight[k + 1] = ((float)(byte >> 4) - zero) * scale;
        }
    }
}

static void linear_range(const void *context, int64_t begin, int64_t end) {
    linear_job *job = (linear_job *)context;
    const int64_t unit = job->rows * job->inner;
    float *weight = malloc(sizeof(float) * (size_t)job->inner);
    if (!weight) { job->failed = 1; return; }
    for (int64_t n = begin / unit; n < end / unit; n++) {
        if (job->zero_point) widen_int4(job, weight, n);
        else {
            const int8_t *codes = (const int8_t *)job->codes + n * job->inner;
            for (int64_t k = 0; k < job->inner; k++) weight[k] = (float)codes[k];
        }
        dot_rows(job, weight, n);
    }
    free(weight);
}

/* Threads pay off from about 4M multiply-adds (starting one costs tens of microseconds). */
static int threads_for(int64_t rows, int64_t inner, int64_t columns, int threads) {
    return rows * inner * columns < ((int64_t)1 << 22) ? 1 : threads;
}

/* x [rows, inner] f32, codes [columns, inner] int8, scale [columns], bias [columns] or NULL -> out [rows, columns].
 * Returns 0, or -1 when a work buffer could not be allocated (out is then incomplete). */
int lb_int8_linear_f32(const float *x, const int8_t *codes, const float *scale, const float *bias, float *out,
                       int64_t rows, int64_t inner, int64_t columns, int threads) {
    linear_job job = {x, codes, scale, bias, out, rows, inner, columns, NULL, 0, 0};
    if (rows <= 0 || inner <= 0 || columns <= 0) return 0;
    lb_parallel(columns * rows * inner, rows * inner, threads_for(rows, inner, columns, threads), linear_range, &job);
    return job.failed ? -1 : 0;
}

/* x [rows, inner] f32, packed [columns, inner / 2] uint8, zero_point [columns, inner / group] uint8, scale
 * [columns, inner / group] f32, bias [columns] or NULL -> out [rows, columns]; group even, dividing inner. */
int lb_int4_linear_f32(const float *x, const uint8_t *packed, const uint8_t *zero_point, const float *scale,
                       const float *bias, float *out, int64_t rows, int64_t inner, int64_t columns, int64_t group,
                       int threads) {
    linear_job job = {x, packed, scale, bias, out, rows, inner, columns, zero_point, group, 0};
    if (rows <= 0 || inner <= 0 || columns <= 0 || group <= 0 || group % 2 || inner % group) return -1;
    lb_parallel(columns * rows * inner, rows * inner, threads_for(rows, inner, columns, threads), linear_range, &job);
    return job.failed ? -1 : 0;
}
