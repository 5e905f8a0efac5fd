/* Per-token (per-row) dynamic int8 quantization and the rescaling of the integer sums: the first and last
 * steps of the dynamic int8 Linear (ops/quant.py token_scales / token_float_codes, ops/kernels.py
 * token_rescale), with the same float operations in the same order as the eager code. */
#include "common.h"

typedef struct {
    const float *x;
    void *codes; /* int8 or integer-valued float32 */
    float *scale, *offset; /* [rows]; offset NULL when symmetric */
    int64_t columns;
    float q_max, inverse_q_max, half_inverse_q_max, tiny;
    int float_codes;
} token_job;

/* torch.maximum / minimum: NaN wins. */
static inline float nan_max(float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }

static void row_range(const float *row, int64_t columns, float *high, float *low) {
    float top = row[0], bottom = row[0];
    int nan = 0;
    for (int64_t k = 0; k < columns; k++) {
        float v = row[k];
        nan |= v != v;
        top = v > top ? v : top;
        bottom = v < bottom ? v : bottom;
    }
    *high = nan ? NAN : top;
    *low = nan ? NAN : bottom;
}

static void token_rows(const void *context, int64_t begin, int64_t end) {
    const token_job *job = context;
    for (int64_t row = begin / job->columns; row < end / job->columns; row++) {
        const float *x = job->x + row * job->columns;
        float high, low, scale, offset = 0.0f;
        row_range(x, job->columns, &high, &low);
        if (job->offset) {
            offset = (high + low) * 0.5f;
            scale = (high - low) * job->half_inverse_q_max;
            job->offset[row] = offset;
        } else {
            scale = nan_max(high, -low) * job->inverse_q_max;
        }
        scale = scale < job->tiny ? job->tiny : scale; /* clamp_min: NaN stays */
        job->scale[row] = scale;
        float inverse = 1.0f / scale;
        if (job->float_codes) {
            float *out = (float *)job->codes + row * job->columns;
            for (int64_t k = 0; k < job->columns; k++) {
                float scaled = (job->offset ? x[k] - offset : x[k]) * inverse;
                out[k] = lb_clamp(rintf(scaled == scaled ? scaled : 0.0f), job->q_max);
            }
        } else {
            int8_t *out = (int8_t *)job->codes + row * job->columns;
            for (int64_t k = 0; k < job->columns; k++) {
                float scaled = (job->offset ? x[k] - offset : x[k]) * inverse;
                out[k] = (int8_t)lb_clamp(rintf(scaled == scaled ? scaled : 0.0f), job->q_max);
            }
        }
    }
}

/* x [rows, columns] float32 -> codes (int8, or float32 when float_codes), scale [rows], offset [rows] (NULL:
 * symmetric). inverse_q_max = (float)(1.0 / q_max), half_inverse_q_max = (float)(0.5 / q_max), computed by
 * the caller exactly as the eager code's Python scalars are. */
void lb_token_quantize_f32(const float *x, void *codes, int64_t rows, int64_t columns, float *scale, float *offset,
                           float q_max, float inverse_q_max, float half_inverse_q_max, float tiny, int float_codes,
                           int threads) {
    token_job job = {x, codes, scale, offset, columns, q_max, inverse_q_max, half_inverse_q_max, tiny, float_codes};
    if (rows > 0 && columns > 0) lb_parallel(rows * columns, columns, threads, token_rows, &job);
}

typedef struct {
    const void *sums; /* int32, or float32 */
    float *out;
    int64_t columns;
    const float *scale, *weight_scale, *offset, *weight_sums, *bias;
    int float_sums;
} rescale_job;

static void rescale_rows(const void *context, int64_t begin, int64_t end) {
    const rescale_job *job = context;
    for (int64_t row = begin / job->columns; row < end / job->columns; row++) {
        float *out = job->out + row * job->columns;
        const float scale = job->scale[row];
        const float offset = job->offset ? job->offset[row] : 0.0f;
        for (int64_t n = 0; n < job->columns; n++) {
            float acc = job->float_sums ? ((const float *)job->sums)[row * job->columns + n]
                                        : (float)((const int32_t *)job->sums)[row * job->columns + n];
            float value = acc * scale * job->weight_scale[n];
            if (job->offset) value = value + offset * job->weight_sums[n];
            out[n] = job->bias ? value + job->bias[n] : value;
        }
    }
}

/* out [rows, columns] = sums * scale[row] * weight_scale[n] (+ offset[row] * weight_sums[n]) (+ bias[n]);
 * out may be the float32 sums themselves (in place). */
void lb_token_rescale_f32(const void *sums, float *out, int64_t rows, int64_t columns, const float *scale,
                          const float *weight_scale, const float *offset, const float *weight_sums,
                          const float *bias, int float_sums, int threads) {
    rescale_job job = {sums, out, columns, scale, weight_scale, offset, weight_sums, bias, float_sums};
    if (rows > 0 && columns > 0) lb_parallel(rows * columns, columns, threads, rescale_rows, &job);
}
