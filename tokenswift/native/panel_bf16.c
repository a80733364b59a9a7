/* y = x @ W^T for a few float32 rows of x and a W that is exactly bfloat16, on AVX2: half the bytes of
   float32 panels, bitwise the same products.

   Why: on a CPU without AVX-512 or AMX (the AVX2 build of panel_mm.c), a decode step's weight products are
   bound by the bytes they stream from memory (the default model: 50 MB of float32 layer weights, 2.9 ms of
   a 4.7 ms step at 1K context on a 2-vCPU AVX2 EPYC host, about 17 GB/s). Its weights are bfloat16, so
   here they stay bfloat16 (25 MB, which also fits the 32 MB L3 such a host has) and are widened to
   float32 in registers: a bfloat16 is the top half of a float32, so widening is exact (a 16-bit shift),
   and every product and sum is then exactly what panel_mm.c computes from the float32 copy of the same
   weights. Greedy and sampled outputs do not change.

   Layout: as panel_mm.c's, in bfloat16: N / 32 panels of (K, 32), panel p holding columns 32p..32p+31 for
   every k, contiguous. Each output element is summed over k = 0..K-1 in order with fused multiply-adds,
   so a row of a many-row call is bitwise the one-row call. */
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>

#if defined(__AVX512F__) || !defined(__AVX2__) || !defined(__FMA__)
#error "panel_bf16 is for AVX2 CPUs without AVX-512 (those use float32 panels or AMX tiles)"
#endif

#define BF16_PANEL 32
#define BF16_GROUP 3           /* rows per pass: 3 x 4 accumulators + 3 broadcasts + 1 weight: 16 registers */
#define BF16_PREFETCH_ROWS 64  /* k-rows (4 KiB of bfloat16) ahead of the stream */

/* Eight bfloat16 as eight float32, exactly. */
static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define DEFINE_BF16_GROUP(R)                                                                         \
static void bf16_group##R(const float *x, const uint16_t *w, float *y, int k_dim, int n_dim) {      \
    __m256 acc[R][4];                                                                             \
    for (int r = 0; r < R; r++)                                                                   \
        for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();                               \
    for (int k = 0; k < k_dim; k++) {                                                             \
        const uint16_t *wk = w + (size_t)k * BF16_PANEL;                                          \
        _mm_prefetch((const char *)(wk + BF16_PREFETCH_ROWS * BF16_PANEL), _MM_HINT_T0);          \
        __m256 xv[R];  /* R broadcasts + one widened weight + 12 accumulators: 16 registers, no spill */ \
        for (int r = 0; r < R; r++) xv[r] = _mm256_set1_ps(x[(size_t)r * k_dim + k]);             \
        for (int i = 0; i < 4; i++) {                                                             \
            __m256 wv = widen8(wk + 8 * i);                                                       \
            for (int r = 0; r < R; r++) acc[r][i] = _mm256_fmadd_ps(xv[r], wv, acc[r][i]);         \
        }                                                                                         \
    }                                                                                             \
    for (int r = 0; r < R; r++)                                                                   \
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + (size_t)r * n_dim + 8 * i, acc[r][i]);    \
}

DEFINE_BF16_GROUP(1) DEFINE_BF16_GROUP(2) DEFINE_BF16_GROUP(3)

typedef void (*bf16_group_fn)(const float *, const uint16_t *, float *, int, int);
static const bf16_group_fn BF16_GROUPS[BF16_GROUP + 1] = {0, bf16_group1, bf16_group2, bf16_group3};

/* x: (m, k) row-major float32; panels: (n / 32, k, 32) bfloat16 bits; y: (m, n) row-major. n a multiple of
   32. Per panel (in the L2 cache after the first pass), rows go in passes of at most 3, split evenly. */
void panel_bf16(const float *x, const uint16_t *panels, float *y, int m, int k_dim, int n_dim) {
    int passes = (m + BF16_GROUP - 1) / BF16_GROUP;
    for (int p = 0; p < n_dim / BF16_PANEL; p++) {
        const uint16_t *w = panels + (size_t)p * k_dim * BF16_PANEL;
        int done = 0;
        for (int i = 0; i < passes; i++) {
            int rows = (m - done) / (passes - i);
            if ((m - done) % (passes - i)) rows++;
            BF16_GROUPS[rows](x + (size_t)done * k_dim, w, y + (size_t)done * n_dim + (size_t)p * BF16_PANEL, k_dim, n_dim);
            done += rows;
        }
    }
}
