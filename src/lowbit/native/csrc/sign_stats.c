/* The sign formats' per-group statistics (formats/binary.py masked_mean, as binary and ternary use it).
 *
 * The mean is the exact mean of the selected float32 magnitudes rounded once to float32 (formats/means.py).
 * Our float64 sum passes each term through at most `depth` additions (sum_depth: about 1/32 of a piece's
 * elements, not all of them), so it is within about depth u of the exact sum (u = 2^-53); when the float32
 * rounding of the whole interval of possible quotients is one float, that float is the mean. Otherwise
 * (rare: the quotient lies next to a float32 midpoint) a serial pass sums the group's mantissas per exponent
 * in integers and rounds the exact quotient. One pass over x gives a mean. */
#include <stdlib.h>
#include "sign_sums.h"
#include "stream.h"

#define PIECE 65536 /* elements a thread sums alone (more when there are many groups) */

/* One group's run x[0..length) into the slot s. */
ALWAYS_INLINE void run_sums_of(const stats_job *job, int select, const float *x, int64_t length, int64_t group,
                               int64_t s) {
    selection chosen = selection_of(select, select == SELECT_ABOVE ? job->delta[group] : 0.0f);
    run_sums a;
    memset(&a, 0, sizeof a);
    int64_t i = 0;
    for (; i + 2 * LANES <= length; i += 2 * LANES) {
        lanes_i raw0 = lanes_load(x + i), raw1 = lanes_load(x + i + LANES);
        sums_vector(&a, &raw0, select, &chosen, 0), sums_vector(&a, &raw1, select, &chosen, 1);
    }
    for (; i < length; i += LANES) { /* the last partial vector padded with NaN, which no selection keeps */
        lanes_i raw = length - i >= LANES ? lanes_load(x + i) : lanes_load_tail(x + i, length - i);
        sums_vector(&a, &raw, select, &chosen, 0);
    }
    job->sum[s] += sums_total(&a);
    job->count[s] += sums_count(&a, select, (length + LANES - 1) / LANES * LANES);
}

/* The same for one element per element of the selection, as plain int32 (the row loops below). */
ALWAYS_INLINE int32_t element_kept(int32_t raw, int select, int32_t delta, int32_t *selected) {
    int32_t magnitude = raw & 0x7fffffff;
    switch (select) {
    case SELECT_FINITE: *selected = magnitude < 0x7f800000; return *selected ? magnitude : 0;
    case SELECT_POSITIVE: *selected = (raw > 0) & (raw < 0x7f800000); return *selected ? raw : 0;
    default: *selected = (magnitude > delta) & (magnitude < 0x7f800000); return *selected ? magnitude : 0;
    }
}

/* Groups of stride 1 (inner == 1: per channel on the last axis): x[0..length) holds one element of each of
 * the groups from `group` on, whose slots start at s; element k updates slot s + k (a plain loop over the
 * slots, which GCC vectorises). */
ALWAYS_INLINE void row_sums_of(const stats_job *job, int select, const float *x, int64_t length, int64_t group,
                               int64_t s) {
    const float *restrict delta = job->delta + group;
    double *restrict sum = job->sum + s;
    int64_t *restrict count = job->count + s;
    for (int64_t k = 0; k < length; k++) {
        int32_t raw, selected, kept;
        memcpy(&raw, x + k, sizeof raw);
        kept = element_kept(raw, select, select == SELECT_ABOVE ? (int32_t)lb_bits(delta[k]) : 0, &selected);
        sum[k] += (double)lb_float((uint32_t)kept);
        count[k] += selected;
    }
}

/* ROW_BLOCK whole rows of a group per column (inner == 1), into the slots from s: LANES columns at a time,
 * the block's rows summed in registers (two chains, even and odd rows, then both into the slot), so each slot
 * is read and written once per ROW_BLOCK rows instead of once per row. A term passes through at most
 * ROW_BLOCK / 2 + 1 additions on its way into the slot and the slot through one a block: less than
 * row_sums_of's one a row, which sum_depth counts. Columns past the last whole vector take row_sums_of. */
#define ROW_BLOCK 8
typedef int32_t half_i __attribute__((vector_size(LANES * 2)));
typedef int64_t half_q __attribute__((vector_size(LANES * 4)));

/* selection_of with a threshold per lane: delta's bits clamped to [-1, FLT_MAX's bits]. */
static inline selection lanes_selection(lanes_i delta) {
    lanes_i clamped = lanes_min(lanes_max(delta, lanes_of(-1)), lanes_of(0x7f7fffff));
    lanes_u offset = (lanes_u)lanes_of((int32_t)0x80000000u) - (lanes_u)clamped - 1u;
    lanes_u limit = (lanes_u)lanes_of((int32_t)0x80000000u) + ((lanes_u)lanes_of(0x7f800000) - (lanes_u)clamped - 1u);
    return (selection){delta, (lanes_i)offset, (lanes_i)limit};
}

