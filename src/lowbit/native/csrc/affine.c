/* Affine quantizers (formats/integer.py Affine, formats/presets.py), bit-identical to the eager torch code:
 * the same float32 operations in the same order, per element and per block.
 *
 * steps = round(x * (1 / scale)) (directed modes corrected against the grid values), codes =
 * clamp(steps + zp, low code, high code), value = (codes - zp) * scale clamped to +-FLT_MAX. Derived scales
 * come from min-max statistics over finite elements (non-finite elements count as zero), widened to include
 * zero, per tensor, per channel, or per block of a row. */
#include <stdlib.h>
#include "affine_params.h"
#include "min_max_lanes.h"
#include "stream.h"

/* ---- statistics ---------------------------------------------------------------------------------------- */
static inline float finite_or_zero(float v) { return fabsf(v) <= FLT_MAX ? v : 0.0f; }

/* min / max of the finite elements of x[0, n) and of *low / *high (updated in place). Lanes start at zero and
 * the last partial group reads zeros past n: the statistics include zero anyway. */
static void min_max(const float *x, int64_t n, float *low, float *high) {
    float lows[16] = {0}, highs[16] = {0};
    int64_t full = n - n % 16;
    for (int64_t i = 0; i < full; i += 16)
        for (int k = 0; k < 16; k++) {
            float v = finite_or_zero(x[i + k]);
            lows[k] = v < lows[k] ? v : lows[k];
            highs[k] = v > highs[k] ? v : highs[k];
        }
    if (full < n) {
        float tail[16] = {0};
        memcpy(tail, x + full, sizeof(float) * (size_t)(n - full));
        for (int k = 0; k < 16; k++) {
            float v = finite_or_zero(tail[k]);
            lows[k] = v < lows[k] ? v : lows[k];
            highs[k] = v > highs[k] ? v : highs[k];
        }
    }
    /* a tree of fixed widths (short dependency chains; each level one vector operation) */
#define LB_HALVE(WIDTH) \
    for (int k = 0; k < WIDTH; k++) { \
        lows[k] = lows[k + WIDTH] < lows[k] ? lows[k + WIDTH] : lows[k]; \
        highs[k] = highs[k + WIDTH] > highs[k] ? highs[k + WIDTH] : highs[k]; \
    }
    LB_HALVE(8) LB_HALVE(4) LB_HALVE(2) LB_HALVE(1)
#undef LB_HALVE
    *low = lows[0] < *low ? lows[0] : *low;
    *high = highs[0] > *high ? highs[0] : *high;
}

/* ---- element passes ------------------------------------------------------------------------------------ */
#define RUN_LOOP(MODE) \
    if (p.bounded) for (int64_t i = 0; i < n; i++) \
        out[i] = affine_value(x[i], p.scale, p.inverse, p.zero_point, low, high, MODE, 1); \
    else for (int64_t i = 0; i < n; i++) \
        out[i] = affine_value(x[i], p.scale, p.inverse, p.zero_point, low, high, MODE, 0)

static void affine_run(const float *x, float *out, int64_t n, affine_params p, float low, float high, int mode) {
    LB_FOR_EACH_MODE(mode, RUN_LOOP)
}

/* one run of n elements, each with its own parameter set (per channel of the last dimension) */
#define CHANNEL_LOOP(MODE) \
    if (bounded) for (int64_t i = 0; i < n; i++) \
        out[i] = affine_value(x[i], scale[i], inverse[i], zero_point[i], low, high, MODE, 1); \
    else for (int64_t i = 0; i < n; i++) \
        out[i] = affine_value(x[i], scale[i], inverse[i], zero_point[i], low, high, MODE, 0)

static void channel_run(const float *x, float *out, int64_t n, const float *scale, const float *inverse,
                        const float *zero_point, float low, float high, int mode, int bounded) {
    LB_FOR_EACH_MODE(mode, CHANNEL_LOOP)
}

typedef struct {
    const float *x;
    float *out;
    int64_t channels, inner, length, block;
    affine_params *params; /* one per channel (LAYOUT_CHANNELS / given) */
    float *scale, *inverse, *zero_point; /* the same, as arrays (a last-dimension channel run) */
    int bounded;
    affine_params tensor; /* LAYOUT_TENSOR */
    const lb_affine_spec *config;
    float *parts; /* partial statistics */
    int streamed; /* out written past the cache (stream.h) */
} affine_job;

