/* What fma_peak.c and mem_bw.c share: the widest f32 vector the compiler
 * targets (-march=native), its lanes and a GCC/Clang vector type of them, a
 * monotonic clock in seconds, and their THREADS argument. */
#include <stdio.h>
#include <stdlib.h>
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

/* The THREADS argument (1 when absent), or 0 after saying on stderr, as
 * `tool`, why it is not a count from 1 to 1024. */
static int threads_arg(int argc, char **argv, const char *tool) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "%s: THREADS must be 1 to 1024, not `%s`\n", tool, argv[1]);
        return 0;
    }
    return threads;
}
