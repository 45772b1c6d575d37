/* The machine's FP32 fused-multiply-add peak, as the GEMM figures of
 * `make bench-peers` are set against it: every thread runs independent FMA
 * chains on the widest vectors the compiler targets with -march=native (16
 * lanes with AVX-512, 8 with AVX2), enough chains to cover the FMA latency of
 * both FMA ports, no memory traffic. Prints one JSON object:
 *   {"threads": T, "lanes": L, "gflops": G}
 * the best of several timed rounds. Usage: fma_peak [THREADS]. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "vec.h"

/* Independent chains, more than FMA latency x FMA ports (5 x 2 at most),
 * each in a register of its own beside m and c: 16 of AVX-512's 32
 * registers, 12 of AVX2's and SSE's 16 (16 chains there spill to the stack
 * and measured 66 GFLOP/s where 12 reach the 116 of AVX-512). */
#if defined(__AVX512F__)
#define CHAINS 16
#else
#define CHAINS 12
#endif
#define ITERATIONS 20000000L

static volatile float sink;

#define STEP(a) a = a * m + c
static void *chains(void *arg) {
    (void)arg;
    vec m, c;
    for (int l = 0; l < LANES; l++) {
        m[l] = 0.999999f;
        c[l] = 1e-6f;
    }
    /* The chains in named registers (not an array, which compilers keep in
     * memory); the last four only where CHAINS is 16. */
    vec a0 = c, a1 = c + c, a2 = a1 + c, a3 = a2 + c, a4 = a3 + c, a5 = a4 + c, a6 = a5 + c,
        a7 = a6 + c, a8 = a7 + c, a9 = a8 + c, a10 = a9 + c, a11 = a10 + c;
#if CHAINS == 16
    vec a12 = a11 + c, a13 = a12 + c, a14 = a13 + c, a15 = a14 + c;
#endif
    for (long n = 0; n < ITERATIONS; n++) {
        /* Opaque to the optimizer, so that every step stays an FMA. */
        __asm__ volatile("" : "+v"(m), "+v"(c));
        STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5); STEP(a6); STEP(a7);
        STEP(a8); STEP(a9); STEP(a10); STEP(a11);
#if CHAINS == 16
        STEP(a12); STEP(a13); STEP(a14); STEP(a15);
#endif
    }
    vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
#if CHAINS == 16
    s += a12 + a13 + a14 + a15;
#endif
    float total = 0;
    for (int l = 0; l < LANES; l++) total += s[l];
    sink = total;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = threads_arg(argc, argv, "fma_peak");
    if (!threads) return 1;
    pthread_t *ids = malloc(sizeof(pthread_t) * threads);
    double best = 0;
    for (int round = 0; round < 5; round++) {
        double start = now();
        for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, chains, NULL);
        for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
        double flops = 2.0 * LANES * CHAINS * (double)ITERATIONS * threads;
        double gflops = flops / (now() - start) / 1e9;
        if (gflops > best) best = gflops;
    }
    printf("{\"threads\": %d, \"lanes\": %d, \"gflops\": %.1f}\n", threads, LANES, best);
    free(ids);
    return 0;
}