static void tensor_span(const void *context, const float *x, float *out, int64_t n) {
    const affine_job *job = context;
    affine_run(x, out, n, job->tensor, job->config->clamp_low, job->config->clamp_high, job->config->mode);
}

static void tensor_range(const void *context, int64_t begin, int64_t end) {
    const affine_job *job = context;
    lb_spans(job, job->x, job->out, job->streamed, begin, end, tensor_span);
}

/* min_max over n halves from x[start] (x holds bfloat16 / float16: streamed < 0), a tile widened at a time. */
static void half_min_max(const affine_job *job, int64_t start, int64_t n, float *low, float *high) {
    float tile[LB_TILE];
    const uint16_t *x = (const uint16_t *)(const void *)job->x + start;
    for (int64_t at = 0, k; at < n; at += k) {
        k = n - at < LB_TILE ? n - at : LB_TILE;
        lb_widen_halves(x + at, tile, k, lb_half_kind(job->streamed));
        min_max(tile, k, low, high);
    }
}

static void tensor_statistics(const void *context, int64_t begin, int64_t end) {
    const affine_job *job = context;
    for (int64_t start = begin; start < end; start += STAT_GRAIN) {
        float *part = job->parts + 2 * (start / STAT_GRAIN);
        int64_t n = end - start < STAT_GRAIN ? end - start : STAT_GRAIN;
        part[0] = part[1] = 0.0f;
        if (job->streamed < 0) half_min_max(job, start, n, part, part + 1);
        else min_max(job->x + start, n, part, part + 1);
    }
}

/* [outer, channels, inner] in slices of whole outer indices */
static void channel_range(const void *context, int64_t begin, int64_t end) {
    const affine_job *job = context;
    const lb_affine_spec *c = job->config;
    int64_t slice = job->channels * job->inner;
    lb_sink sink;
    lb_sink_open(&sink, job->out, job->streamed);
    for (int64_t start = begin; start < end; start += slice) {
        if (job->inner == 1) {
            for (int64_t k = 0, n; k < slice; k += n) {
                n = lb_sink_span(&sink, slice - k);
                channel_run(job->x + start + k, lb_sink_next(&sink, start + k, n), n, job->scale + k, job->inverse + k,
                            job->zero_point + k, c->clamp_low, c->clamp_high, c->mode, job->bounded);
            }
            continue;
        }
        for (int64_t channel = 0; channel < job->channels; channel++)
            for (int64_t at = start + channel * job->inner, stop = at + job->inner, n; at < stop; at += n) {
                n = lb_sink_span(&sink, stop - at);
                affine_run(job->x + at, lb_sink_next(&sink, at, n), n, job->params[channel], c->clamp_low,
                           c->clamp_high, c->mode);
            }
    }
    lb_sink_close(&sink);
}

/* statistics per channel over the outer indices of one part (a whole number of outer slices) */
/* min / max per channel of the last dimension over the rows [first, stop) of `channels` elements, for WIDE
 * channels at a time held in locals over every row (the arrays low / high are written once). */
#define WIDE 64

static void column_statistics(const float *x, int64_t rows, int64_t channels, float *low, float *high) {
    for (int64_t from = 0; from < channels; from += WIDE) {
        float lows[WIDE] = {0}, highs[WIDE] = {0};
        int64_t count = channels - from < WIDE ? channels - from : WIDE;
        if (count == WIDE)
            for (int64_t row = 0; row < rows; row++)
                for (int k = 0; k < WIDE; k++) {
                    float v = finite_or_zero(x[row * channels + from + k]);
                    lows[k] = v < lows[k] ? v : lows[k];
                    highs[k] = v > highs[k] ? v : highs[k];
                }
        else
            for (int64_t row = 0; row < rows; row++)
                for (int64_t k = 0; k < count; k++) {
                    float v = finite_or_zero(x[row * channels + from + k]);
                    lows[k] = v < lows[k] ? v : lows[k];
                    highs[k] = v > highs[k] ? v : highs[k];
                }
        for (int64_t k = 0; k < count; k++) low[from + k] = lows[k], high[from + k] = highs[k];
    }
}

