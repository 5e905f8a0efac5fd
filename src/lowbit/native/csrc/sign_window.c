/* TWN's two statistics in one pass over x (formats/ternary.py, per tensor): delta = 0.75 mean |x|, then the
 * scale is the mean of the finite magnitudes above delta, for which the plain kernel reads x a second time.
 *
 * A strided sample of about 4096 elements estimates delta first. The pass for mean |x| then also sums, per
 * piece, the magnitudes above a window of +-4 % around the estimate and keeps the ones inside it (about 3 % of
 * a normal tensor; room for an eighth of each piece). Once delta is known and lies inside the window, every
 * magnitude above the window is above delta and every one below it is not: the mean above delta is the sums
 * above the window plus the kept magnitudes above delta, the same set, certified or computed exactly as
 * lb_stats_means does. Where delta falls outside the window (a sample unlike the tensor) or a piece kept more
 * than it has room for, the second pass reads x as before: the window changes the time, never the result.
 *
 * Worth it where x is past the cache and the machine has AVX-512's compress: the pass it saves reads x from
 * memory, while the window's sums and the compress of the kept lanes cost compute (Zen 4, benchmarks/RESULTS.md:
 * 4096 x 4096 on two threads 1.48-1.56 -> 1.31 x clone; within the cache 3-11 % slower; an AVX2 build no faster
 * at 4096 x 4096 and 1.5x slower in the cache). Every vector goes through the compress, so the loop has no
 * branch on the data: a branch per vector mispredicts on a third of them and starves the memory stream. */
#include <stdlib.h>
#include "sign_sums.h"
#include "stream.h"

#define WINDOW_SAMPLES 4096
#define WINDOW_WIDTH 0.04f
#define WINDOW_SHARE 8          /* a piece keeps at most 1/WINDOW_SHARE of its elements */
#define WINDOW_SLACK (2 * LANES) /* a piece's buffer past its capacity: a whole vector stored at the end */

static volatile int64_t lb_window_from_override = 0;
static volatile int64_t lb_window_served_total = 0;

/* Tests: the window from this many elements on, on any build (0: the library's rule). */
void lb_set_window_from(int64_t elements) { lb_window_from_override = elements > 0 ? elements : 0; }

/* Tests: how many means the window has given (it really runs). */
int64_t lb_window_served_count(void) { return __atomic_load_n(&lb_window_served_total, __ATOMIC_RELAXED); }

int lb_window_wanted(int64_t n) {
    if (lb_window_from_override) return n >= lb_window_from_override;
#if defined(__AVX512F__)
    return n >= lb_stream_from() / 4;
#else
    return 0; /* measured on an AVX2 build (Zen 4): no faster past the cache, 1.5x slower within it */
#endif
}

static float window_estimate(const float *x, int64_t n) {
    int64_t stride = n / WINDOW_SAMPLES > 1 ? n / WINDOW_SAMPLES : 1, count = 0;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
        uint32_t magnitude = lb_bits(x[i]) & 0x7fffffffu;
        if (magnitude >= 0x7f800000u) continue; /* NaN and inf: left out, as in mean |x| */
        count++;
        sum += (double)lb_float(magnitude);
    }
    return count ? (float)(0.75 * sum / (double)count) : 0.0f;
}

int lb_window_open(stats_job *job) {
    float estimate = window_estimate(job->x, job->n);
    float low = estimate * (1.0f - WINDOW_WIDTH), high = estimate * (1.0f + WINDOW_WIDTH);
    if (job->groups != 1 || !(low > 0.0f) || !(high <= 3.0e38f)) return 0;
    int64_t capacity = job->piece / WINDOW_SHARE, pieces = job->pieces;
    size_t words = 3 * (size_t)pieces, floats = (size_t)(pieces * (capacity + WINDOW_SLACK));
    char *memory = malloc(words * sizeof(int64_t) + floats * sizeof(float));
    if (!memory) return 0;
    stats_window *w = &job->window;
    w->memory = memory, w->capacity = capacity, w->served = 0;
    w->above_sum = (double *)memory, w->above_count = (int64_t *)(w->above_sum + pieces);
    w->kept_count = w->above_count + pieces, w->kept = (float *)(w->kept_count + pieces);
    w->low = (int32_t)lb_bits(low), w->high = (int32_t)lb_bits(high);
    /* a term of mean |x| takes one more addition (the sums below and above the window), one of the mean
     * above delta at most one more than a plain pass's (the window's sum, the kept ones', the slot) */
    job->extra_depth = 2;
    return 1;
}

void lb_window_close(stats_job *job) {
    free(job->window.memory);
    job->window = (stats_window){0};
    job->extra_depth = 0;
}

#if defined(__AVX512F__)
/* Per piece: float64 sums of the finite magnitudes at or below the window's top and of those above it, each
 * as four chains (two per half of a vector, two vectors an iteration), and the counts. */
typedef struct {
    __m512d below[4], above[4];
    int64_t counted, above_count, filled;
} window_sums;

