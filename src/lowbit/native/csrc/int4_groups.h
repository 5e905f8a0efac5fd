/* Shared by the int4 group fitters (gptq.c, hqq.c): the weight transposed, [inputs, rows], a tile of rows in
 * the vector lanes; the scale's storage dtypes; codes clamped to 0..15. */
#ifndef LOWBIT_INT4_GROUPS_H
#define LOWBIT_INT4_GROUPS_H

#include "common.h"
#include "half.h"

#define TILE 64 /* rows a task works on at once: a 128-column block of them is 32 KB */

enum { SCALE_FLOAT32, SCALE_BFLOAT16, SCALE_FLOAT16 }; /* numbered as lowbit.native.interface.INT4_SCALE_TYPES */

/* v rounded to the scale's storage dtype and widened again (torch's .to(dtype).float(); callers keep |v| within
 * the dtype's range, so nothing saturates). */
static inline float stored(float v, int type) {
    if (type == SCALE_BFLOAT16) return lb_float((uint32_t)bfloat16_of(lb_bits(v)) << 16);
    if (type == SCALE_FLOAT16) return lb_float(float32_of_half(float16_of_bits(lb_bits(v))));
    return v;
}

static inline float clamp_code(float q) { return q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q); }

#endif
