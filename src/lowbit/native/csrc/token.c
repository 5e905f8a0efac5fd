/* Per-token (per-row) dynamic int8 quantization and the rescaling of the integer sums: the first and last
 * steps of the dynamic int8 Linear (ops/quant.py token_scales / token_float_codes, ops/kernels.py
 * token_rescale), with the same float operations in the same order as the eager code. */
#include "common.h"

/* With threads of our own, one thread up to this many elements (every MiniLM layer): these steps run right
 * after torch's integer GEMM, whose OpenMP workers keep spinning for a while, and a second thread of ours
 * competes with them for the cores (measured on 2 cores, 2112 x 384 -> 384 module: 0.98 ms with two threads
 * from 2^18 elements, 0.67 ms with one; the torch.compile steps on torch's own pool: 0.63 ms). On torch's
 * OpenMP pool (parallel.c) they thread from 2^16 elements: rescaling 2112 x 1536 sums 0.25 -> 0.15 ms. */
#define LB_TOKEN_THREADS_FROM ((int64_t)1 << 24)

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

/* A float's bits as an int32 whose order is the float order (negative values: magnitude bits flipped). */
static inline int32_t order_key(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }

/* The row's max and min (NaN if it holds one), from integer keys 16 lanes at a time, two sets of lanes so that
 * the running max / min are two short chains (integer max / min vectorise without fast-math; a float running
 * max is a chain the compiler keeps in order). Exact: the keys order every non-NaN float as the floats do. */
static void row_range(const float *row, int64_t columns, float *high, float *low) {
    int32_t top[32], bottom[32], nan[32];
    for (int j = 0; j < 32; j++) { top[j] = INT32_MIN; bottom[j] = INT32_MAX; nan[j] = 0; }
    const int64_t body = columns - columns % 32;
    for (int64_t k = 0; k < body; k += 32) {
        int32_t bits[32];
        memcpy(bits, row + k, sizeof bits);
        for (int j = 0; j < 32; j++) {
            nan[j] |= (bits[j] & 0x7fffffff) > 0x7f800000;
            int32_t key = order_key(bits[j]);
            top[j] = key > top[j] ? key : top[j];
            bottom[j] = key < bottom[j] ? key : bottom[j];
        }
    }
    int32_t most = INT32_MIN, least = INT32_MAX;
    int any_nan = 0;
    for (int j = 0; j < 32; j++) {
        any_nan |= nan[j];
        most = top[j] > most ? top[j] : most;
        least = bottom[j] < least ? bottom[j] : least;
    }
    for (int64_t k = body; k < columns; k++) {
        int32_t bits;
        memcpy(&bits, row + k, sizeof bits);
        any_nan |= (bits & 0x7fffffff) > 0x7f800000;
        int32_t key = order_key(bits);
        most = key > most ? key : most;
        least = key < least ? key : least;
    }
    /* order_key is its own inverse */
    *high = any_nan ? NAN : lb_float((uint32_t)order_key(most));
    *low = any_nan ? NAN : lb_float((uint32_t)order_key(least));
}

/* codes of one row into `out` (locals only, so the loop vectorises: no store can alias the job's fields) */
#define CODES_LOOP(TYPE, SCALED)                                                     \
    do {                                                                             \
        TYPE *restrict out = (TYPE *)job->codes + row * columns;                     \
        for (int64_t k = 0; k < columns; k++) {                                      \
            float scaled = SCALED;                                                   \
            out[k] = (TYPE)lb_clamp(rintf(scaled == scaled ? scaled : 0.0f), q_max); \
        }                                                                            \
    } while (0)

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
        const float inverse = 1.0f / scale, q_max = job->q_max;
        const int64_t columns = job->columns;
        if (job->offset) {
            if (job->float_codes) CODES_LOOP(float, (x[k] - offset) * inverse);
            else CODES_LOOP(int8_t, (x[k] - offset) * inverse);
        } else {
            if (job->float_codes) CODES_LOOP(float, x[k] * inverse);
            else CODES_LOOP(int8_t, x[k] * inverse);
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
    if (rows > 0 && columns > 0) lb_parallel_from(rows * columns, columns, threads, LB_TOKEN_THREADS_FROM, token_rows, &job);
}

typedef struct {
    const void *sums; /* int32, or float32 */
    float *out;
    int64_t columns;
    const float *scale, *weight_scale, *offset, *weight_sums, *bias;
    int float_sums;
} rescale_job;

/* In place on int32 sums (their buffer becomes the float32 result): each element read, through the output
 * pointer itself, before its result is written there (one pointer: no aliasing check keeps GCC from the
 * vector loop). */
static void rescale_row_in_place(const rescale_job *job, float *out, float scale, float offset) {
    for (int64_t n = 0; n < job->columns; n++) {
        int32_t code;
        memcpy(&code, out + n, sizeof code);
        float value = (float)code * scale * job->weight_scale[n];
        if (job->offset) value = value + offset * job->weight_sums[n];
        out[n] = job->bias ? value + job->bias[n] : value;
    }
}

static void rescale_rows(const void *context, int64_t begin, int64_t end) {
    const rescale_job *job = context;
    for (int64_t row = begin / job->columns; row < end / job->columns; row++) {
        float *out = job->out + row * job->columns;
        const float scale = job->scale[row];
        const float offset = job->offset ? job->offset[row] : 0.0f;
        if (!job->float_sums && (const void *)job->out == job->sums) {
            rescale_row_in_place(job, out, scale, offset);
            continue;
        }
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
 * out may be the sums themselves (in place: float32 sums, or int32 ones whose buffer becomes the float32 result). */
void lb_token_rescale_f32(const void *sums, float *out, int64_t rows, int64_t columns, const float *scale,
                          const float *weight_scale, const float *offset, const float *weight_sums,
                          const float *bias, int float_sums, int threads) {
    rescale_job job = {sums, out, columns, scale, weight_scale, offset, weight_sums, bias, float_sums};
    if (rows > 0 && columns > 0) lb_parallel_from(rows * columns, columns, threads, LB_TOKEN_THREADS_FROM, rescale_rows, &job);
}
