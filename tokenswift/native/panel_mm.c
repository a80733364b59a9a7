/* y = x @ W^T for a few rows of x, with W stored as column panels, streamed once from memory.

   Why: on a CPU one decode step is bound by the bytes of weights it reads, not by arithmetic. A
   vendor GEMM reads W once at one row but, for 2 to 16 rows, packs or re-reads it and ran 1.5 to 3x
   slower than one row here. This kernel keeps up to 12 rows' accumulators in registers and reads
   each weight panel once, with software prefetch ahead of the stream: 12 rows cost about 1.1x one row.

   Layout: W (N, K) is stored as N / 32 panels of (K, 32): panel p holds columns 32p..32p+31 for every
   k, contiguous. Every output element is summed over k = 0..K-1 in order with fused multiply-adds,
   whatever the number of rows, so one row of a many-row call is bitwise equal to a one-row call.

   panel_bf16: the same for a W that is exactly bfloat16, on AVX-512 or AVX2 CPUs: bfloat16 panels widened to
   float32 in registers, half the bytes of float32 panels and bitwise the same products. Their k rows are stored
   interleaved (panels.py's BF16_ORDER, see weights32_bf16), so that a shift and a mask widen them.

   Why: there a decode step's weight products are bound by the bytes they stream (the default model: 50 MB
   of float32 layer weights, 2.9 ms of a 4.7 ms step at 1K context on a 2-vCPU AVX2 EPYC host, about
   17 GB/s); its weights are bfloat16, so they stay bfloat16 (25 MB, which also fits the 32 MB L3 such a
   host has). Greedy and sampled outputs do not change. AVX-512 CPUs with AMX keep AMX tiles (panel_amx.c)
   where they serve; without AMX (an AMD EPYC with AVX-512, or TOKENSWIFT_AMX=0) these panels serve, and keep
   the AVX-512 build's passes of up to 12 rows. Measured on a 2-vCPU Sapphire Rapids host with AMX turned off
   (one thread, a training job sharing the host: fastest of 60 / 30 interleaved runs), one forward and its
   logits at 1K context for 1 / 4 / 8 rows: the default model 6.2 / 6.9 / 8.6 ms with float32 panels ->
   4.0 / 4.5 / 4.6 (AMX tiles 3.8 / 4.3 / 4.7; the forced AVX2 build's bfloat16 panels 4.2 / 5.2 / 6.8);
   SmolLM2-135M 47 / 55 / 66 -> 29 / 33 / 39 (AMX 29 / 31 / 38; AVX2 build 31 / 40 / 56).

   Both return 0, or KERNEL_BAD_ARGUMENTS for n not a positive multiple of 32, k < 1 or m < 0. */
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>
#include "kernels.h"

#if defined(__AVX512F__)
/* The same passes serve panels stored in bfloat16 (panel_bf16, for weights that are exactly bfloat16, as the
   default model's and SmolLM2's are), on AVX-512 CPUs without AMX (or where AMX cannot serve a shape): half the
   bytes to stream, and since a bfloat16 is the top half of a float32, widening it is exact (a 16-bit shift, or a
   mask of the top half of a pair), so every product and sum is bitwise panel_mm's on the float32 copy of the same
   weights. The widening costs one shift and one mask per k step whatever the number of rows (weights32_bf16); 12
   rows keep their 24 accumulators, the two widened weights, the broadcast and the mask in 28 of the 32 registers
   (no spill). Measured on
   a 2-vCPU Sapphire Rapids host (one thread, weights streamed from L3, a training job sharing the host; lower
   quartiles, microseconds for 1 / 4 / 8 / 12 rows): gate/up 2048x384 float32 275 / 321 / 368 / 366 -> bfloat16
   181 / 183 / 189 / 199 (AMX tiles 162 / 164 / 179 / 199; the AVX2 build's bfloat16 passes of 3 rows, in
   another process, 147 / 144 / 197 / 266); SmolLM2's LM head 49152x576 9.0 / 10.2 / 11.7 / 11.9 ms ->
   5.9 / 7.2 / 6.4 / 7.0. */

#define PANEL 32          /* output columns per panel: two 16-float registers */
#define MAX_GROUP 12      /* rows per pass: 12 x 2 accumulators + 2 weight registers fit in 32 (x is broadcast from memory) */
#define PREFETCH_BYTES 4096  /* prefetch this far ahead of the stream (32 k-rows of float32 panels, 64 of bfloat16) */

