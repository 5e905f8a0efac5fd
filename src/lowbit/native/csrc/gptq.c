/* int4's group range search (lowbit.ops.int4.quantize_groups) and GPTQ's column loop (lowbit.ops.gptq) with a
 * tile of weight rows in the vector lanes. The weight comes transposed, [inputs, rows], so each step reads and
 * writes a contiguous run of rows and every loop below runs over rows.
 *
 * The element arithmetic is the torch code's, operation for operation (this file keeps -ffp-contract=off):
 * the range widened to hold 0 (integer zero points) or the group's own (float minima), each trial end moved by
 * its float32 factor, the scale (high - low) * (1 / 15) clamped to the smallest normal and rounded to its storage
 * dtype, x * (1 / scale) and round-half-even in the search, value / scale in GPTQ's integer-domain rounding,
 * the error divided by U's diagonal and w - e * u for the later columns. One thing differs: each trial's squared
 * errors are added in input order here, where torch.sum picks a vector order of its own, so two trial ranges
 * whose errors agree to float32 rounding can be chosen differently (tests/native/test_gptq_kernels.py counts it). */
#include <float.h>
#include "int4_groups.h"

typedef struct {
    int64_t group, stride; /* the group's inputs; the distance between two inputs' rows */
    const float *weights;  /* importance of the group's inputs, or NULL */
    int scale_type, search, float_zero;
} fit_rule;

/* One trial range per row -> scale, 1 / scale and the zero point (integer domain) or minimum (float). */
static void trial(const fit_rule *rule, const float *low, const float *high, int64_t count, float *scale,
                  float *inverse, float *offset) {
    const float third = (float)(1.0 / 15);
    for (int64_t n = 0; n < count; n++) {
        float s = (high[n] - low[n]) * third;
        s = stored(s < FLT_MIN ? FLT_MIN : s, rule->scale_type);
        s = s <= 0.0f ? 1.0f : s; /* a float16 underflow */
        const float inv = 1.0f / s;
        scale[n] = s, inverse[n] = inv;
        offset[n] = rule->float_zero ? stored(low[n], rule->scale_type) : clamp_code(-rintf(low[n] * inv));
    }
}

/* Each row's weighted squared error over the group for one trial's parameters. */
static void trial_error(const fit_rule *rule, const float *x, int64_t count, const float *scale,
                        const float *inverse, const float *offset, float *error) {
    for (int64_t n = 0; n < count; n++) error[n] = 0.0f;
    for (int64_t c = 0; c < rule->group; c++) {
        const float *row = x + c * rule->stride, weight = rule->weights ? rule->weights[c] : 1.0f;
        for (int64_t n = 0; n < count; n++) {
            float value;
            if (rule->float_zero) {
                const float q = clamp_code(rintf((row[n] - offset[n]) * inverse[n]));
                value = q * scale[n] + offset[n];
            } else {
                const float q = clamp_code(rintf(row[n] * inverse[n]) + offset[n]);
                value = (q - offset[n]) * scale[n];
            }
            float term = (value - row[n]) * (value - row[n]);
            if (rule->weights) term = term * weight;
            error[n] += term;
        }
    }
}

/* The trial ends for one pair of factors (int4.py's _shrunk). */
static void shrunk(const fit_rule *rule, const float *low0, const float *high0, int64_t count, float low_factor,
                   float high_factor, int whole_low, int whole_high, float *low, float *high) {
    for (int64_t n = 0; n < count; n++) {
        if (!rule->float_zero) {
            low[n] = low0[n] * low_factor, high[n] = high0[n] * high_factor;
            continue;
        }
        const float width = high0[n] - low0[n];
        low[n] = whole_low ? low0[n] : high0[n] - width * low_factor;
        high[n] = whole_high ? high0[n] : low0[n] + width * high_factor;
    }
}

/* The group's scale and offset per row: min-max, then (search) the 7 x 7 shrunk ranges, the first of equal
 * errors kept. x: the group's first input's rows. */
