/* Shared by the sign kernels: the per-group statistics (sign_stats.c) and the element pass (sign_elements.c)
 * that the whole formats (sign.c) are made of. */
#ifndef LOWBIT_SIGN_H
#define LOWBIT_SIGN_H

#include <stdint.h>

enum { ELEMENT_TERNARY, ELEMENT_BIPOLAR, ELEMENT_UNIPOLAR };

/* x viewed as [outer, groups, inner] (sign.c); delta and value hold one float per group: the ternary
 * threshold, and the scale (1 unscaled). */
typedef struct {
    const float *x;
    float *out;
    int64_t groups, inner;
    int kind, streamed; /* streamed: out written past the cache (stream.h) */
    const float *delta, *value;
} element_job;

/* The element pass over [begin, end) of an element_job (an lb_parallel range function). */
void lb_sign_element_range(const void *context, int64_t begin, int64_t end);

/* Which elements a mean takes: mean_abs every non-NaN (inf as 0), the unipolar scale the finite positives,
 * the ternary scale the finite magnitudes above the group's delta. */
enum { SELECT_NOT_NAN, SELECT_POSITIVE, SELECT_ABOVE };

/* One mean per group over the same view of x, in pieces (sign_stats.c). Per piece and group ("slot"): the
 * float64 sum and the count of the kept magnitudes. */
typedef struct {
    const float *x;
    int64_t n, groups, inner, pieces, piece;
    int select;
    const float *delta; /* per group (SELECT_ABOVE) */
    double *sum;        /* [pieces][groups] */
    int64_t *count;
    void *memory;
} stats_job;

/* Slots for x viewed as [outer, groups, inner] split among `threads`; 0 when out of memory (free job->memory). */
int lb_stats_open(stats_job *job, const float *x, int64_t outer, int64_t groups, int64_t inner, int threads);
/* Readies a pass of this selection (delta: one float per group, read by SELECT_ABOVE). */
void lb_stats_start(stats_job *job, int select, const float *delta);
/* The pass over elements [begin, end) (an lb_parallel range function; a thread's range holds whole pieces). */
void lb_stats_range(const void *context, int64_t begin, int64_t end);
/* After the pass: mean[g] = formats/binary.masked_mean of the selection, bit for bit. 0 where a mean is 0 over
 * a nonempty selection and zero_ok is 0: the caller then runs the eager path. */
int lb_stats_means(stats_job *job, float *mean, int zero_ok);

#endif
