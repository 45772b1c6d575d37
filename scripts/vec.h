/* What fma_peak.c and mem_bw.c share: the widest f32 vector the compiler
 * targets (-march=native), its lanes and a GCC/Clang vector type of them, and
 * a monotonic clock in seconds. */
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