static void fit_group(const fit_rule *rule, const float *x, int64_t count, float *best_scale, float *best_offset) {
    float low0[TILE], high0[TILE], low[TILE], high[TILE], scale[TILE], inverse[TILE], offset[TILE];
    float error[TILE], best[TILE];
    for (int64_t n = 0; n < count; n++) low0[n] = x[n], high0[n] = x[n];
    for (int64_t c = 1; c < rule->group; c++) {
        const float *row = x + c * rule->stride;
        for (int64_t n = 0; n < count; n++) {
            low0[n] = row[n] < low0[n] ? row[n] : low0[n];
            high0[n] = row[n] > high0[n] ? row[n] : high0[n];
        }
    }
    if (!rule->float_zero)
        for (int64_t n = 0; n < count; n++) {
            low0[n] = low0[n] > 0.0f ? 0.0f : low0[n];
            high0[n] = high0[n] < 0.0f ? 0.0f : high0[n];
        }
    const int steps = rule->search ? 7 : 1;
    for (int64_t n = 0; n < count; n++) error[n] = 0.0f; /* no search: the one trial is kept */
    for (int i = 0; i < steps; i++)
        for (int j = 0; j < steps; j++) {
            shrunk(rule, low0, high0, count, (float)(1.0 - 0.05 * i), (float)(1.0 - 0.05 * j), i == 0, j == 0, low,
                   high);
            trial(rule, low, high, count, scale, inverse, offset);
            if (steps > 1) trial_error(rule, x, count, scale, inverse, offset, error);
            for (int64_t n = 0; n < count; n++)
                if ((i == 0 && j == 0) || error[n] < best[n])
                    best[n] = error[n], best_scale[n] = scale[n], best_offset[n] = offset[n];
        }
}

/* ---- the data-free search: codes, scales and offsets of a whole weight --------------------------------- */
typedef struct {
    const float *columns, *importance; /* [inner, rows]; [inner] or NULL */
    uint8_t *codes;                    /* [rows, inner] */
    float *scale, *offset;             /* [inner / group, rows] */
    int64_t rows, inner, group;
    int scale_type, search, float_zero;
} fit_job;

static void fit_range(const void *context, int64_t begin, int64_t end) {
    const fit_job *job = context;
    for (int64_t n0 = begin; n0 < end; n0 += TILE) {
        const int64_t count = end - n0 < TILE ? end - n0 : TILE;
        for (int64_t first = 0; first < job->inner; first += job->group) {
            const fit_rule rule = {job->group, job->rows, job->importance ? job->importance + first : NULL,
                                   job->scale_type, job->search, job->float_zero};
            const float *x = job->columns + first * job->rows + n0;
            float *scale = job->scale + (first / job->group) * job->rows + n0;
            float *offset = job->offset + (first / job->group) * job->rows + n0;
            fit_group(&rule, x, count, scale, offset);
            for (int64_t c = 0; c < job->group; c++) {
                const float *row = x + c * job->rows;
                uint8_t *codes = job->codes + n0 * job->inner + first + c;
                for (int64_t n = 0; n < count; n++) {
                    const float inverse = 1.0f / scale[n];
                    const float q = job->float_zero ? clamp_code(rintf((row[n] - offset[n]) * inverse))
                                                    : clamp_code(rintf(row[n] * inverse) + offset[n]);
                    codes[n * job->inner] = (uint8_t)q;
                }
            }
        }
    }
}

/* columns: the weight transposed [inner, rows] -> codes [rows, inner], scale and offset [inner / group, rows].
 * Returns 0, or -1 for sizes it does not take. */
int lb_int4_fit_f32(const float *columns, const float *importance, uint8_t *codes, float *scale, float *offset,
                    int64_t rows, int64_t inner, int64_t group, int scale_type, int search, int float_zero,
                    int threads) {
    if (rows <= 0 || inner <= 0 || group <= 0 || inner % group || scale_type < 0 || scale_type > SCALE_FLOAT16)
        return -1;
    fit_job job = {columns, importance, codes, scale, offset, rows, inner, group, scale_type, search, float_zero};
    lb_parallel_from(rows, TILE, threads, 2 * TILE, fit_range, &job);
    return 0;
}

