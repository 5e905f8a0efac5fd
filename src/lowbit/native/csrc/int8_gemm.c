/* Exact int32 sums of 8-bit codes for CPUs whose int8 kernels saturate (AVX2 without VNNI).
 *
 * fbgemm and oneDNN add pairs of u8 x s8 products in saturating int16 there (vpmaddubsw), so full 8-bit codes
 * come out wrong. This kernel widens both operands to int16 and multiplies with vpmaddwd, which adds each pair
 * of int16 products into int32: |a| <= 255 and |w| <= 127 give pairs below 2^16 and sums exact for any K below
 * 2^31 / (255 * 127) (66,000 and more). Every route gives the same integers, so choosing this one changes
 * speed only.
 *
 * Layout: the weight codes [N, K] are packed once (lb_int8_pack) into panels of 16 output columns; in each
 * panel, for each pair of inputs k, k + 1, the 16 columns' two codes side by side (32 int16: one 256-bit
 * vector for columns 0-7, one for 8-15). K is padded to even and N to a multiple of 16 with zero codes.
 * The activation rows are widened to int16 block by block (BLOCK_ROWS rows) into a buffer of the thread's,
 * and a MICRO_ROWS x 16 tile of int32 sums is kept in twelve registers while a K chunk streams through. */
#include <stdlib.h>
#include "common.h"

#if defined(__AVX2__)
#include <immintrin.h>
#define LB_TILE_WRITES_OUT 1 /* the vector tile writes whole tiles to out itself */
#else
#define LB_TILE_WRITES_OUT 0
#endif

#define PANEL 16       /* output columns per packed panel */
#define MICRO_ROWS 6   /* rows of a register tile: 6 x 16 int32 sums in twelve 256-bit registers */
#define BLOCK_ROWS 48  /* rows widened at a time (eight tiles) */
#define K_CHUNK 256    /* inputs per pass over a tile: a panel's chunk is 8 KB of int16, held in L1 */

static inline int64_t padded_inner(int64_t inner) { return (inner + 1) & ~(int64_t)1; }
static inline int64_t panels(int64_t columns) { return (columns + PANEL - 1) / PANEL; }

/* Number of int16 elements lb_int8_pack writes for an [N, K] weight. */
int64_t lb_int8_packed_size(int64_t columns, int64_t inner) { return panels(columns) * padded_inner(inner) * PANEL; }

/* codes [N, K] int8 -> packed (lb_int8_packed_size elements). */
void lb_int8_pack(const int8_t *codes, int16_t *packed, int64_t columns, int64_t inner) {
    const int64_t pairs = padded_inner(inner) / 2;
    memset(packed, 0, sizeof(int16_t) * (size_t)lb_int8_packed_size(columns, inner));
    for (int64_t n = 0; n < columns; n++) {
        int16_t *panel = packed + (n / PANEL) * pairs * PANEL * 2 + (n % PANEL) * 2;
        for (int64_t k = 0; k < inner; k++) panel[(k / 2) * PANEL * 2 + (k & 1)] = codes[n * inner + k];
    }
}

typedef struct {
    const void *a; int a_unsigned; const int16_t *packed; int32_t *out;
    int64_t rows, inner, columns, panel_groups, panels_per_group;
    volatile int failed;
} gemm_job;

/* Stores (first chunk) or adds the tile's sums: rows x columns of it, into out. */
static inline void put(int32_t *out, int64_t stride, const int32_t *tile, int rows, int columns, int first) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < columns; j++) {
            if (first) out[r * stride + j] = tile[r * PANEL + j];
            else out[r * stride + j] += tile[r * PANEL + j];
        }
}

#if defined(__AVX2__)
/* MICRO_ROWS rows of a (int16, row stride lda, pairs read as one int32) against one panel chunk: into out
 * (row stride `stride`; stored when `first`, else added) when out is given (a whole 6 x 16 tile), else into
 * tile_sums for the caller to put. */
static void tile(const int16_t *a, int64_t lda, const int16_t *b, int64_t pairs, int32_t *tile_sums, int32_t *out,
                 int64_t stride, int first) {
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00;
    __m256i s30 = s00, s31 = s00, s40 = s00, s41 = s00, s50 = s00, s51 = s00;
    const int16_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda, *a5 = a + 5 * lda;
    for (int64_t p = 0; p < pairs; p++) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + p * 32));
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + p * 32 + 16));
        int32_t pair;
