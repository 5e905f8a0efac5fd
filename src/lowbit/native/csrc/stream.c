/* When outputs stream past the cache (stream.h): from the size of the last-level cache as the C library
 * reports it, capped at 32 MiB (some virtual machines report the host's whole cache: 320 MB on a 2-core
 * guest whose CPU has 32 MB per core complex), 32 MiB where the library does not say. Tests lower it so
 * that every kernel's streamed path runs on small tensors. */
#include <stdint.h>
#include <unistd.h>
#include "stream.h"

#define LB_STREAM_CAP ((int64_t)32 << 20)

static volatile int64_t lb_stream_override = 0;
static volatile int64_t lb_stream_probed = 0;

static volatile int64_t lb_prefetch_override = 0;

/* Benchmarks: the block kernels' prefetch distance in floats (< 0: none; 0: stream.h's LB_PREFETCH_AHEAD). */
void lb_set_prefetch(int64_t floats) { lb_prefetch_override = floats; }
int64_t lb_prefetch_distance(void) {
    int64_t override = lb_prefetch_override;
    return override < 0 ? 0 : (override ? override : LB_PREFETCH_AHEAD);
}

/* bytes > 0: stream from outputs of that size on, on any number of threads (tests); 0: the library's own rule. */
void lb_set_stream_from(int64_t bytes) { lb_stream_override = bytes > 0 ? bytes : 0; }


static int64_t lb_cache_bytes(void) {
    long bytes = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return bytes > 0 && bytes < LB_STREAM_CAP ? (int64_t)bytes : LB_STREAM_CAP;
}

int64_t lb_stream_from(void) {
    if (lb_stream_override) return lb_stream_override;
    if (!lb_stream_probed) lb_stream_probed = lb_cache_bytes(); /* a race stores the same value */
    return lb_stream_probed;
}

/* stream.h's rule; an override from the tests streams on one thread too. */
int lb_streams(int64_t elements, int threads) {
    return (threads > 1 || lb_stream_override != 0) && elements >= lb_stream_from() / 4;
}