ALWAYS_INLINE void window_vector(window_sums *a, lanes_i raw, const stats_window *w, float *kept, int second) {
    const __m512i infinity = _mm512_set1_epi32(0x7f800000);
    __m512i magnitude = _mm512_and_si512((__m512i)raw, _mm512_set1_epi32(0x7fffffff));
    __mmask16 finite = _mm512_cmplt_epi32_mask(magnitude, infinity), counted = finite;
    __mmask16 up = _mm512_mask_cmpgt_epi32_mask(finite, magnitude, _mm512_set1_epi32(w->high)), down = finite & ~up;
    __mmask16 inside = _mm512_mask_cmpgt_epi32_mask(down, magnitude, _mm512_set1_epi32(w->low));
    __m512 v = _mm512_castsi512_ps(magnitude);
    __m512d v0 = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d v1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m512d *below = a->below + 2 * second, *above = a->above + 2 * second;
    below[0] = _mm512_mask_add_pd(below[0], (__mmask8)down, below[0], v0);
    below[1] = _mm512_mask_add_pd(below[1], (__mmask8)(down >> 8), below[1], v1);
    above[0] = _mm512_mask_add_pd(above[0], (__mmask8)up, above[0], v0);
    above[1] = _mm512_mask_add_pd(above[1], (__mmask8)(up >> 8), above[1], v1);
    a->counted += __builtin_popcount(counted), a->above_count += __builtin_popcount(up);
    int64_t at = a->filled < w->capacity ? a->filled : w->capacity;
    _mm512_storeu_si512(kept + at, _mm512_maskz_compress_epi32(inside, magnitude));
    a->filled += __builtin_popcount(inside);
}

static inline double chains_total(const __m512d *chain) {
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(chain[0], chain[1]), _mm512_add_pd(chain[2], chain[3])));
}
#define WINDOW_COUNT(a, lanes) ((void)(lanes), (a)->counted)
#define WINDOW_ABOVE(a) ((a)->above_count)
#else
typedef struct {
    half_d below[4], above[4];
    lanes_i not_finite, above_count;
    int64_t filled;
} window_sums;

/* The lanes of magnitude where inside is set stored first at kept (every lane stored); their count. The
 * generic code runs only where tests ask for the window (lb_window_wanted). */
ALWAYS_INLINE int64_t keep_lanes(float *kept, lanes_i magnitude, lanes_i inside) {
    int64_t count = 0;
    for (int k = 0; k < LANES; k++) { /* each lane stored, the place advanced by the ones kept */
        memcpy(kept + count, &magnitude[k], sizeof(float));
        count += inside[k] & 1;
    }
    return count;
}

ALWAYS_INLINE void window_vector(window_sums *a, lanes_i raw, const stats_window *w, float *kept, int second) {
    lanes_i magnitude = raw & 0x7fffffff, finite = magnitude < 0x7f800000;
    lanes_i up = finite & (magnitude > w->high), down = finite & ~up, inside = down & (magnitude > w->low);
    lanes_f below = (lanes_f)(magnitude & down), above = (lanes_f)(magnitude & up);
    a->below[2 * second] += lanes_low(below), a->below[2 * second + 1] += lanes_high(below);
    a->above[2 * second] += lanes_low(above), a->above[2 * second + 1] += lanes_high(above);
    a->not_finite -= ~finite, a->above_count -= up; /* compares give -1 */
    int64_t at = a->filled < w->capacity ? a->filled : w->capacity;
    a->filled += keep_lanes(kept + at, magnitude, inside);
}

static inline double chains_total(const half_d *chain) {
    half_d total = (chain[0] + chain[1]) + (chain[2] + chain[3]);
    double whole = 0.0;
    for (int k = 0; k < LANES / 2; k++) whole += total[k];
    return whole;
}
#define WINDOW_COUNT(a, lanes) ((lanes) - lanes_sum_of((a)->not_finite))
#define WINDOW_ABOVE(a) (lanes_sum_of((a)->above_count))
#endif

/* Piece s's run x[0..length): the sum and count of mean |x| into its slot, the window's parts beside it. */
static void window_piece(const stats_job *job, const float *x, int64_t length, int64_t s) {
    const stats_window *w = &job->window;
    float *kept = w->kept + s * (w->capacity + WINDOW_SLACK);
    window_sums a;
    memset(&a, 0, sizeof a);
    int64_t i = 0;
    for (; i + 2 * LANES <= length; i += 2 * LANES) {
        window_vector(&a, lanes_load(x + i), w, kept, 0);
        window_vector(&a, lanes_load(x + i + LANES), w, kept, 1);
    }
    for (; i < length; i += LANES) /* the last partial vector padded with NaN: in no selection */
        window_vector(&a, length - i >= LANES ? lanes_load(x + i) : lanes_load_tail(x + i, length - i), w, kept, 0);
    int64_t lanes = (length + LANES - 1) / LANES * LANES;
    double above = chains_total(a.above);
    job->sum[s] += chains_total(a.below) + above, job->count[s] += WINDOW_COUNT(&a, lanes);
    w->above_sum[s] = above, w->above_count[s] = WINDOW_ABOVE(&a), w->kept_count[s] = a.filled;
}

void lb_window_range(const void *context, int64_t begin, int64_t end) {
    const stats_job *job = context;
    for (int64_t start = begin; start < end; start += job->piece)
        window_piece(job, job->x + start, (start + job->piece < end ? start + job->piece : end) - start, start / job->piece);
}

int lb_window_serve(stats_job *job, const float *delta) {
    stats_window *w = &job->window;
    int32_t d = (int32_t)lb_bits(delta[0]);
    w->served = 0;
    if (!w->high || d < w->low || d > w->high) return 0;
    for (int64_t p = 0; p < job->pieces; p++)
        if (w->kept_count[p] > w->capacity) return 0;
    w->served = 1;
    __atomic_fetch_add(&lb_window_served_total, 1, __ATOMIC_RELAXED);
    return 1;
}

void lb_window_resolve(const void *context, int64_t begin, int64_t end) {
    const stats_job *job = context;
    const stats_window *w = &job->window;
    for (int64_t s = begin / job->piece; s * job->piece < end; s++) {
        lb_stats_add_run(job, w->kept + s * (w->capacity + WINDOW_SLACK), w->kept_count[s], s);
        job->sum[s] += w->above_sum[s], job->count[s] += w->above_count[s];
    }
}
