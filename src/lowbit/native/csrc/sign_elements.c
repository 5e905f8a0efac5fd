/* Sign formats' element passes (formats/binary.py, ternary.py): every element to +-value, 0 or itself (NaN)
 * by its group's threshold and scale (sign.h). */
#include "lanes.h"
#include "sign.h"
#include "stream.h"

static inline float element_value(float v, int kind, float delta, float value) {
    float result;
    if (kind == ELEMENT_TERNARY) /* ((x > delta) - (x < -delta)) * value, for a value >= 0: +-value or +0 */
        result = v > delta ? value : (v < -delta ? -1.0f * value : 0.0f);
    else if (kind == ELEMENT_BIPOLAR)
        result = v >= 0.0f ? value : -1.0f * value;
    else
        result = v > 0.0f ? value : 0.0f * value;
    return v != v ? v : result;
}

/* element_value on a vector of lanes of one group, as bit selects (a loop of element_value vectorises with
 * AVX-512 masks, not with AVX2's blends). below = -1 * value, between = the value's "neither" result. */
ALWAYS_INLINE lanes_f element_lanes(lanes_f v, int kind, lanes_f delta, lanes_i above, lanes_i below, lanes_i between) {
    lanes_i upper, lower, result;
    if (kind == ELEMENT_TERNARY) upper = v > delta, lower = v < -delta;
    else if (kind == ELEMENT_BIPOLAR) upper = v >= 0.0f, lower = ~upper;
    else upper = v > 0.0f, lower = lanes_of(0);
    result = (above & upper) | (below & lower) | (between & ~(upper | lower));
    lanes_i nan = v != v;
    return (lanes_f)(((lanes_i)v & nan) | (result & ~nan));
}

ALWAYS_INLINE void element_run(const float *x, float *out, int64_t length, int kind, float delta, float value) {
    float between = kind == ELEMENT_UNIPOLAR ? 0.0f * value : 0.0f;
    lanes_f delta_lanes = lanes_float(delta);
    lanes_i above = lanes_of((int32_t)lb_bits(value)), below = lanes_of((int32_t)lb_bits(-1.0f * value));
    lanes_i neither = lanes_of((int32_t)lb_bits(between));
    int64_t k = 0;
    for (; k + LANES <= length; k += LANES) {
        lanes_f result = element_lanes((lanes_f)lanes_load(x + k), kind, delta_lanes, above, below, neither);
        memcpy(out + k, &result, sizeof result);
    }
    if (k < length) {
        lanes_f result = element_lanes((lanes_f)lanes_load_tail(x + k, length - k), kind, delta_lanes, above, below, neither);
        memcpy(out + k, &result, (size_t)(length - k) * sizeof(float));
    }
}

/* Consecutive groups along a row (inner == 1): element k of the run takes group k's threshold and value, a
 * vector of groups at a time (the scalar loop vectorised with AVX-512 masks only), the rest one by one. */
ALWAYS_INLINE void element_row(const float *x, float *out, int64_t length, int kind, const float *delta,
                               const float *value) {
    int64_t k = 0;
    for (; k + LANES <= length; k += LANES) {
        lanes_f values = (lanes_f)lanes_load(value + k);
        lanes_f between = kind == ELEMENT_UNIPOLAR ? 0.0f * values : (lanes_f)lanes_of(0);
        lanes_f result = element_lanes((lanes_f)lanes_load(x + k), kind, (lanes_f)lanes_load(delta + k),
                                       (lanes_i)values, (lanes_i)(-1.0f * values), (lanes_i)between);
        memcpy(out + k, &result, sizeof result);
    }
    for (; k < length; k++) out[k] = element_value(x[k], kind, delta[k], value[k]);
}

#define ELEMENT_RUN(KIND) element_run(x, out, length, KIND, job->delta[g], job->value[g])
#define ELEMENT_ROW(KIND) element_row(x, out, length, KIND, job->delta + g, job->value + g)

/* Runs of one group (or of consecutive groups along a row, inner == 1), each at most a tile when streamed. */
void lb_sign_element_range(const void *context, int64_t begin, int64_t end) {
    const element_job *job = context;
    lb_sink sink;
    lb_sink_open(&sink, job->out, job->streamed);
    for (int64_t i = begin; i < end;) {
        int64_t g = (i / job->inner) % job->groups, run_end;
        if (job->groups == 1 || job->inner > 1) run_end = job->groups == 1 ? end : (i / job->inner + 1) * job->inner;
        else run_end = i - g + job->groups;
        int64_t length = lb_sink_span(&sink, (run_end < end ? run_end : end) - i);
        const float *x = job->x + i;
        float *out = lb_sink_next(&sink, i, length);
        if (job->groups == 1 || job->inner > 1) { /* one group over the run */
            switch (job->kind) {
            case ELEMENT_TERNARY: ELEMENT_RUN(ELEMENT_TERNARY); break;
            case ELEMENT_BIPOLAR: ELEMENT_RUN(ELEMENT_BIPOLAR); break;
            default: ELEMENT_RUN(ELEMENT_UNIPOLAR); break;
            }
        } else { /* inner == 1: consecutive elements, consecutive groups up to the row's end */
            switch (job->kind) {
            case ELEMENT_TERNARY: ELEMENT_ROW(ELEMENT_TERNARY); break;
            case ELEMENT_BIPOLAR: ELEMENT_ROW(ELEMENT_BIPOLAR); break;
            default: ELEMENT_ROW(ELEMENT_UNIPOLAR); break;
            }
        }
        i += length;
    }
    lb_sink_close(&sink);
}
