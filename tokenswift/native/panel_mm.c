/* y = x @ W^T for a few rows of x, with W stored as column panels, streamed once from memory.

   Why: on a CPU one decode step is bound by the bytes of weights it reads, not by arithmetic. A
   vendor GEMM reads W once at one row but, for 2 to 16 rows, packs or re-reads it and ran 1.5 to 3x
   slower than one row here. This kernel keeps up to 12 rows' accumulators in registers and reads
   each weight panel once, with software prefetch ahead of the stream: 12 rows cost about 1.1x one row.

   Layout: W (N, K) is stored as N / 32 panels of (K, 32): panel p holds columns 32p..32p+31 for every
   k, contiguous. Every output element is summed over k = 0..K-1 in order with fused multiply-adds,
   whatever the number of rows, so one row of a many-row call is bitwise equal to a one-row call. */
#include <stddef.h>
#include <immintrin.h>

#if defined(__AVX512F__)

#define PANEL 32          /* output columns per panel: two 16-float registers */
#define MAX_GROUP 12      /* rows per pass: 12 x 2 accumulators + 2 weight registers fit in 32 (x is broadcast from memory) */
#define PREFETCH_ROWS 32  /* prefetch this many k-rows (4 KiB) ahead of the stream */

#define DEFINE_GROUP(R)                                                                              \
static void group##R(const float *x, const float *panels, float *y, int k_dim, int n_dim) {         \
    for (int p = 0; p < n_dim / PANEL; p++) {                                                     \
        const float *w = panels + (size_t)p * k_dim * PANEL;                                      \
        __m512 lo[R], hi[R];                                                                      \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                      \
            lo[r] = _mm512_setzero_ps(); hi[r] = _mm512_setzero_ps();                              \
        }                                                                                         \
        for (int k = 0; k < k_dim; k++) {                                                         \
            const float *wk = w + (size_t)k * PANEL;                                              \
            _mm_prefetch((const char *)(wk + PREFETCH_ROWS * PANEL), _MM_HINT_T0);                \
            _mm_prefetch((const char *)(wk + PREFETCH_ROWS * PANEL + 16), _MM_HINT_T0);           \
            __m512 w_lo = _mm512_loadu_ps(wk), w_hi = _mm512_loadu_ps(wk + 16);                    \
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                  \
                __m512 xv = _mm512_set1_ps(x[(size_t)r * k_dim + k]);                             \
                lo[r] = _mm512_fmadd_ps(xv, w_lo, lo[r]);                                         \
                hi[r] = _mm512_fmadd_ps(xv, w_hi, hi[r]);                                         \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                      \
            _mm512_storeu_ps(y + (size_t)r * n_dim + (size_t)p * PANEL, lo[r]);                    \
            _mm512_storeu_ps(y + (size_t)r * n_dim + (size_t)p * PANEL + 16, hi[r]);               \
        }                                                                                         \
    }                                                                                             \
}

DEFINE_GROUP(1) DEFINE_GROUP(2) DEFINE_GROUP(3) DEFINE_GROUP(4)
DEFINE_GROUP(5) DEFINE_GROUP(6) DEFINE_GROUP(7) DEFINE_GROUP(8)
DEFINE_GROUP(9) DEFINE_GROUP(10) DEFINE_GROUP(11) DEFINE_GROUP(12)

typedef void (*group_fn)(const float *, const float *, float *, int, int);
static const group_fn GROUPS[MAX_GROUP + 1] = {0, group1, group2, group3, group4, group5, group6, group7, group8,
                                                group9, group10, group11, group12};

/* x: (m, k) row-major; panels: (n / 32, k, 32); y: (m, n) row-major. n must be a multiple of 32.
   Rows are taken in groups of at most 12, split evenly (16 rows: 8 + 8). */
void panel_mm(const float *x, const float *panels, float *y, int m, int k_dim, int n_dim) {
    int passes = (m + MAX_GROUP - 1) / MAX_GROUP;
    int done = 0;
    for (int i = 0; i < passes; i++) {
        int rows = (m - done) / (passes - i);
        if ((m - done) % (passes - i)) rows++;
        GROUPS[rows](x + (size_t)done * k_dim, panels, y + (size_t)done * n_dim, k_dim, n_dim);
        done += rows;
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (16 registers of 8 floats): a panel's 32 columns are four registers, so a pass keeps up to 3 rows'
   accumulators (12 registers, with 3 broadcasts and one weight register: all 16). The loop runs panel by
   panel, every pass of rows over a panel while it is in the L2 cache (the first pass reads it from memory),
   so W is still streamed from memory once.

   The same passes serve panels stored in bfloat16 (panel_bf16, for weights that are exactly bfloat16, as
   the default model's are): half the bytes to stream, and since a bfloat16 is the top half of a float32,
   widening it is exact (a 16-bit shift), so every product and sum is bitwise panel_mm's on the float32
   copy of the same weights. */
#include <stdint.h>
#define PANEL 32
#define MAX_GROUP 3
#define PREFETCH_BYTES 4096  /* this far ahead of the stream */

static inline __m256 weights8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 weights8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
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
        __m256 xv[R];  /* R broadcasts + one weight register + 12 accumulators: 16 registers, no spill */ \
        for (int r = 0; r < R; r++) xv[r] = _mm256_set1_ps(x[(size_t)r * k_dim + k]);             \
        for (int i = 0; i < 4; i++) {                                                             \
            __m256 wv = LOAD(wk + 8 * i);                                                         \
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
void NAME(const float *x, const WTYPE *panels, float *y, int m, int k_dim, int n_dim) {            \
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
}

DEFINE_PRODUCT(panel_mm, float, weights8_f32)
DEFINE_PRODUCT(panel_bf16, uint16_t, weights8_bf16)
#else
#error "panel_mm needs AVX-512F, or AVX2 with FMA"
#endif

int panel_width(void) { return PANEL; }
