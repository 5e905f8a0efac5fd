/* The weight-only Linear job shared by linear.c (weights widened into a float row, any number of input rows)
 * and linear_few.c (one to four input rows: codes decoded in registers, no widened row). */
#ifndef LOWBIT_LINEAR_H
#define LOWBIT_LINEAR_H

#include "common.h"

typedef struct {
    const float *x; const void *codes; const float *scale, *bias; float *out;
    int64_t rows, inner, columns;
    const uint8_t *zero_point; /* int4 only: [columns, inner / group]; NULL for int8 */
    int64_t group;
    volatile int failed;
} linear_job;

/* Input rows the register kernels take: more rows amortise one widened row better (linear.c). */
#define LB_FEW_ROWS 4

/* Weight rows [first, last) against every input row in registers: 1 when done, 0 when this build or these
 * sizes have no register kernel (the caller widens instead). */
int lb_linear_few(const linear_job *job, int64_t first, int64_t last);

static inline void lb_linear_store(const linear_job *job, int64_t m, int64_t n, float sum) {
    float value = job->zero_point ? sum : sum * job->scale[n];
    job->out[m * job->columns + n] = job->bias ? value + job->bias[n] : value;
}

#endif
