/* The weight-only Linear job shared by linear.c (weights widened into a float row, any number of input rows)
 * and linear_few.c (one to four input rows: codes decoded in registers, no widened row). */
#ifndef LOWBIT_LINEAR_H
#define LOWBIT_LINEAR_H

#include "common.h"

/* What the codes mean (numbered as lowbit.native.interface.WEIGHT_KINDS). Each weight is the reference's float32 value bit for bit (one rounding for a product,
 * two for ggml's product-then-sum); the int8 channel scale alone is applied to the sum instead. */
enum lb_weight_kind {
    LB_INT8_CHANNEL = 0, /* int8 codes [N, K], one scale per output row (applied to the sum) */
    LB_INT4_ZERO = 1,    /* packed int4 [N, K / 2], per group: (code - zero_point) * scale (ggml's Q4_0: 8) */
    LB_INT4_MIN = 2,     /* packed int4, per group: code * scale + minimum (ggml's Q4_1) */
    LB_INT8_GROUP = 3,   /* int8 codes [N, K], per group: code * scale (ggml's Q8_0) */
};

typedef struct {
    const float *x; const void *codes; const float *scale, *bias; float *out;
    int64_t rows, inner, columns;
    const uint8_t *zero_point; /* LB_INT4_ZERO: [columns, inner / group] */
    const float *minimum;      /* LB_INT4_MIN: [columns, inner / group] */
    int64_t group;             /* elements per scale along a row (all but LB_INT8_CHANNEL) */
    int kind;
    volatile int failed;
} linear_job;

static inline int lb_linear_packed(const linear_job *job) {
    return job->kind == LB_INT4_ZERO || job->kind == LB_INT4_MIN;
}

/* Input rows the register kernels take: more rows amortise one widened row better (linear.c). */
#define LB_FEW_ROWS 4

/* Weight rows [first, last) against every input row in registers: 1 when done, 0 when this build or these
 * sizes have no register kernel (the caller widens instead). */
int lb_linear_few(const linear_job *job, int64_t first, int64_t last);

static inline void lb_linear_store(const linear_job *job, int64_t m, int64_t n, float sum) {
    float value = job->kind == LB_INT8_CHANNEL ? sum * job->scale[n] : sum;
    job->out[m * job->columns + n] = job->bias ? value + job->bias[n] : value;
}

#endif