/* statistics per channel over the outer indices of one part (a whole number of outer slices) */
static void channel_statistics(const void *context, int64_t begin, int64_t end) {
    const affine_job *job = context;
    int64_t slice = job->channels * job->inner, per_part = job->length;
    for (int64_t first = begin; first < end; first += per_part) {
        float *low = job->parts + 2 * job->channels * (first / per_part), *high = low + job->channels;
        int64_t stop = end - first < per_part ? end : first + per_part;
        if (job->inner == 1) {
            column_statistics(job->x + first, (stop - first) / slice, job->channels, low, high);
            continue;
        }
        for (int64_t channel = 0; channel < job->channels; channel++) low[channel] = high[channel] = 0.0f;
        for (int64_t start = first; start < stop; start += slice)
            for (int64_t channel = 0; channel < job->channels; channel++)
                min_max(job->x + start + channel * job->inner, job->inner, low + channel, high + channel);
    }
}

/* rows of `length` elements, each cut into blocks of `block` (the last one shorter); the blocks of a chunk are
 * taken a batch at a time: statistics, then parameters (independent divisions overlap), then elements. */

/* Blocks a batch takes: BATCH, fewer for long blocks, so that a batch (its statistics read x, then its
 * elements read it again) stays within BATCH_FLOATS, which the L2 cache holds (per channel along the first
 * axis is one block per row: 64 rows of 4096 floats are 1 MB, the whole L2 of a Zen 4 core). */
#define BATCH_FLOATS 65536
static inline int64_t batch_blocks(int64_t block) {
    int64_t fit = BATCH_FLOATS / block;
    return fit < 1 ? 1 : (fit < BATCH ? fit : BATCH);
}

static void row_range(const void *context, int64_t begin, int64_t end) {
    const affine_job *job = context;
    const lb_affine_spec *c = job->config;
    int64_t per_row = (job->length + job->block - 1) / job->block;
    int64_t first = begin / job->length * per_row, last = end / job->length * per_row, per_batch = batch_blocks(job->block);
    float lows[BATCH], highs[BATCH];
    affine_params params[BATCH];
    lb_sink sink;
    lb_sink_open(&sink, job->out, job->streamed);
    for (int64_t batch = first; batch < last; batch += per_batch) {
        int64_t count = last - batch < per_batch ? last - batch : per_batch;
        for (int64_t k = 0; k < count; k++) {
            int64_t row = (batch + k) / per_row, start = (batch + k) % per_row * job->block;
            int64_t size = job->length - start < job->block ? job->length - start : job->block;
            lows[k] = highs[k] = 0.0f;
            min_max(job->x + row * job->length + start, size, lows + k, highs + k);
        }
        derive_batch(c, lows, highs, count, params);
        for (int64_t k = 0; k < count; k++) {
            int64_t row = (batch + k) / per_row, start = (batch + k) % per_row * job->block;
            int64_t size = job->length - start < job->block ? job->length - start : job->block;
            int64_t at = row * job->length + start;
            for (int64_t done = 0, n; done < size; done += n) {
                n = lb_sink_span(&sink, size - done);
                affine_run(job->x + at + done, lb_sink_next(&sink, at + done, n), n, params[k], c->clamp_low,
                           c->clamp_high, c->mode);
            }
        }
    }
    lb_sink_close(&sink);
}

/* row_range where every block is whole, a multiple of 16 long and at most a tile (blocks of 16, 32, 64 along
 * rows that they divide): the blocks are contiguous, the length and the rounding mode constants of the inlined
 * loops. */
static inline __attribute__((always_inline)) void whole_blocks(const affine_job *job, int64_t first, int64_t last,
                                                               int64_t block, int mode) {
    const lb_affine_spec *c = job->config;
    float lows[BATCH], highs[BATCH];
    affine_batch params;
    const int streamed = job->streamed && block <= LB_TILE; /* a batch's blocks go out a tile at a time */
    int64_t per_batch = streamed && block * BATCH > LB_TILE ? LB_TILE / block : batch_blocks(block);
    lb_sink sink;
    lb_sink_open(&sink, job->out, streamed);
    for (int64_t batch = first; batch < last; batch += per_batch) {
        int64_t count = last - batch < per_batch ? last - batch : per_batch;
        int64_t k = 0;
        for (; k + LANES <= count; k += LANES) blocks_min_max(job->x + (batch + k) * block, block, lows + k, highs + k);
        for (; k < count; k++) block_min_max(job->x + (batch + k) * block, block, lows + k, highs + k);
        if (!derive_nearest_batch(c, lows, highs, count, &params, mode)) derive_batch_arrays(c, lows, highs, count, &params);
        float *batch_out = lb_sink_next(&sink, batch * block, count * block);
        for (int64_t k = 0; k < count; k++) {
            const float *restrict x = job->x + (batch + k) * block;
            float *restrict out = batch_out + k * block;
            float scale = params.scale[k], inverse = params.inverse[k], zero_point = params.zero_point[k];
            if (params.bounded[k])
                for (int64_t i = 0; i < block; i++)
                    out[i] = affine_value(x[i], scale, inverse, zero_point, c->clamp_low, c->clamp_high, mode, 1);
            else
                for (int64_t i = 0; i < block; i++)
                    out[i] = affine_value(x[i], scale, inverse, zero_point, c->clamp_low, c->clamp_high, mode, 0);
        }
    }
    lb_sink_close(&sink);
}

