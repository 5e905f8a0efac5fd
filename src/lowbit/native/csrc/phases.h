/* lb_parallel_phases (parallel.c): several passes over one split of a job, with a serial step between them. */
#ifndef LOWBIT_PHASES_H
#define LOWBIT_PHASES_H

#include <stdint.h>

typedef void (*lb_phase_fn)(void *context, int64_t begin, int64_t end, int phase);
typedef int (*lb_between_fn)(void *context, int phase);
int lb_parallel_phases(int64_t n, int64_t grain, int threads, int phases, lb_phase_fn fn, lb_between_fn between,
                       void *context);

#endif