/* A k step's 32 weights as two 16-float registers, lo and hi. float32 panels: columns 0-15 and 16-31. bfloat16
   panels are stored interleaved (BF16_ORDER in panels.py): one 64-byte load holds 16 pairs, pair j the columns
   c(j) and c(j) + 8 (c(j) = j for j < 8, 8 + j for j >= 8), so a shift left by 16 bits makes the float32s of
   columns 0-7 and 16-23 (lo) and a mask of the top halves those of columns 8-15 and 24-31 (hi): one load and two
   single-cycle integer operations for 32 weights, where widening contiguous halves took two cross-lane zero
   extensions and two shifts. The products are the same; only the store puts the columns back in order. */
static inline void weights32_f32(const float *p, __m512 *lo, __m512 *hi) {
    *lo = _mm512_loadu_ps(p);
    *hi = _mm512_loadu_ps(p + 16);
}
static inline void weights32_bf16(const uint16_t *p, __m512 *lo, __m512 *hi) {
    __m512i pairs = _mm512_loadu_si512((const void *)p);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xFFFF0000u)));
}
static inline void store32_f32(float *y, __m512 lo, __m512 hi) {
    _mm512_storeu_ps(y, lo);
    _mm512_storeu_ps(y + 16, hi);
}
static inline void store32_bf16(float *y, __m512 lo, __m512 hi) {  /* lo: columns 0-7, 16-23; hi: 8-15, 24-31 */
    _mm256_storeu_ps(y, _mm512_castps512_ps256(lo));
    _mm256_storeu_ps(y + 8, _mm512_castps512_ps256(hi));
    _mm256_storeu_ps(y + 16, _mm512_extractf32x8_ps(lo, 1));
    _mm256_storeu_ps(y + 24, _mm512_extractf32x8_ps(hi, 1));
}

#define DEFINE_GROUP(NAME, WTYPE, LOAD, STORE, R)                                                      \
static void NAME##R(const float *x, const WTYPE *panels, float *y, int k_dim, int n_dim) {           \
    for (int p = 0; p < n_dim / PANEL; p++) {                                                     \
        const WTYPE *w = panels + (size_t)p * k_dim * PANEL;                                      \
        __m512 lo[R], hi[R];                                                                      \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                      \
            lo[r] = _mm512_setzero_ps(); hi[r] = _mm512_setzero_ps();                              \
        }                                                                                         \
        for (int k = 0; k < k_dim; k++) {                                                         \
            const WTYPE *wk = w + (size_t)k * PANEL;                                              \
            _Pragma("GCC unroll 2") for (int b = 0; b < (int)sizeof(WTYPE) * PANEL; b += 64)        \
                _mm_prefetch((const char *)wk + PREFETCH_BYTES + b, _MM_HINT_T0);                  \
            __m512 w_lo, w_hi;                                                                    \
            LOAD(wk, &w_lo, &w_hi);                                                               \
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                  \
                __m512 xv = _mm512_set1_ps(x[(size_t)r * k_dim + k]);                             \
                lo[r] = _mm512_fmadd_ps(xv, w_lo, lo[r]);                                         \
                hi[r] = _mm512_fmadd_ps(xv, w_hi, hi[r]);                                         \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++)                                        \
            STORE(y + (size_t)r * n_dim + (size_t)p * PANEL, lo[r], hi[r]);                        \
    }                                                                                             \
}

/* NAME(x, panels, y, m, k, n): x (m, k) row-major; panels (n / 32, k, 32) of WTYPE; y (m, n) row-major; n a
   multiple of 32. Rows are taken in groups of at most 12, split evenly (16 rows: 8 + 8). */