#define WHOLE_16(MODE) whole_blocks(job, first, last, 16, MODE)
#define WHOLE_32(MODE) whole_blocks(job, first, last, 32, MODE)
#define WHOLE_ANY(MODE) whole_blocks(job, first, last, job->block, MODE)

static void whole_block_range(const void *context, int64_t begin, int64_t end) {
    const affine_job *job = context;
    if (job->block > LB_TILE) { /* row_range writes a long block through the sink a tile at a time */
        row_range(context, begin, end);
        return;
    }
    int64_t first = begin / job->block, last = end / job->block;
    switch (job->block) {
    case 16: LB_FOR_EACH_MODE(job->config->mode, WHOLE_16) break;
    case 32: LB_FOR_EACH_MODE(job->config->mode, WHOLE_32) break;
    default: LB_FOR_EACH_MODE(job->config->mode, WHOLE_ANY) break;
    }
}

static int tensor_pass(affine_job *job, int64_t n, int threads) {
    int64_t count = (n + STAT_GRAIN - 1) / STAT_GRAIN;
    job->parts = malloc(sizeof(float) * 2 * count);
    if (!job->parts) return 0;
    lb_parallel(n, STAT_GRAIN, threads, tensor_statistics, job);
    float low = 0.0f, high = 0.0f;
    for (int64_t part = 0; part < count; part++) {
        low = job->parts[2 * part] < low ? job->parts[2 * part] : low;
        high = job->parts[2 * part + 1] > high ? job->parts[2 * part + 1] : high;
    }
    free(job->parts);
    job->tensor = derive(job->config, low, high);
    lb_parallel(n, 64, threads, tensor_range, job);
    return 1;
}

/* parameter arrays for `channels` channels (params, then scale / inverse / zero point as floats) */
static void *channel_memory(affine_job *job, int64_t extra_floats) {
    int64_t channels = job->channels;
    char *memory = malloc(sizeof(affine_params) * channels + sizeof(float) * (3 * channels + extra_floats));
    if (!memory) return NULL;
    job->params = (affine_params *)memory;
    job->scale = (float *)(memory + sizeof(affine_params) * channels);
    job->inverse = job->scale + channels, job->zero_point = job->inverse + channels;
    job->parts = job->zero_point + channels;
    return memory;
}

static void set_channel(affine_job *job, int64_t channel, affine_params p) {
    job->params[channel] = p;
    job->scale[channel] = p.scale, job->inverse[channel] = p.inverse, job->zero_point[channel] = p.zero_point;
    job->bounded &= p.bounded;
}

static int channel_pass(affine_job *job, int64_t outer, int threads) {
    int64_t channels = job->channels, slice = channels * job->inner;
    int64_t per_part = (outer + MAX_PARTS - 1) / MAX_PARTS, count = (outer + per_part - 1) / per_part;
    void *memory = channel_memory(job, 2 * channels * count + 2 * channels);
    if (!memory) return 0;
    float *low = job->parts + 2 * channels * count, *high = low + channels;
    job->length = per_part * slice;
    lb_parallel(outer * slice, per_part * slice, threads, channel_statistics, job);
    for (int64_t channel = 0; channel < channels; channel++) low[channel] = high[channel] = 0.0f;
    for (int64_t part = 0; part < count; part++)
        for (int64_t channel = 0; channel < channels; channel++) {
            float part_low = job->parts[2 * channels * part + channel];
            float part_high = job->parts[2 * channels * part + channels + channel];
            low[channel] = part_low < low[channel] ? part_low : low[channel];
            high[channel] = part_high > high[channel] ? part_high : high[channel];
        }
    job->bounded = 1;
    for (int64_t channel = 0; channel < channels; channel++)
        set_channel(job, channel, derive(job->config, low[channel], high[channel]));
    lb_parallel(outer * slice, slice, threads, channel_range, job);
    free(memory);
    return 1;
}