/* ---- GPTQ: one block of columns --------------------------------------------------------------------------- */
typedef struct {
    float *block, *errors;            /* [width, rows] each */
    const float *upper;               /* U's rows for the block, from its first column; row stride upper_stride */
    const int64_t *columns;           /* [width] each block column's input */
    const float *importance;          /* [inner] */
    uint8_t *codes;                   /* [rows, inner] */
    float *scale, *offset;            /* [inner / group, rows] */
    int64_t rows, inner, width, group, upper_stride;
    int scale_type, search, float_zero, fixed; /* fixed: every group's parameters given (static groups) */
} gptq_job;

static void round_column(const gptq_job *job, int64_t j, int64_t n0, int64_t count) {
    const int64_t column = job->columns[j], rows = job->rows;
    const float *value = job->block + j * rows + n0, divisor = job->upper[j * job->upper_stride + j];
    const float *scale = job->scale + (column / job->group) * rows + n0;
    const float *offset = job->offset + (column / job->group) * rows + n0;
    float *error = job->errors + j * rows + n0;
    uint8_t *codes = job->codes + n0 * job->inner + column;
    for (int64_t n = 0; n < count; n++) {
        float q, rounded;
        if (job->float_zero) {
            q = clamp_code(rintf((value[n] - offset[n]) * (1.0f / scale[n])));
            rounded = q * scale[n] + offset[n];
        } else {
            q = clamp_code(rintf(value[n] / scale[n]) + offset[n]);
            rounded = (q - offset[n]) * scale[n];
        }
        codes[n * job->inner] = (uint8_t)q;
        error[n] = (value[n] - rounded) / divisor;
    }
    for (int64_t k = j + 1; k < job->width; k++) { /* the error onto the block's later columns */
        const float u = job->upper[j * job->upper_stride + k];
        float *later = job->block + k * rows + n0;
        for (int64_t n = 0; n < count; n++) later[n] = later[n] - error[n] * u;
    }
}

static void gptq_range(const void *context, int64_t begin, int64_t end) {
    const gptq_job *job = context;
    for (int64_t n0 = begin; n0 < end; n0 += TILE) {
        const int64_t count = end - n0 < TILE ? end - n0 : TILE;
        for (int64_t j = 0; j < job->width; j++) {
            const int64_t column = job->columns[j];
            if (!job->fixed && column % job->group == 0) { /* a group starts: its range from the weights now */
                const fit_rule rule = {job->group, job->rows, job->importance + column, job->scale_type,
                                       job->search, job->float_zero};
                const int64_t at = (column / job->group) * job->rows + n0;
                fit_group(&rule, job->block + j * job->rows + n0, count, job->scale + at, job->offset + at);
            }
            round_column(job, j, n0, count);
        }
    }
}

/* GPTQ's loop over one block of `width` columns (lowbit.ops.gptq._round_block): block [width, rows] is rounded
 * column by column into codes [rows, inner], each column's error (divided by U's diagonal) into errors
 * [width, rows] and onto the block's later columns. Unless `fixed`, the block starts at a group's first
 * input, holds whole groups in input order, and each group's parameters are chosen when it starts. */
int lb_gptq_block_f32(float *block, float *errors, const float *upper, int64_t upper_stride,
                      const int64_t *columns, const float *importance, uint8_t *codes, float *scale, float *offset,
                      int64_t rows, int64_t inner, int64_t width, int64_t group, int scale_type, int search,
                      int float_zero, int fixed, int threads) {
    if (rows <= 0 || width <= 0 || group <= 0 || inner % group || scale_type < 0 || scale_type > SCALE_FLOAT16)
        return -1;
    if (!fixed && (columns[0] % group || width % group)) return -1;
    gptq_job job = {block, errors, upper, columns, importance, codes, scale, offset, rows, inner, width, group,
                    upper_stride, scale_type, search, float_zero, fixed};
    lb_parallel_from(rows, TILE, threads, 2 * TILE, gptq_range, &job);
    return 0;
}