/* count[0, LANES) += the lanes of v, widened to int64. */
static inline void add_counts(int64_t *count, lanes_i v) {
    half_i low, high;
    half_q total;
    memcpy(&low, &v, sizeof low), memcpy(&high, (const char *)&v + sizeof low, sizeof high);
    memcpy(&total, count, sizeof total), total += __builtin_convertvector(low, half_q), memcpy(count, &total, sizeof total);
    memcpy(&total, count + LANES / 2, sizeof total), total += __builtin_convertvector(high, half_q);
    memcpy(count + LANES / 2, &total, sizeof total);
}

ALWAYS_INLINE void row_block_sums_of(const stats_job *job, int select, const float *x, int64_t s) {
    const int64_t groups = job->groups;
    double *sum = job->sum + s;
    int64_t *count = job->count + s, k = 0;
    for (; k + LANES <= groups; k += LANES) {
        selection chosen = lanes_selection(select == SELECT_ABOVE ? lanes_load(job->delta + k) : lanes_of(0));
        half_d chain[2][2], slot_low, slot_high;
        lanes_i counted = lanes_of(0);
        memset(chain, 0, sizeof chain);
        for (int r = 0; r < ROW_BLOCK; r++) {
            lanes_i raw = lanes_load(x + r * groups + k), lanes;
            lanes_i kept = lanes_kept(&raw, select, &chosen, &lanes);
            chain[r & 1][0] += lanes_low((lanes_f)kept), chain[r & 1][1] += lanes_high((lanes_f)kept);
            counted -= lanes; /* compares give -1 */
        }
        memcpy(&slot_low, sum + k, sizeof slot_low), memcpy(&slot_high, sum + k + LANES / 2, sizeof slot_high);
        slot_low += chain[0][0] + chain[1][0], slot_high += chain[0][1] + chain[1][1];
        memcpy(sum + k, &slot_low, sizeof slot_low), memcpy(sum + k + LANES / 2, &slot_high, sizeof slot_high);
        add_counts(count + k, select == SELECT_FINITE ? lanes_of(ROW_BLOCK) - counted : counted); /* non-finite lanes */
    }
    for (int r = 0; r < ROW_BLOCK && k < groups; r++)
        row_sums_of(job, select, x + r * groups + k, groups - k, k, s + k);
}

static void stats_row_block(const stats_job *job, const float *x, int64_t s) {
    switch (job->select) {
    case SELECT_FINITE: row_block_sums_of(job, SELECT_FINITE, x, s); break;
    case SELECT_POSITIVE: row_block_sums_of(job, SELECT_POSITIVE, x, s); break;
    default: row_block_sums_of(job, SELECT_ABOVE, x, s); break;
    }
}

/* One group's run into the slot s, or with `row` one element of each group from `group` on (each selection
 * a constant in its copy of the loops). */
static void stats_run(const stats_job *job, const float *x, int64_t length, int64_t group, int64_t s, int row) {
    switch (row * 4 + job->select) {
    case SELECT_FINITE: run_sums_of(job, SELECT_FINITE, x, length, group, s); break;
    case SELECT_POSITIVE: run_sums_of(job, SELECT_POSITIVE, x, length, group, s); break;
    case SELECT_ABOVE: run_sums_of(job, SELECT_ABOVE, x, length, group, s); break;
    case 4 + SELECT_FINITE: row_sums_of(job, SELECT_FINITE, x, length, group, s); break;
    case 4 + SELECT_POSITIVE: row_sums_of(job, SELECT_POSITIVE, x, length, group, s); break;
    default: row_sums_of(job, SELECT_ABOVE, x, length, group, s); break;
    }
}

/* ---------------------------------------------------------------- passes and means ------------------- */

void lb_stats_add_run(const stats_job *job, const float *x, int64_t length, int64_t s) { stats_run(job, x, length, 0, s, 0); }

void lb_stats_range(const void *context, int64_t begin, int64_t end) {
    const stats_job *job = context;
    for (int64_t start = begin; start < end; start += job->piece) {
        int64_t stop = start + job->piece < end ? start + job->piece : end;
        int64_t slot = job->pieces == 1 ? 0 : (start / job->piece) * job->groups, i = start;
        if (job->groups > 1 && job->inner == 1 && start % job->groups == 0) /* whole rows, ROW_BLOCK at a time */
            for (; i + ROW_BLOCK * job->groups <= stop; i += ROW_BLOCK * job->groups) stats_row_block(job, job->x + i, slot);
        while (i < stop) {
            int64_t group = (i / job->inner) % job->groups, run_end = stop;
            int row = job->groups > 1 && job->inner == 1;
            if (job->groups > 1) run_end = row ? i - group + job->groups : (i / job->inner + 1) * job->inner;
            run_end = run_end < stop ? run_end : stop;
            stats_run(job, job->x + i, run_end - i, group, slot + group, row);
            i = run_end;
        }
    }
}