/* fn over [0, n) in chunks of whole `grain` elements; over halves through stream.h's lb_half_tiles_range in
 * units of `unit` (grain, or a block dividing it) of at most a tile (0 otherwise, nothing written). */
static int units_parallel(affine_job *job, int64_t n, int64_t grain, int64_t unit, int threads, lb_range_fn fn) {
    if (job->streamed >= 0) {
        lb_parallel(n, grain, threads, fn, job);
        return 1;
    }
    int usable;
    lb_half_tiles plan = lb_half_tiles_of(fn, job, sizeof *job, &job->x, &job->out, &job->streamed, unit, 1, unit,
                                          &usable);
    if (usable) lb_parallel(n, grain, threads, lb_half_tiles_range, &plan);
    return usable;
}

/* Given parameters: the spec's scales (raw float32 values, rounded here as Affine._given_parameters does) and
 * zero points, each one value or one per channel of [outer, channels, inner]. */
static int given_pass(affine_job *job, int64_t outer, int threads) {
    const lb_affine_spec *c = job->config;
    if (job->channels < 1) return 1; /* no elements */
    void *memory = channel_memory(job, 0);
    if (!memory) return 0;
    job->bounded = 1;
    for (int64_t channel = 0; channel < job->channels; channel++) {
        float s = c->scales[c->scale_count == 1 ? 0 : channel];
        affine_params p;
        p.scale = round_scale(c->power_of_two ? ceil_power_of_two(s) : s, c->scale_dtype);
        p.inverse = 1.0f / p.scale;
        p.zero_point = c->zero_points[c->zero_point_count == 1 ? 0 : channel];
        p.bounded = values_bounded(p.scale, p.zero_point, c->clamp_low, c->clamp_high);
        set_channel(job, channel, p);
    }
    job->tensor = job->params[0];
    int64_t slice = job->channels * job->inner;
    int done = 1;
    if (job->channels == 1) lb_parallel(outer * slice, 64, threads, tensor_range, job);
    else done = units_parallel(job, outer * slice, slice, slice, threads, channel_range);
    free(memory);
    return done;
}

/* Affine quantization of x (float32, n elements) into out. layout TENSOR: min-max over all d0 elements; ROWS:
 * d0 rows of d1 elements, min-max per block of d2 along each row; CHANNELS: [d0, d1, d2], min-max per index of
 * d1; GIVEN: [d0, d1, d2] with the spec's scales and zero points (one, or one per index of d1). half (1
 * bfloat16, 2 float16): x and out hold halves, in every layout but CHANNELS: ROWS in whole blocks (of 16k
 * elements dividing the row) or else whole rows, GIVEN per channel in slices of d1 x d2, each at most a tile.
 * Returns 0 where memory ran out or halves come with another layout or size (nothing written: the caller
 * falls back), else 1. */
int lb_affine_f32(const float *x, float *out, int layout, int64_t d0, int64_t d1, int64_t d2,
                  const lb_affine_spec *spec, int half, int threads) {
    affine_job job = {x, out, d1, d2, d1, d2, NULL, NULL, NULL, NULL, 1, {1.0f, 1.0f, 0.0f, 1}, spec, NULL, 0};
    if (half && layout == LAYOUT_CHANNELS) return 0;
    job.streamed = lb_storage(layout == LAYOUT_TENSOR ? d0 : (layout == LAYOUT_ROWS ? d0 * d1 : d0 * d1 * d2), threads,
                              half);
    switch (layout) {
    case LAYOUT_TENSOR: return tensor_pass(&job, d0, threads);
    case LAYOUT_ROWS: /* whole_block_range takes any run of whole blocks */
        if (d2 % 16 == 0 && d1 % d2 == 0) return units_parallel(&job, d0 * d1, d1, d2, threads, whole_block_range);
        return units_parallel(&job, d0 * d1, d1, d1, threads, row_range);
    case LAYOUT_CHANNELS: return channel_pass(&job, d0, threads);
    default: return given_pass(&job, d0, threads);
    }
}