#define LB_ROW(R) \
        memcpy(&pair, a##R + 2 * p, sizeof pair); \
        { const __m256i v = _mm256_set1_epi32(pair); \
          s##R##0 = _mm256_add_epi32(s##R##0, _mm256_madd_epi16(v, b0)); \
          s##R##1 = _mm256_add_epi32(s##R##1, _mm256_madd_epi16(v, b1)); }
        LB_ROW(0) LB_ROW(1) LB_ROW(2) LB_ROW(3) LB_ROW(4) LB_ROW(5)
#undef LB_ROW
    }
    if (out) { /* a whole tile: the sums go straight from the registers to out (stored, or added to it) */
#define LB_PUT(R) \
        { __m256i *o0 = (__m256i *)(out + R * stride), *o1 = (__m256i *)(out + R * stride + 8); \
          if (first) { _mm256_storeu_si256(o0, s##R##0); _mm256_storeu_si256(o1, s##R##1); } \
          else { _mm256_storeu_si256(o0, _mm256_add_epi32(_mm256_loadu_si256(o0), s##R##0)); \
                 _mm256_storeu_si256(o1, _mm256_add_epi32(_mm256_loadu_si256(o1), s##R##1)); } }
        LB_PUT(0) LB_PUT(1) LB_PUT(2) LB_PUT(3) LB_PUT(4) LB_PUT(5)
#undef LB_PUT
        return;
    }
    __m256i *t = (__m256i *)tile_sums; /* 32-byte aligned by the caller */
    _mm256_store_si256(t + 0, s00); _mm256_store_si256(t + 1, s01); _mm256_store_si256(t + 2, s10);
    _mm256_store_si256(t + 3, s11); _mm256_store_si256(t + 4, s20); _mm256_store_si256(t + 5, s21);
    _mm256_store_si256(t + 6, s30); _mm256_store_si256(t + 7, s31); _mm256_store_si256(t + 8, s40);
    _mm256_store_si256(t + 9, s41); _mm256_store_si256(t + 10, s50); _mm256_store_si256(t + 11, s51);
}
#else
/* The same sums in portable C (targets without AVX2): products of int16 codes summed in int32, always into
 * tile_sums (out is for the vector path). */
static void tile(const int16_t *a, int64_t lda, const int16_t *b, int64_t pairs, int32_t *tile_sums, int32_t *out,
                 int64_t stride, int first) {
    (void)out; (void)stride; (void)first;
    for (int r = 0; r < MICRO_ROWS; r++) {
        int32_t sums[PANEL] = {0};
        for (int64_t p = 0; p < pairs; p++) {
            const int32_t x0 = a[r * lda + 2 * p], x1 = a[r * lda + 2 * p + 1];
            const int16_t *column = b + p * 32;
            for (int j = 0; j < 8; j++) {
                sums[j] += x0 * column[2 * j] + x1 * column[2 * j + 1];
                sums[8 + j] += x0 * column[16 + 2 * j] + x1 * column[16 + 2 * j + 1];
            }
        }
        memcpy(tile_sums + r * PANEL, sums, sizeof sums);
    }
}
#endif

/* Rows m0 .. m0 + BLOCK_ROWS - 1 of a, widened to int16 with zero padding (rows past the end, odd K). */
static void widen_block(const gemm_job *job, int16_t *block, int64_t m0, int64_t lda) {
    memset(block, 0, sizeof(int16_t) * (size_t)(BLOCK_ROWS * lda));
    const int64_t rows = job->rows - m0 < BLOCK_ROWS ? job->rows - m0 : BLOCK_ROWS;
    for (int64_t r = 0; r < rows; r++) {
        int16_t *row = block + r * lda;
        if (job->a_unsigned) {
            const uint8_t *source = (const uint8_t *)job->a + (m0 + r) * job->inner;
            for (int64_t k = 0; k < job->inner; k++) row[k] = source[k];
        } else {
            const int8_t *source = (const int8_t *)job->a + (m0 + r) * job->inner;
            for (int64_t k = 0; k < job->inner; k++) row[k] = source[k];
        }
    }
}

/* One unit of work: a block of rows against a group of panels. */
static void unit(const gemm_job *job, int16_t *block, int64_t index) {
    const int64_t lda = padded_inner(job->inner), pairs = lda / 2, all_panels = panels(job->columns);
    const int64_t m0 = (index / job->panel_groups) * BLOCK_ROWS;
    const int64_t first_panel = (index % job->panel_groups) * job->panels_per_group;
    const int64_t last_panel = first_panel + job->panels_per_group < all_panels ? first_panel + job->panels_per_group
                                                                                 : all_panels;
    const int64_t block_rows = job->rows - m0 < BLOCK_ROWS ? job->rows - m0 : BLOCK_ROWS;
    int32_t tile_sums[MICRO_ROWS * PANEL] __attribute__((aligned(32)));
    widen_block(job, block, m0, lda);
    for (int64_t p0 = 0; p0 < pairs; p0 += K_CHUNK / 2) {
        const int64_t chunk = pairs - p0 < K_CHUNK / 2 ? pairs - p0 : K_CHUNK / 2;
        for (int64_t panel = first_panel; panel < last_panel; panel++) {
            const int16_t *b = job->packed + (panel * pairs + p0) * PANEL * 2;
            const int64_t n0 = panel * PANEL;
            const int columns = (int)(job->columns - n0 < PANEL ? job->columns - n0 : PANEL);
            for (int64_t m = 0; m < block_rows; m += MICRO_ROWS) {
                const int rows = (int)(block_rows - m < MICRO_ROWS ? block_rows - m : MICRO_ROWS);
                int32_t *out = job->out + (m0 + m) * job->columns + n0;
                const int whole = rows == MICRO_ROWS && columns == PANEL;
                tile(block + m * lda + 2 * p0, lda, b, chunk, tile_sums, whole ? out : NULL, job->columns, p0 == 0);
                if (!whole || !LB_TILE_WRITES_OUT) put(out, job->columns, tile_sums, rows, columns, p0 == 0);
            }
        }
    }
}

static void gemm_range(const void *context, int64_t begin, int64_t end) {
    gemm_job *job = (gemm_job *)context;
    const int64_t work = BLOCK_ROWS * padded_inner(job->inner) * job->panels_per_group * PANEL;
    int16_t *block = aligned_alloc(64, ((sizeof(int16_t) * (size_t)(BLOCK_ROWS * padded_inner(job->inner)) + 63) / 64) * 64);
    if (!block) { job->failed = 1; return; }
    for (int64_t index = begin / work; index < end / work; index++) unit(job, block, index);
    free(block);
}

/* Threads of our own pay off from about 4M multiply-adds, on torch's OpenMP pool from fewer (parallel.c). */
#define LB_GEMM_THREADS_FROM ((int64_t)1 << 22)

/* out [M, N] int32 = a [M, K] (int8, or uint8 when a_unsigned) times the packed weight's codes, exactly.
 * Returns 0, or -1 when a work buffer could not be allocated (out is then incomplete). */
int lb_int8_gemm_s32(const void *a, int a_unsigned, const int16_t *packed, int32_t *out, int64_t rows, int64_t inner,
                     int64_t columns, int threads) {
    if (rows <= 0 || columns <= 0) return 0;
    if (inner <= 0) { memset(out, 0, sizeof(int32_t) * (size_t)(rows * columns)); return 0; }
    const int64_t row_blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS, all_panels = panels(columns);
    /* at least four units a thread where the panels allow it, so that a late thread does not hold up the rest */
    int64_t groups = (4 * (threads > 0 ? threads : 1) + row_blocks - 1) / row_blocks;
    if (groups > all_panels) groups = all_panels;
    if (groups < 1) groups = 1;
    const int64_t per_group = (all_panels + groups - 1) / groups;
    groups = (all_panels + per_group - 1) / per_group;
    gemm_job job = {a, a_unsigned, packed, out, rows, inner, columns, groups, per_group, 0};
    const int64_t work = BLOCK_ROWS * padded_inner(inner) * per_group * PANEL;
    lb_parallel_from(row_blocks * groups * work, work, threads, LB_GEMM_THREADS_FROM, gemm_range, &job);
    return job.failed ? -1 : 0;
}