int lb_stats_open(stats_job *job, const float *x, int64_t outer, int64_t groups, int64_t inner, int threads) {
    int64_t n = outer * groups * inner, piece = PIECE, pieces = (n + piece - 1) / piece;
    while (pieces * groups > (1 << 20)) piece *= 2, pieces = (n + piece - 1) / piece;
    if (threads > 1 && pieces > 1 && pieces % threads) { /* as many pieces on each thread (3 pieces on 2 threads: 2 and 1) */
        pieces += threads - pieces % threads;
        piece = ((n + pieces - 1) / pieces + 4 * LANES - 1) / (4 * LANES) * (4 * LANES);
        pieces = (n + piece - 1) / piece;
    }
    if (outer == 1 && groups > 1) { /* each group one run: pieces of whole groups, one slot per group */
        piece = (PIECE + inner - 1) / inner * inner, pieces = 1;
    } else if (groups > 1 && inner == 1) {
        /* a group per column: pieces of whole rows (row_block_sums_of takes ROW_BLOCK of them at a time), as many
         * as above; past 2^16 slots one piece per thread (pieces of PIECE elements gave 4096 columns of 4096
         * rows a million slots, 16 MB to clear and to reduce in every pass) */
        int64_t parts = pieces * groups > (1 << 16) ? (threads > 1 ? threads : 1) : pieces;
        int64_t rows = (outer + parts - 1) / parts;
        piece = rows * groups, pieces = (outer + rows - 1) / rows;
    }
    int64_t slots = pieces * groups;
    char *memory = malloc((size_t)slots * (sizeof(double) + sizeof(int64_t)));
    *job = (stats_job){.x = x, .n = n, .groups = groups, .inner = inner, .pieces = pieces, .piece = piece,
                       .memory = memory};
    if (!memory) return 0;
    job->sum = (double *)memory;
    job->count = (int64_t *)(job->sum + slots);
    return 1;
}

void lb_stats_start(stats_job *job, int select, const float *delta) {
    int64_t slots = job->pieces * job->groups;
    job->select = select, job->delta = delta;
    for (int64_t s = 0; s < slots; s++) job->sum[s] = 0.0, job->count[s] = 0;
}

/* ---------------------------------------------------------------- means ------------------------------ */

/* The mean's float32 rounding from our float64 sum of nonnegative terms, or 0 where the rounding of the
 * interval the exact quotient lies in is not one float. Every term reaches our sum through at most `depth`
 * float64 additions, so the sum is within about depth u of the exact one (u = 2^-53) and the quotient one
 * rounding more; the interval is twice that wide. */
static int certified_mean(double sum, int64_t count, int64_t depth, float *mean) {
    double quotient = sum / (double)count, spread = (double)(depth + 16) * 0x1p-52;
    float low = (float)(quotient * (1.0 - spread)), high = (float)(quotient * (1.0 + spread));
    if (low != high) return 0;
    *mean = low;
    return 1;
}

/* The most float64 additions a term passes through on its way into a group's total. A run (run_sums_of):
 * its lane of the accumulators (one term per 2 LANES elements, two more from the tail), sums_total (at most
 * 10), the slot's sum of the piece's runs of that group (one per inner elements, one more), the pieces. A row
 * (row_sums_of): one term per row of the piece into the slot, then the pieces. */
static int64_t sum_depth(const stats_job *job) {
    int64_t in_slot = job->groups > 1 && job->inner == 1 ? job->piece / job->groups + 1
                                                         : job->piece / (2 * LANES) + 2 + 10 + job->piece / job->inner + 1;
    return in_slot + job->pieces + 1 + job->extra_depth;
}

/* A nonnegative integer of WIDE_WORDS 64-bit words, least significant first: a sum of up to 2^39 float32
 * magnitudes in units of 2^-149 (24 mantissa bits at shifts up to 253, plus 39 bits of count) fits. */
#define WIDE_WORDS 6
typedef struct {
    uint64_t word[WIDE_WORDS];
} wide;

static void wide_add(wide *a, uint64_t value, int shift) {
    unsigned __int128 carry = (unsigned __int128)value << (shift % 64);
    for (int w = shift / 64; w < WIDE_WORDS && carry; w++) {
        carry += a->word[w];
        a->word[w] = (uint64_t)carry;
        carry >>= 64;
    }
}

