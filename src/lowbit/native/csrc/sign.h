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

/* A window around an estimate of the TWN threshold (sign_window.c, one group): while the pass for mean |x|
 * runs, each piece also sums the magnitudes above the window and keeps those inside it, so that the mean
 * above the real threshold needs no second pass when the threshold falls inside. */
typedef struct {
    int32_t low, high;    /* bits: magnitudes in (low, high] kept, above high summed; high 0: no window */
    int64_t capacity;     /* floats kept per piece at most */
    float *kept;          /* [pieces][capacity] */
    int64_t *kept_count;  /* per piece (above capacity: it overflowed) */
    double *above_sum;    /* per piece */
    int64_t *above_count; /* per piece */
    void *memory;
} stats_window;

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
    stats_window window;
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
/* The pieces of lb_stats_means: a sum's float32 mean where its error bound (at most `depth` float64 additions
 * per term) decides the rounding, else 0; the depth of a pass's sums; group g's mean exactly (a serial pass
 * over x with the job's selection). */
int lb_certified_mean(double sum, int64_t count, int64_t depth, float *mean);
int64_t lb_stats_depth(const stats_job *job);
float lb_stats_exact_mean(const stats_job *job, int64_t g, int64_t count);

/* sign_window.c. The estimate: 0.75 times the mean |x| of about 4096 elements spread over x (0: none). Open:
 * a window around it for an opened job of one group (0: no window, the job unchanged). Sums: one piece's
 * run for the pass of mean |x| with the window (slot s). Mean: after that pass, with delta[0] the threshold,
 * the mean of the magnitudes above it, as lb_stats_means gives it: -1 where the window cannot tell (delta
 * outside, a piece overflowed: run the pass), 0 for a zero mean over a nonempty selection, 1 done. */
float lb_window_estimate(const float *x, int64_t n);
int lb_window_open(stats_job *job, float estimate);
void lb_window_sums(const stats_job *job, const float *x, int64_t length, int64_t s);
int lb_window_mean(stats_job *job, const float *delta, float *mean);
void lb_window_close(stats_job *job);

#endif
