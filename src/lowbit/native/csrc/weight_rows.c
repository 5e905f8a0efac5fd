/* Weight rows rebuilt in float32 from a weight-only module's codes (the "dequantize" route: the float rows
 * then go to torch's float32 matmul): every value the reference's bit for bit, in one pass over the codes
 * where the module's torch code makes four or five over the whole weight. The kinds are linear.h's: int8 codes
 * times their row's scale (LB_INT8_CHANNEL) or group's (LB_INT8_GROUP), packed int4 through each group's
 * sixteen values computed once as the reference computes them ((j - zero) * scale, or j * scale + minimum with
 * the product rounded first: this file keeps -ffp-contract=off). */
#include "linear.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef struct {
    const void *codes; const uint8_t *zero_point; const float *scale, *minimum; float *out;
    int64_t inner, group;
    int kind;
} rows_job;

/* Elements from which threads of our own pay off (torch's pool: parallel.c's lower threshold). */
#define LB_ROWS_THREADS_FROM ((int64_t)1 << 20)

/* A group's bytes through its sixteen values: AVX-512 looks sixteen codes up with one permute and interleaves
 * the low and the high nibbles' values with two more; elsewhere a scalar loop over the table. */
static void int4_group(const uint8_t *in, float *to, int64_t half, const float values[16]) {
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 table = _mm512_loadu_ps(values);
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (; j + 16 <= half; j += 16) {
        const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(in + j)));
        const __m512 low = _mm512_permutexvar_ps(codes, table);
        const __m512 high = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
        _mm512_storeu_ps(to + 2 * j, _mm512_permutex2var_ps(low, first, high));
        _mm512_storeu_ps(to + 2 * j + 16, _mm512_permutex2var_ps(low, second, high));
    }
#endif
    for (; j < half; j++) {
        to[2 * j] = values[in[j] & 15];
        to[2 * j + 1] = values[in[j] >> 4];
    }
}

static void int4_row(const rows_job *job, int64_t n) {
    const int64_t groups = job->inner / job->group, half = job->group / 2;
    const uint8_t *bytes = (const uint8_t *)job->codes + n * (job->inner / 2);
    float *out = job->out + n * job->inner;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t at = n * groups + g;
        const float scale = job->scale[at];
        float values[16];
        for (int j = 0; j < 16; j++) {
            if (job->kind == LB_INT4_MIN) {
                const float product = (float)j * scale;
                values[j] = product + job->minimum[at];
            } else {
                values[j] = ((float)j - (float)job->zero_point[at]) * scale;
            }
        }
        int4_group(bytes + g * half, out + g * job->group, half, values);
    }
}

static void int8_row(const rows_job *job, int64_t n) {
    const int8_t *codes = (const int8_t *)job->codes + n * job->inner;
    float *out = job->out + n * job->inner;
    if (job->kind == LB_INT8_CHANNEL) {
        const float scale = job->scale[n];
        for (int64_t k = 0; k < job->inner; k++) out[k] = (float)codes[k] * scale;
        return;
    }
    const int64_t groups = job->inner / job->group;
    for (int64_t g = 0; g < groups; g++) {
        const float scale = job->scale[n * groups + g];
        for (int64_t k = g * job->group; k < (g + 1) * job->group; k++) out[k] = (float)codes[k] * scale;
    }
}

static void rows_range(const void *context, int64_t begin, int64_t end) {
    const rows_job *job = context;
    for (int64_t n = begin / job->inner; n < end / job->inner; n++) {
        if (job->kind == LB_INT4_ZERO || job->kind == LB_INT4_MIN) int4_row(job, n);
        else int8_row(job, n);
    }
}

/* codes, scales, zero points and minima of `rows` weight rows (each array starting at the first of them; the
 * shapes of lb_weight_linear_f32) -> out [rows, inner] float32. Returns 0, or -1 for sizes it does not take. */
int lb_weight_rows_f32(const void *codes, const uint8_t *zero_point, const float *scale, const float *minimum,
                       float *out, int64_t rows, int64_t inner, int64_t group, int kind, int threads) {
    if (rows < 0 || inner <= 0 || kind < LB_INT8_CHANNEL || kind > LB_INT8_GROUP) return -1;
    if (kind != LB_INT8_CHANNEL && (group <= 0 || inner % group)) return -1;
    if ((kind == LB_INT4_ZERO || kind == LB_INT4_MIN) && group % 2) return -1;
    if ((kind == LB_INT4_ZERO && !zero_point) || (kind == LB_INT4_MIN && !minimum)) return -1;
    rows_job job = {codes, zero_point, scale, minimum, out, inner, group, kind};
    lb_parallel_from(rows * inner, inner, threads, LB_ROWS_THREADS_FROM, rows_range, &job); /* whole rows */
    return 0;
}