/* a = a / divisor (truncated); returns the remainder. */
static uint64_t wide_divide(wide *a, uint64_t divisor) {
    unsigned __int128 remainder = 0;
    for (int w = WIDE_WORDS - 1; w >= 0; w--) {
        unsigned __int128 current = remainder << 64 | a->word[w];
        a->word[w] = (uint64_t)(current / divisor), remainder = current % divisor;
    }
    return (uint64_t)remainder;
}

static int wide_top_bit(const wide *a) { /* -1 for zero */
    for (int w = WIDE_WORDS - 1; w >= 0; w--)
        if (a->word[w]) return w * 64 + 63 - __builtin_clzll(a->word[w]);
    return -1;
}

static uint64_t wide_bits(const wide *a, int from, int count) { /* bits [from, from + count), count < 64 */
    int w = from / 64, b = from % 64;
    uint64_t bits = a->word[w] >> b;
    if (b && w + 1 < WIDE_WORDS) bits |= a->word[w + 1] << (64 - b);
    return bits & ((UINT64_C(1) << count) - 1);
}

static int wide_any_below(const wide *a, int bit) {
    for (int w = 0; w * 64 < bit; w++) {
        int below = bit - w * 64;
        if (a->word[w] & (below >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << below) - 1)) return 1;
    }
    return 0;
}

/* (units * 2^-149) / count rounded to float32, ties to even (units: the exact sum; count >= 1). */
static float exact_quotient(wide *units, uint64_t count) {
    uint64_t remainder = wide_divide(units, count);
    int top = wide_top_bit(units), shift = top > 23 ? top - 23 : 0, up;
    uint64_t mantissa = wide_bits(units, shift, 24);
    if (shift == 0) { /* the fraction is remainder / count */
        unsigned __int128 twice = (unsigned __int128)remainder * 2;
        up = twice > count || (twice == count && (mantissa & 1));
    } else {
        int half = (int)wide_bits(units, shift - 1, 1), sticky = remainder || wide_any_below(units, shift - 1);
        up = half && (sticky || (mantissa & 1));
    }
    mantissa += (uint64_t)up;
    if (top < 23) return lb_float((uint32_t)mantissa); /* subnormal (or, rounded up, the smallest normal) */
    if (mantissa >> 24) mantissa >>= 1, shift++;
    return lb_float((uint32_t)(shift + 1) << 23 | (uint32_t)(mantissa & 0x7fffff)); /* mantissa * 2^(shift-149) */
}

/* Group g's mean exactly (serial, rare): its kept magnitudes' mantissas summed per exponent in integers, the
 * sums shifted into one wide integer, divided by the count and rounded once. */
static float exact_mean(const stats_job *job, int64_t g, int64_t count) {
    uint64_t mantissas[255] = {0};
    int32_t delta = job->select == SELECT_ABOVE ? (int32_t)lb_bits(job->delta[g]) : 0;
    int64_t outer = job->n / (job->groups * job->inner);
    const uint16_t *halves = (const uint16_t *)(const void *)job->x;
    for (int64_t o = 0; o < outer; o++) {
        int64_t start = (o * job->groups + g) * job->inner;
        for (int64_t i = 0; i < job->inner; i++) {
            int32_t raw, selected, kept;
            if (job->storage == LB_HALF_BFLOAT16) raw = (int32_t)((uint32_t)halves[start + i] << 16);
            else if (job->storage == LB_HALF_FLOAT16) raw = (int32_t)float32_of_half(halves[start + i]);
            else memcpy(&raw, job->x + start + i, sizeof raw);
            kept = element_kept(raw, job->select, delta, &selected);
            mantissas[kept >> 23] += (uint64_t)((kept & 0x7fffff) | (kept >= 0x800000 ? 0x800000 : 0));
        }
    }
    wide units = {{0}};
    for (int e = 0; e < 255; e++) wide_add(&units, mantissas[e], e > 0 ? e - 1 : 0); /* value = m 2^(max(e,1)-150) */
    return exact_quotient(&units, (uint64_t)count);
}

int lb_stats_means(stats_job *job, float *mean, int zero_ok) {
    int64_t depth = sum_depth(job);
    for (int64_t g = 0; g < job->groups; g++) {
        double total = 0.0;
        int64_t count = 0;
        for (int64_t p = 0; p < job->pieces; p++) total += job->sum[p * job->groups + g], count += job->count[p * job->groups + g];
        if (count == 0) mean[g] = 0.0f;
        else if (!certified_mean(total, count, depth, &mean[g])) mean[g] = exact_mean(job, g, count);
        if (!zero_ok && count > 0 && mean[g] == 0.0f) return 0;
    }
    return 1;
}
