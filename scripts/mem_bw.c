/* A core's streaming read bandwidth from each level of the memory system,
 * as `CpuDesc::l3_bytes_per_cycle` and `memory_bytes_per_cycle` state it
 * (dialects/core/src/target.rs): for buffers of 1 to 128 MB, each of THREADS
 * threads (1 unless given) sums every f32 of a buffer of its own on the
 * widest vectors the compiler targets with -march=native, four independent
 * sums, all threads at once; prints the best of ROUNDS (5) rounds, per thread, as
 * one JSON line per size:
 *   {"threads": T, "mib": M, "gbps": G}
 * With as many threads as the cores a program runs on, G is what each core
 * gets while all of them stream (the figure the target states).
 * Usage: gcc -O2 -march=native -pthread scripts/mem_bw.c -o mem_bw && ./mem_bw [THREADS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "vec.h"

/* Timed rounds per size; the best counts. */
#define ROUNDS 5

static pthread_barrier_t start;
static size_t n;
static volatile float sink;

/* One thread's buffer, the seconds each of its rounds took, and a lane of
 * its sums (kept, so that the sums are not optimized away). */
struct job {
    vec *a;
    double seconds[ROUNDS];
    float keep;
};

/* Sums its buffer ROUNDS times, each round after a barrier that every thread
 * waits at, so that all of them stream at once; times its own rounds. */
static void *stream(void *arg) {
    struct job *job = arg;
    vec *a = job->a;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(&start);
        double t = now();
        vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (size_t i = 0; i + 4 <= n; i += 4) {
            s0 += a[i];
            s1 += a[i + 1];
            s2 += a[i + 2];
            s3 += a[i + 3];
        }
        vec s = s0 + s1 + s2 + s3;
        job->keep += s[0];
        job->seconds[round] = now() - t;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = threads_arg(argc, argv, "mem_bw");
    if (!threads) return 1;
    pthread_t *ids = calloc(threads, sizeof *ids);
    struct job *jobs = calloc(threads, sizeof *jobs);
    if (!ids || !jobs) {
        fprintf(stderr, "mem_bw: out of memory\n");
        return 1;
    }
    for (size_t mib = 1; mib <= 128; mib *= 2) {
        n = (mib << 20) / sizeof(vec);
        for (int t = 0; t < threads; t++) {
            jobs[t].a = aligned_alloc(64, n * sizeof(vec));
            if (!jobs[t].a) {
                fprintf(stderr, "mem_bw: cannot allocate %d x %zu MiB\n", threads, mib);
                return 1;
            }
            for (size_t i = 0; i < n; i++) jobs[t].a[i] = (vec){0} + (float)(i & 7);
        }
        pthread_barrier_init(&start, NULL, threads);
        for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, stream, &jobs[t]);
        for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
        /* Per round the slowest thread's time; the best round. */
        double best = 0;
        for (int round = 0; round < ROUNDS; round++) {
            double slowest = 0;
            for (int t = 0; t < threads; t++)
                if (jobs[t].seconds[round] > slowest) slowest = jobs[t].seconds[round];
            double gbps = (double)(n * sizeof(vec)) / slowest * 1e-9;
            if (gbps > best) best = gbps;
        }
        for (int t = 0; t < threads; t++) {
            sink += jobs[t].keep;
            free(jobs[t].a);
        }
        pthread_barrier_destroy(&start);
        printf("{\"threads\": %d, \"mib\": %zu, \"gbps\": %.1f}\n", threads, mib, best);
    }
    free(ids);
    free(jobs);
    return 0;
}
