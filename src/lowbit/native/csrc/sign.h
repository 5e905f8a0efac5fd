/* Shared by the sign kernels: the element pass (sign_elements.c) that the whole formats (sign.c) end with. */
#ifndef LOWBIT_SIGN_H
#define LOWBIT_SIGN_H

#include <stdint.h>

enum { ELEMENT_TERNARY, ELEMENT_BIPOLAR, ELEMENT_UNIPOLAR };

/* x viewed as [outer, groups, inner] (sign.c); delta and value hold one float per group: the ternary
 * threshold, and the scale (1 unscaled). */
typedef struct {
    const float *x;
    float *out;
    int64_t groups, inner;
    int kind;
    const float *delta, *value;
} element_job;

/* The element pass over [begin, end) of an element_job (an lb_parallel range function). */
void lb_sign_element_range(const void *context, int64_t begin, int64_t end);

#endif
