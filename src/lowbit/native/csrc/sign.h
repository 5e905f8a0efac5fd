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

/* Which elements a mean takes: mean_abs the finite ones (NaN and inf left out), the unipolar scale the finite positives,
 * the ternary scale the finite magnitudes above the group's delta. */
enum { SELECT_FINITE, SELECT_POSITIVE, SELECT_ABOVE };

/* A window around an estimate of TWN's threshold (sign_window.c; per tensor, one group): the pass for mean |x|
 * also sums, per piece, the magnitudes above the window and keeps the ones inside it, so that the mean above
 * the real threshold needs no second pass over x when the threshold falls inside the window. */
typedef struct {
    int32_t low, high;    /* bits: magnitudes in (low, high] kept, above high summed; high 0: no window */
    int64_t capacity;     /* floats kept per piece at most */
    float *kept;          /* [pieces][capacity + slack] */
    int64_t *kept_count;  /* per piece (above capacity: it overflowed) */
    double *above_sum;    /* per piece */
    int64_t *above_count; /* per piece */
    int served;           /* the last pass took the mean above delta from the window */
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
    int64_t extra_depth; /* float64 additions a term may pass through beyond a plain pass's (window, tiles) */
    int storage;         /* stream.h's lb_storage: below 0, x holds halves (a pass reads widened tiles) */
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
/* Adds the run x[0..length) of group 0 with the job's selection into slot s (sign_window.c's kept values). */
void lb_stats_add_run(const stats_job *job, const float *x, int64_t length, int64_t s);

/* sign_window.c. Whether TWN per tensor over n elements on this build takes the window (x past the cache, a
 * vector compress on this ISA; tests lower the size). Open: a window around 0.75 times the mean |x| of a
 * sample of x, for an opened job of one group (0: no window, the job unchanged). Range: the pass for mean
 * |x| with the window over [begin, end) (an lb_parallel range function, whole pieces). Serve: with delta[0]
 * the threshold, readies the pass for the mean above it (select SELECT_ABOVE) to read the window's kept
 * values instead of x (window.served), where delta lies inside the window and no piece overflowed. Resolve:
 * that pass over [begin, end). Close: frees the window. */
int lb_window_wanted(int64_t n);
int lb_window_open(stats_job *job);
void lb_window_range(const void *context, int64_t begin, int64_t end);
int lb_window_serve(stats_job *job, const float *delta);
void lb_window_resolve(const void *context, int64_t begin, int64_t end);
void lb_window_close(stats_job *job);

#endif
