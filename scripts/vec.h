/* The widest f32 vector the compiler targets (-march=native): its lanes and
 * a GCC/Clang vector type of them. Shared by fma_peak.c and mem_bw.c. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));