#define DEFINE_PRODUCT(NAME, WTYPE, LOAD, STORE)                                                       \
DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 1) DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 2)    \
DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 3) DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 4)    \
DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 5) DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 6)    \
DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 7) DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 8)    \
DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 9) DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 10)   \
DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 11) DEFINE_GROUP(NAME##_group, WTYPE, LOAD, STORE, 12)  \
int NAME(const float *x, const WTYPE *panels, float *y, int m, int k_dim, int n_dim) {             \
    if (m < 0 || k_dim < 1 || n_dim < PANEL || n_dim % PANEL) return KERNEL_BAD_ARGUMENTS;        \
    typedef void (*group_fn)(const float *, const WTYPE *, float *, int, int);                   \
    static const group_fn groups[MAX_GROUP + 1] = {                                                \
        0, NAME##_group1, NAME##_group2, NAME##_group3, NAME##_group4, NAME##_group5, NAME##_group6, \
        NAME##_group7, NAME##_group8, NAME##_group9, NAME##_group10, NAME##_group11, NAME##_group12}; \
    int passes = (m + MAX_GROUP - 1) / MAX_GROUP;                                                 \
    int done = 0;                                                                                 \
    for (int i = 0; i < passes; i++) {                                                            \
        int rows = (m - done) / (passes - i);                                                     \
        if ((m - done) % (passes - i)) rows++;                                                    \
        groups[rows](x + (size_t)done * k_dim, panels, y + (size_t)done * n_dim, k_dim, n_dim);    \
        done += rows;                                                                             \
    }                                                                                             \
    return 0;                                                                                     \
}

DEFINE_PRODUCT(panel_mm, float, weights32_f32, store32_f32)
DEFINE_PRODUCT(panel_bf16, uint16_t, weights32_bf16, store32_bf16)

#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (16 registers of 8 floats): a panel's 32 columns are four registers, so a pass keeps up to 3 rows'
   accumulators (12 registers, with 3 broadcasts and one weight register: all 16). The loop runs panel by
   panel, every pass of rows over a panel while it is in the L2 cache (the first pass reads it from memory),
   so W is still streamed from memory once.

   The same passes serve panels stored in bfloat16 (panel_bf16, for weights that are exactly bfloat16, as
   the default model's are): half the bytes to stream, and since a bfloat16 is the top half of a float32,
   widening it is exact (a 16-bit shift or a mask), so every product and sum is bitwise panel_mm's on the
   float32 copy of the same weights. */
#define PANEL 32
#define MAX_GROUP 3
#define PREFETCH_BYTES 4096  /* this far ahead of the stream */

/* Register i of a k step's 32 weights holds columns 8i..8i+7. bfloat16 panels are interleaved (see the AVX-512
   loads above): the 16 pairs of a 32-byte half h hold columns 16h + j and 16h + 8 + j in pair j, so a shift makes
   register 2h and a mask of the top halves register 2h + 1. */
static inline __m256 weights8_f32(const float *p, int i) { return _mm256_loadu_ps(p + 8 * i); }
static inline __m256 weights8_bf16(const uint16_t *p, int i) {
    __m256i pairs = _mm256_loadu_si256((const __m256i *)(p + 16 * (i >> 1)));
    return _mm256_castsi256_ps(i & 1 ? _mm256_and_si256(pairs, _mm256_set1_epi32((int)0xFFFF0000u))
                                     : _mm256_slli_epi32(pairs, 16));
}

/* PREFETCH is a pass's software prefetch at each k step: STREAM fetches ahead in the panel being read
   (a single pass streams W); NEXT_PANEL fetches the pass's share of the next panel (several passes: see below). */
#define PREFETCH_STREAM(WTYPE)                                                                       \
    for (int b = 0; b < (int)sizeof(WTYPE) * PANEL; b += 64)                                       \
        _mm_prefetch((const char *)wk + PREFETCH_BYTES + b, _MM_HINT_T0);
#define PREFETCH_NEXT_PANEL(WTYPE)                                                                   \
    _mm_prefetch(next + (ahead >> 16), _MM_HINT_T0);                                               \
    ahead += ahead_step;

#define DEFINE_GROUP(NAME, SUFFIX, PREFETCH, WTYPE, LOAD, R)                                         \
static void NAME##SUFFIX##R(const float *x, const WTYPE *w, float *y, int k_dim, int n_dim,          \
                            const char *next, size_t ahead, size_t ahead_step) {                  \
    (void)next; (void)ahead; (void)ahead_step;                                                    \
    __m256 acc[R][4];                                                                             \
    for (int r = 0; r < R; r++)                                                                   \
        for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();                               \
    for (int k = 0; k < k_dim; k++) {                                                             \
        const WTYPE *wk = w + (size_t)k * PANEL;                                                  \
        PREFETCH(WTYPE)                                                                           \
        __m256 xv[R];  /* R broadcasts + one weight register + 12 accumulators: 16 registers (bfloat16 at 3 rows: \
                          the mask constant is reloaded from the stack, an L1 read; measured no slower) */  \
        for (int r = 0; r < R; r++) xv[r] = _mm256_set1_ps(x[(size_t)r * k_dim + k]);             \
        for (int i = 0; i < 4; i++) {                                                             \
            __m256 wv = LOAD(wk, i);                                                              \
            for (int r = 0; r < R; r++) acc[r][i] = _mm256_fmadd_ps(xv[r], wv, acc[r][i]);         \
        }                                                                                         \
    }                                                                                             \
    for (int r = 0; r < R; r++)                                                                   \
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + (size_t)r * n_dim + 8 * i, acc[r][i]);    \
}

#define DEFINE_GROUPS(NAME, SUFFIX, PREFETCH, WTYPE, LOAD)                                           \
DEFINE_GROUP(NAME, SUFFIX, PREFETCH, WTYPE, LOAD, 1) DEFINE_GROUP(NAME, SUFFIX, PREFETCH, WTYPE, LOAD, 2) \
DEFINE_GROUP(NAME, SUFFIX, PREFETCH, WTYPE, LOAD, 3)

/* NAME(x, panels, y, m, k, n): x (m, k) row-major; panels (n / 32, k, 32) of WTYPE; y (m, n) row-major; n a
   multiple of 32. Per panel, rows are taken in passes of at most 3, split evenly.

   With one pass, the pass streams W with prefetches ahead of itself. With P passes, the later passes find the
   panel in the cache and are pure arithmetic, so a prefetch ahead of the first pass alone would leave memory
   idle for (P - 1) / P of the time (measured: 4 rows cost 1.5x 3 rows). Instead every pass prefetches 1 / P of
   the next panel (pass i its i-th share, evenly over its k steps), so the stream runs beside all the
   arithmetic. Prefetches change no result. */
#define DEFINE_PRODUCT(NAME, WTYPE, LOAD)                                                            \
DEFINE_GROUPS(NAME, _stream, PREFETCH_STREAM, WTYPE, LOAD)                                           \
DEFINE_GROUPS(NAME, _next, PREFETCH_NEXT_PANEL, WTYPE, LOAD)                                         \
int NAME(const float *x, const WTYPE *panels, float *y, int m, int k_dim, int n_dim) {             \
    if (m < 0 || k_dim < 1 || n_dim < PANEL || n_dim % PANEL) return KERNEL_BAD_ARGUMENTS;        \
    typedef void (*group_fn)(const float *, const WTYPE *, float *, int, int, const char *, size_t, size_t); \
    static const group_fn stream[MAX_GROUP + 1] = {0, NAME##_stream1, NAME##_stream2, NAME##_stream3}; \
    static const group_fn next[MAX_GROUP + 1] = {0, NAME##_next1, NAME##_next2, NAME##_next3};    \
    int passes = (m + MAX_GROUP - 1) / MAX_GROUP;                                                 \
    const group_fn *groups = passes == 1 ? stream : next;                                         \
    size_t panel_bytes = (size_t)k_dim * PANEL * sizeof(WTYPE);                                   \
    size_t step = ((size_t)PANEL * sizeof(WTYPE) << 16) / (size_t)passes;  /* 16.16 bytes per k step */ \
    for (int p = 0; p < n_dim / PANEL; p++) {                                                     \
        const WTYPE *w = panels + (size_t)p * k_dim * PANEL;                                      \
        const char *following = (const char *)w + panel_bytes;                                    \
        int done = 0;                                                                             \
        for (int i = 0; i < passes; i++) {                                                        \
            int rows = (m - done) / (passes - i);                                                 \
            if ((m - done) % (passes - i)) rows++;                                                \
            groups[rows](x + (size_t)done * k_dim, w, y + (size_t)done * n_dim + (size_t)p * PANEL, k_dim, n_dim, \
                         following, (size_t)i * k_dim * step, step);                              \
            done += rows;                                                                         \
        }                                                                                         \
    }                                                                                             \
    return 0;                                                                                     \
}

DEFINE_PRODUCT(panel_mm, float, weights8_f32)
DEFINE_PRODUCT(panel_bf16, uint16_t, weights8_bf16)
#else
#error "panel_mm needs AVX-512F, or AVX2 with FMA"
#endif

/* The instruction set this library was built for ("avx512" or "avx2"): what panels.describe() reports. */
const char *panel_isa(void) {
#if defined(__AVX512F__)
    return "avx512";
#else
    return "avx2";
#endif
}
