/* One core's streaming read bandwidth from each level of the memory system,
 * as `CpuDesc::l3_bytes_per_cycle` and `memory_bytes_per_cycle` state it
 * (dialects/core/src/target.rs): for buffers of 1 to 128 MB, sums every f32
 * of the buffer on the widest vectors the compiler targets with -march=native,
 * four independent sums, and prints the best of five rounds as one JSON line
 * per size:
 *   {"mib": M, "gbps": G}
 * Usage: gcc -O2 -march=native scripts/mem_bw.c -o mem_bw && ./mem_bw */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vec.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    for (size_t mib = 1; mib <= 128; mib *= 2) {
        size_t n = (mib << 20) / sizeof(vec);
        vec *a = aligned_alloc(64, n * sizeof(vec));
        if (!a) {
            fprintf(stderr, "mem_bw: cannot allocate %zu MiB\n", mib);
            return 1;
        }
        for (size_t i = 0; i < n; i++) a[i] = (vec){0} + (float)(i & 7);
        double best = 0;
        float keep = 0;
        for (int round = 0; round < 5; round++) {
            vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
            double t = now();
            for (size_t i = 0; i + 4 <= n; i += 4) {
                s0 += a[i];
                s1 += a[i + 1];
                s2 += a[i + 2];
                s3 += a[i + 3];
            }
            t = now() - t;
            vec s = s0 + s1 + s2 + s3;
            keep += s[0];
            double gbps = (double)(n * sizeof(vec)) / t * 1e-9;
            if (gbps > best) best = gbps;
        }
        printf("{\"mib\": %zu, \"gbps\": %.1f}\n", mib, best);
        fprintf(stderr, "(%g)\n", keep);
        free(a);
    }
    return 0;
}
