/* TWN's two statistics in one pass over x (formats/ternary.py, per tensor): delta = 0.75 mean |x|, then the
 * scale is the mean of the finite magnitudes above delta, which a plain kernel reads x a second time for.
 *
 * Before the first pass, a strided sample of about 4096 elements estimates delta; the pass for mean |x| then
 * also sums, per piece, the magnitudes above a window of +-8 % around the estimate and keeps the ones inside
 * it (a few percent of x for any smooth distribution; at most an eighth of each piece). Once the real delta is
 * known, every magnitude above the window is above delta and every one below the window is not, so the
 * selection is the sums above the window plus the kept magnitudes above delta: the same set, and the same
 * exact mean once rounded (lb_certified_mean with the deeper sum, else the serial exact pass). Where delta
 * falls outside the window (a sample unlike the tensor) or a piece keeps more than it has room for, the
 * kernel runs the second pass as before: the window changes the time, never the result. */
#include <stdlib.h>
#include "sign_sums.h"

#define WINDOW_SAMPLES 4096
#define WINDOW_WIDTH 0.08f
#define WINDOW_SHARE 8 /* a piece keeps at most 1/WINDOW_SHARE of its elements */

static int64_t lb_window_served = 0; /* means the window gave (tests: it is really used) */

int64_t lb_window_count(void) { return __atomic_load_n(&lb_window_served, __ATOMIC_RELAXED); }

float lb_window_estimate(const float *x, int64_t n) {
    int64_t stride = n / WINDOW_SAMPLES > 1 ? n / WINDOW_SAMPLES : 1, count = 0;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
        uint32_t magnitude = lb_bits(x[i]) & 0x7fffffffu;
        if (magnitude > 0x7f800000u) continue; /* NaN: not counted; inf counts as 0, as in mean |x| */
        count++;
        if (magnitude < 0x7f800000u) sum += (double)lb_float(magnitude);
    }
    return count ? (float)(0.75 * sum / (double)count) : 0.0f;
}

int lb_window_open(stats_job *job, float estimate) {
    float low = estimate * (1.0f - WINDOW_WIDTH), high = estimate * (1.0f + WINDOW_WIDTH);
    if (job->groups != 1 || !(low > 0.0f) || !(high <= 3.0e38f)) return 0;
    int64_t capacity = job->piece / WINDOW_SHARE + LANES, pieces = job->pieces;
    size_t floats = (size_t)(pieces * capacity), words = 3 * (size_t)pieces;
    char *memory = malloc(floats * sizeof(float) + words * sizeof(int64_t));
    if (!memory) return 0;
    stats_window *w = &job->window;
    w->memory = memory, w->capacity = capacity;
    w->above_sum = (double *)memory, w->above_count = (int64_t *)(w->above_sum + pieces);
    w->kept_count = w->above_count + pieces, w->kept = (float *)(w->kept_count + pieces);
    w->low = (int32_t)lb_bits(low), w->high = (int32_t)lb_bits(high);
    return 1;
}

void lb_window_close(stats_job *job) {
    free(job->window.memory);
    job->window = (stats_window){0};
}

/* The lanes of `bits` whose magnitude lies in (low, high], appended to kept while there is room; *filled
 * counts them all (past capacity: the piece overflowed, and its kept values are not used). */
ALWAYS_INLINE void keep_inside(const lanes_i *bits, lanes_i low, lanes_i high, float *kept, int64_t capacity,
                               int64_t *filled) {
    lanes_i magnitude = *bits & 0x7fffffff;
#if defined(__AVX512F__)
    __mmask16 inside = _mm512_mask_cmple_epi32_mask(_mm512_cmpgt_epi32_mask((__m512i)magnitude, (__m512i)low),
                                                    (__m512i)magnitude, (__m512i)high);
    if (!inside) return;
    int64_t count = __builtin_popcount(inside);
    if (*filled + count <= capacity) _mm512_mask_compressstoreu_epi32(kept + *filled, inside, (__m512i)magnitude);
    *filled += count;
#else
    lanes_i inside = (magnitude > low) & (magnitude <= high);
    if (lanes_min_of(inside) == 0) return; /* no lane inside (compares give 0 / -1) */
    for (int k = 0; k < LANES; k++)
        if (inside[k]) {
            if (*filled < capacity) kept[*filled] = lb_float((uint32_t)magnitude[k]);
            ++*filled;
        }
#endif
}

