/* y = x @ W^T for a few rows of float32 x and a W held as GGUF Q4_1 blocks (q4_blocks.h), on AVX-512 or AVX2.

   Why: see q4_blocks.h. The weights stream as 5 bits each instead of bfloat16's 16, and the product is one over
   the model's own bfloat16 weights, rebuilt exactly in registers. (AMX CPUs use panel_q4_amx in panel_amx.c.)

   How: per 16 output rows, the strip of their groups is rebuilt into float32 scratch (16 x k floats, in the
   core's caches), then every pass of up to Q4_MAX_ROWS rows of x runs over it, four outputs at a time, each output
   an accumulator of LANES partial sums over k (k = i, i + LANES, ...) added up at the end in a fixed order. A
   row's result depends on that row and W alone, the same sums in the same order for any number of rows: a row of
   a many-row call is bitwise the one-row call. (The sums run in another order than panel_mm's, so the results are
   W's products to float32 rounding, not bitwise panel_bf16's.) The next strip's groups are prefetched while one
   is rebuilt. Measured against the bfloat16 panels in docs/performance.md. */
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>
#include "kernels.h"
#include "q4_blocks.h"

#define Q4_COLS 4  /* outputs per pass */
#if defined(__AVX512F__)
#define Q4_MAX_ROWS 4  /* 16 accumulators, 4 rows of x and a weight register: 21 of 32 registers */
#define LANES 16
typedef __m512 q4vec;
#define Q4V_ZERO _mm512_setzero_ps
#define Q4V_LOAD _mm512_loadu_ps
#define Q4V_FMA _mm512_fmadd_ps
static inline float q4v_sum(__m512 v) {  /* halves, then halves of those */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(b);
}
#else
#define Q4_MAX_ROWS 2  /* 8 accumulators, 2 rows of x and a weight register: 11 of 16 registers */
#define LANES 8
typedef __m256 q4vec;
#define Q4V_ZERO _mm256_setzero_ps
#define Q4V_LOAD _mm256_loadu_ps
#define Q4V_FMA _mm256_fmadd_ps
static inline float q4v_sum(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(b);
}
#endif

/* R rows of x (R, k) over a rebuilt strip (16, k): y[r][c] for the strip's 16 outputs (y's row stride n). */
#define DEFINE_PASS(R)                                                                                 \
static void q4_pass##R(const float *x, const float *strip, float *y, int k, int n) {                \
    for (int c0 = 0; c0 < Q4_ROWS; c0 += Q4_COLS) {                                                 \
        q4vec acc[R][Q4_COLS];                                                                        \
        for (int r = 0; r < R; r++)                                                                   \
            for (int c = 0; c < Q4_COLS; c++) acc[r][c] = Q4V_ZERO();                                 \
        const float *w = strip + (size_t)c0 * k;                                                      \
        for (int i = 0; i < k; i += LANES)                                                            \
            for (int r = 0; r < R; r++) {                                                             \
                q4vec xv = Q4V_LOAD(x + (size_t)r * k + i);                                           \
                for (int c = 0; c < Q4_COLS; c++)                                                     \
                    acc[r][c] = Q4V_FMA(Q4V_LOAD(w + (size_t)c * k + i), xv, acc[r][c]);              \
            }                                                                                         \
        for (int r = 0; r < R; r++)                                                                   \
            for (int c = 0; c < Q4_COLS; c++) y[(size_t)r * n + c0 + c] = q4v_sum(acc[r][c]);         \
    }                                                                                                 \
}
DEFINE_PASS(1)
DEFINE_PASS(2)
#if Q4_MAX_ROWS > 2
DEFINE_PASS(3)
DEFINE_PASS(4)
#endif

/* Rebuild the strip of outputs nb*16 .. nb*16 + 15 into (16, k) floats, prefetching the next strip's groups. */
static void rebuild_strip(const uint8_t *w, int k, int nb, int strips, float *strip) {
    float d[16], m[16];
    for (int kb = 0; kb < k / Q4_K; kb++) {
        const uint8_t *group = q4_group(w, k, nb, kb);
        if (nb + 1 < strips)
            for (long b = 0; b < Q4_GROUP_BYTES; b += 64)
                _mm_prefetch((const char *)group + (long)(k / Q4_K) * Q4_GROUP_BYTES + b, _MM_HINT_T0);
        q4_scales(group, d, m);
        for (int i = 0; i < Q4_ROWS; i++) q4_row_floats(group, d, m, i, strip + (size_t)i * k + kb * Q4_K);
    }
}

static int q4_shape_ok(int m, int k, int n) {
    return m >= 0 && k >= Q4_K && k % Q4_K == 0 && n >= Q4_ROWS && n % Q4_ROWS == 0;
}

long panel_q4_scratch(int m, int k) {
    (void)m;
    return k < 1 ? 0 : (long)Q4_ROWS * k * (long)sizeof(float);
}

/* x (m, k) row-major; w: groups as in q4_blocks.h; y (m, n) row-major; scratch: panel_q4_scratch(m, k) bytes.
   Returns 0, KERNEL_BAD_ARGUMENTS (k not a multiple of 32, n not of 16) or KERNEL_SMALL_SCRATCH. */
int panel_q4(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes) {
    if (!q4_shape_ok(m, k, n)) return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_bytes < panel_q4_scratch(m, k)) return KERNEL_SMALL_SCRATCH;
    typedef void (*pass_fn)(const float *, const float *, float *, int, int);
#if Q4_MAX_ROWS > 2
    static const pass_fn passes[Q4_MAX_ROWS + 1] = {0, q4_pass1, q4_pass2, q4_pass3, q4_pass4};
#else
    static const pass_fn passes[Q4_MAX_ROWS + 1] = {0, q4_pass1, q4_pass2};
#endif
    float *strip = (float *)scratch;
    int strips = n / Q4_ROWS;
    for (int nb = 0; nb < strips; nb++) {
        rebuild_strip(w, k, nb, strips, strip);
        for (int done = 0; done < m;) {
            int rows = m - done < Q4_MAX_ROWS ? m - done : Q4_MAX_ROWS;
            passes[rows](x + (size_t)done * k, strip, y + (size_t)done * n + (size_t)nb * Q4_ROWS, k, n);
            done += rows;
        }
    }
    return 0;
}

/* W's float32 values (n, k) row-major, as the kernels rebuild them (the self-check's). 0 or KERNEL_BAD_ARGUMENTS. */
int q4_dequantize(const uint8_t *w, int n, int k, float *out) {
    if (!q4_shape_ok(0, k, n)) return KERNEL_BAD_ARGUMENTS;
    float d[16], m[16];
    for (int nb = 0; nb < n / Q4_ROWS; nb++)
        for (int kb = 0; kb < k / Q4_K; kb++) {
            const uint8_t *group = q4_group(w, k, nb, kb);
            q4_scales(group, d, m);
            for (int i = 0; i < Q4_ROWS; i++) q4_row_floats(group, d, m, i, out + (size_t)(nb * Q4_ROWS + i) * k + kb * Q4_K);
        }
    return 0;
}