/* The run x[0..length) of piece s: the sums of mean |x| (as run_sums_of), the magnitudes above the window,
 * the ones inside it. */
void lb_window_sums(const stats_job *job, const float *x, int64_t length, int64_t s) {
    const stats_window *w = &job->window;
    selection every = selection_of(SELECT_NOT_NAN, 0.0f), above = selection_of(SELECT_ABOVE, lb_float((uint32_t)w->high));
    lanes_i low = lanes_of(w->low), high = lanes_of(w->high);
    float *kept = w->kept + s * w->capacity;
    int64_t filled = 0, i = 0;
    run_sums all, upper;
    memset(&all, 0, sizeof all), memset(&upper, 0, sizeof upper);
    for (; i + 2 * LANES <= length; i += 2 * LANES) {
        lanes_i raw0 = lanes_load(x + i), raw1 = lanes_load(x + i + LANES);
        sums_vector(&all, &raw0, SELECT_NOT_NAN, &every, 0), sums_vector(&all, &raw1, SELECT_NOT_NAN, &every, 1);
        sums_vector(&upper, &raw0, SELECT_ABOVE, &above, 0), sums_vector(&upper, &raw1, SELECT_ABOVE, &above, 1);
        keep_inside(&raw0, low, high, kept, w->capacity, &filled);
        keep_inside(&raw1, low, high, kept, w->capacity, &filled);
    }
    for (; i < length; i += LANES) { /* the last partial vector padded with NaN: in no selection */
        lanes_i raw = length - i >= LANES ? lanes_load(x + i) : lanes_load_tail(x + i, length - i);
        sums_vector(&all, &raw, SELECT_NOT_NAN, &every, 0), sums_vector(&upper, &raw, SELECT_ABOVE, &above, 0);
        keep_inside(&raw, low, high, kept, w->capacity, &filled);
    }
    int64_t lanes = (length + LANES - 1) / LANES * LANES;
    job->sum[s] += sums_total(&all), job->count[s] += sums_count(&all, SELECT_NOT_NAN, lanes);
    w->above_sum[s] = sums_total(&upper), w->above_count[s] = sums_count(&upper, SELECT_ABOVE, lanes);
    w->kept_count[s] = filled;
}

int lb_window_mean(stats_job *job, const float *delta, float *mean) {
    const stats_window *w = &job->window;
    int32_t d = (int32_t)lb_bits(delta[0]);
    if (!w->high || d < w->low || d > w->high) return -1;
    for (int64_t p = 0; p < job->pieces; p++)
        if (w->kept_count[p] > w->capacity) return -1;
    double total = 0.0;
    int64_t count = 0, terms = 0;
    for (int64_t p = 0; p < job->pieces; p++) total += w->above_sum[p], count += w->above_count[p];
    for (int64_t p = 0; p < job->pieces; p++)
        for (int64_t k = 0; k < w->kept_count[p]; k++) {
            float v = w->kept[p * w->capacity + k];
            if ((int32_t)lb_bits(v) > d) total += (double)v, count++, terms++;
        }
    job->select = SELECT_ABOVE, job->delta = delta; /* what the exact pass selects */
    /* a term above the window: a pass's depth, then every kept term after it; a kept one: those after it */
    if (count == 0) *mean = 0.0f;
    else if (!lb_certified_mean(total, count, lb_stats_depth(job) + terms + 1, mean)) *mean = lb_stats_exact_mean(job, 0, count);
    __atomic_fetch_add(&lb_window_served, 1, __ATOMIC_RELAXED);
    return count > 0 && *mean == 0.0f ? 0 : 1;
}
