/* y = x @ W^T for a few rows of float32 x and a W held as GGUF Q4_1 blocks (q4_blocks.h), on AVX-512 or AVX2.

   Why: see q4_blocks.h. The weights stream as 5 bits each instead of bfloat16's 16, and the product is one over
   the model's own bfloat16 weights, rebuilt exactly in registers. (AMX CPUs use panel_q4_amx in panel_amx.c.)

   How: per 16 output rows, the strip of their groups is rebuilt into float32 scratch (16 x k floats, in the
   core's caches), then every pass of up to Q4_MAX_ROWS rows of x runs over it, four outputs at a time, each output
   an accumulator of LANES partial sums over k (k = i, i + LANES, ...) added up at the end in a fixed order. A
   row's result depends on that row and W alone, the same sums in the same order for any number of rows: a row of
   a many-row call is bitwise the one-row call. (The sums run in another order than panel_mm's, so the results are
   W's products to float32 rounding, not bitwise panel_bf16's.) The next strip's groups are prefetched while one
   is rebuilt. Measured against the bfloat16 panels in docs/performance.md.

   With AVX-512 BF16 (build.py's avx512bf16 and amx variants) no strip is written: a group's row is rebuilt in
   registers as its 32 bfloat16 values (q4_row_pair_bf16, two rows at a time: the tables rounded by one conversion
   instruction, where the float32 lanes need five integer operations, and looked up 32 at a time), widened to
   float32 by two unpacks (free of shuffles across lanes: the unpacks put the inputs in their own order, so x's
   blocks are put in that order once per call, order_inputs), and multiplied there with float32 multiply-adds by
   up to six rows of x (one row: all 16 outputs of a strip at once; two to four: 8 at a time, five and six: 4 at a
   time; 8 to 32 sums, of which GCC keeps some of three and four rows' on the stack, faster all the same). Seven
   rows or more rebuild each strip once into float32 scratch, in the same order, and run the float32 passes over it:
   rebuilt in registers per pass of rows instead, 16 rows cost 1.4-1.6x the strip's time (AMD EPYC Zen 4,
   docs/performance.md, session 38). Measured on that CPU over SmolLM2's 30 layers of Q4_1 matrices, the variants
   alternated in one process: 1 / 2 / 3 / 4 / 5 / 6 rows 0.92 / 0.87 / 0.73 / 0.90 / 0.88 / 0.94x the time of the
   passes before (one row 8 outputs at a time, two rows 4 at a time, a strip from three rows on; session 43).
   Each output still has one accumulator, taking each block's two halves in turn, the same multiply-adds in the
   same order on either path and for any number of rows: a row of a many-row call is bitwise the one-row call. */
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

static int q4_shape_ok(int m, int k, int n) {
    return m >= 0 && k >= Q4_K && k % Q4_K == 0 && n >= Q4_ROWS && n % Q4_ROWS == 0;
}

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

/* m rows of x (m, k) over strip nb rebuilt as (16, k) floats, Q4_MAX_ROWS rows a pass: y[r * n + nb * 16 ..]. */
static void q4_strip_passes(const float *x, const float *strip, float *y, int m, int k, int n, int nb) {
    typedef void (*pass_fn)(const float *, const float *, float *, int, int);
#if Q4_MAX_ROWS > 2
    static const pass_fn passes[Q4_MAX_ROWS + 1] = {0, q4_pass1, q4_pass2, q4_pass3, q4_pass4};
#else
    static const pass_fn passes[Q4_MAX_ROWS + 1] = {0, q4_pass1, q4_pass2};
#endif
    for (int done = 0; done < m;) {
        int rows = m - done < Q4_MAX_ROWS ? m - done : Q4_MAX_ROWS;
        passes[rows](x + (size_t)done * k, strip, y + (size_t)done * n + (size_t)nb * Q4_ROWS, k, n);
        done += rows;
    }
}

#if defined(__AVX512BF16__)
/* x's m rows with each block of 32 inputs reordered as the weights come out of widen_lo / widen_hi:
   [row][k / 32][32], the first 16 the inputs of widen_lo's lanes, the last 16 widen_hi's. */
static void order_inputs(const float *x, float *xo, int m, int k) {
    for (int r = 0; r < m; r++)
        for (int b = 0; b < k; b += Q4_K) {
            const float *in = x + (size_t)r * k + b;
            float *out = xo + (size_t)r * k + b;
            for (int lane = 0; lane < 4; lane++)
                for (int j = 0; j < 4; j++) {
                    out[4 * lane + j] = in[8 * lane + j];
                    out[16 + 4 * lane + j] = in[8 * lane + 4 + j];
                }
        }
}

/* The float32 values of bfloat16 words 0-3 (lo) or 4-7 (hi) of each 128-bit lane of v: one unpack each. */
static inline __m512 widen_lo(__m512i v) { return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), v)); }
static inline __m512 widen_hi(__m512i v) { return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), v)); }

/* acc plus one rebuilt row (its 32 bfloat16 values, input order) times one block of reordered x. */
static inline __m512 dot_block(__m512 acc, __m512i row, const float *xo) {
    acc = _mm512_fmadd_ps(widen_lo(row), _mm512_loadu_ps(xo), acc);
    return _mm512_fmadd_ps(widen_hi(row), _mm512_loadu_ps(xo + 16), acc);
}

/* The groups of strip nb, block kb: its address, the next strip's prefetched (on the first chunk of outputs), its
   scales. Named accumulators below, not arrays: GCC keeps an array of vectors in memory, and q4_scales' memory
   barrier then reloads it per block. */
#define LOOKUP_GROUP(c0)                                                                                \
    const uint8_t *group = q4_group(w, k, nb, kb);                                                      \
    if ((c0) == 0 && nb + 1 < strips)                                                                   \
        for (long b = 0; b < Q4_GROUP_BYTES; b += 64)                                                   \
            _mm_prefetch((const char *)group + (long)blocks * Q4_GROUP_BYTES + b, _MM_HINT_T0);         \
    float d[16], m[16];                                                                                 \
    q4_scales(group, d, m)

/* Eight (or four) sums named a0..a7 (or b.., e.., ...), each output's one accumulator; and the stores of their
   outputs' sums. */
#define SUMS8(s) __m512 s##0 = _mm512_setzero_ps(), s##1 = s##0, s##2 = s##0, s##3 = s##0, s##4 = s##0, \
                        s##5 = s##0, s##6 = s##0, s##7 = s##0
#define SUMS4(s) __m512 s##0 = _mm512_setzero_ps(), s##1 = s##0, s##2 = s##0, s##3 = s##0
#define STORE4(out, s) (out)[0] = q4v_sum(s##0), (out)[1] = q4v_sum(s##1), (out)[2] = q4v_sum(s##2), \
                       (out)[3] = q4v_sum(s##3)
#define STORE8(out, s) STORE4(out, s), (out)[4] = q4v_sum(s##4), (out)[5] = q4v_sum(s##5), \
                       (out)[6] = q4v_sum(s##6), (out)[7] = q4v_sum(s##7)

/* Output i's sums over a rebuilt row, for rows 0..R-1 of reordered x (xb: this block's inputs of row 0). */
#define DOTS1(i, row) a##i = dot_block(a##i, row, xb)
#define DOTS2(i, row) DOTS1(i, row), b##i = dot_block(b##i, row, xb + k)
#define DOTS3(i, row) DOTS2(i, row), e##i = dot_block(e##i, row, xb + 2 * (size_t)k)
#define DOTS4(i, row) DOTS3(i, row), f##i = dot_block(f##i, row, xb + 3 * (size_t)k)
#define DOTS5(i, row) DOTS4(i, row), g##i = dot_block(g##i, row, xb + 4 * (size_t)k)
#define DOTS6(i, row) DOTS5(i, row), h##i = dot_block(h##i, row, xb + 5 * (size_t)k)
#define DOTS1_HIGH(i, row) b##i = dot_block(b##i, row, xb)  /* one row's outputs 8 + i, in sums b0..b7 */

/* Rows first..first+3 (or +7) of the group rebuilt in pairs, each taken by the R rows of x into sums i = 0..3
   (0..7). */
#define TAKE4(R, first)                                                                                 \
    q4_row_pair_bf16(group, d, m, (first) + 0, &r0, &r1); DOTS##R(0, r0); DOTS##R(1, r1);             \
    q4_row_pair_bf16(group, d, m, (first) + 2, &r0, &r1); DOTS##R(2, r0); DOTS##R(3, r1)
#define TAKE8(R, first)                                                                                 \
    TAKE4(R, first);                                                                                    \
    q4_row_pair_bf16(group, d, m, (first) + 4, &r0, &r1); DOTS##R(4, r0); DOTS##R(5, r1);             \
    q4_row_pair_bf16(group, d, m, (first) + 6, &r0, &r1); DOTS##R(6, r0); DOTS##R(7, r1)

/* One row of reordered x over strip nb's 16 outputs at once (sixteen sums: a group's scales are read once, where
   eight at a time read them twice; measured 0.92x the time over SmolLM2's 30 layers): y[nb * 16 ..]. */
static void q4_lookup_pass1(const uint8_t *w, int k, int nb, int strips, const float *xo, float *y, int n) {
    (void)n;
    const int blocks = k / Q4_K;
    SUMS8(a);
    SUMS8(b);
    for (int kb = 0; kb < blocks; kb++) {
        LOOKUP_GROUP(0);
        const float *xb = xo + (size_t)kb * Q4_K;
        __m512i r0, r1;
        TAKE8(1, 0);
        TAKE8(1_HIGH, 8);
    }
    float *out = y + (size_t)nb * Q4_ROWS;
    STORE8(out, a);
    STORE8(out + 8, b);
}

/* R rows of reordered x (2 to Q4_LOOKUP_ROWS) over strip nb's 16 outputs, OUTS at a time (8 for up to four rows, 4
   for five and six: at most 32 sums; GCC 12 keeps about 5 of three rows' and 14 of four rows' on the stack, which
   the times below include), each rebuilt row serving all R: y[r * n + nb * 16 ..].
   Measured against a strip rebuilt once for all rows: 4 / 5 / 6 rows about 0.90 / 0.88 / 0.94x its time; 8 rows
   (four at a time) 1.07x, 7 rows the same time. */
#define Q4_LOOKUP_ROWS 6
#define DEFINE_LOOKUP_PASS(R, OUTS, DECLARE, STORE)                                                     \
static void q4_lookup_pass##R(const uint8_t *w, int k, int nb, int strips, const float *xo, float *y, int n) { \
    const int blocks = k / Q4_K;                                                                        \
    for (int first = 0; first < Q4_ROWS; first += OUTS) {                                               \
        DECLARE;                                                                                        \
        for (int kb = 0; kb < blocks; kb++) {                                                           \
            LOOKUP_GROUP(first);                                                                        \
            const float *xb = xo + (size_t)kb * Q4_K;                                                   \
            __m512i r0, r1;                                                                             \
            TAKE##OUTS(R, first);                                                                       \
        }                                                                                               \
        float *out = y + (size_t)nb * Q4_ROWS + first;                                                  \
        STORE;                                                                                          \
    }                                                                                                   \
}
#define ROW(r) (out + (r) * (size_t)n)
DEFINE_LOOKUP_PASS(2, 8, SUMS8(a); SUMS8(b), STORE8(ROW(0), a); STORE8(ROW(1), b))
DEFINE_LOOKUP_PASS(3, 8, SUMS8(a); SUMS8(b); SUMS8(e), STORE8(ROW(0), a); STORE8(ROW(1), b); STORE8(ROW(2), e))
DEFINE_LOOKUP_PASS(4, 8, SUMS8(a); SUMS8(b); SUMS8(e); SUMS8(f),
                   STORE8(ROW(0), a); STORE8(ROW(1), b); STORE8(ROW(2), e); STORE8(ROW(3), f))
DEFINE_LOOKUP_PASS(5, 4, SUMS4(a); SUMS4(b); SUMS4(e); SUMS4(f); SUMS4(g),
                   STORE4(ROW(0), a); STORE4(ROW(1), b); STORE4(ROW(2), e); STORE4(ROW(3), f); STORE4(ROW(4), g))
DEFINE_LOOKUP_PASS(6, 4, SUMS4(a); SUMS4(b); SUMS4(e); SUMS4(f); SUMS4(g); SUMS4(h),
                   STORE4(ROW(0), a); STORE4(ROW(1), b); STORE4(ROW(2), e); STORE4(ROW(3), f); STORE4(ROW(4), g);
                   STORE4(ROW(5), h))

/* Strip nb's 16 outputs rebuilt once into float32 (16, k), each block's 32 values in the unpacks' order (widen_lo's
   16, then widen_hi's), the next strip's groups prefetched. */
static void q4_rebuild_strip_ordered(const uint8_t *w, int k, int nb, int strips, float *strip) {
    const int blocks = k / Q4_K;
    for (int kb = 0; kb < blocks; kb++) {
        LOOKUP_GROUP(0);
        for (int i = 0; i < Q4_ROWS; i += 2) {
            __m512i r0, r1;
            q4_row_pair_bf16(group, d, m, i, &r0, &r1);
            float *o0 = strip + (size_t)i * k + (size_t)kb * Q4_K, *o1 = o0 + k;
            _mm512_storeu_ps(o0, widen_lo(r0)), _mm512_storeu_ps(o0 + 16, widen_hi(r0));
            _mm512_storeu_ps(o1, widen_lo(r1)), _mm512_storeu_ps(o1 + 16, widen_hi(r1));
        }
    }
}

long panel_q4_scratch(int m, int k) {  /* x reordered, then (seven rows or more) a rebuilt strip */
    return k < 1 ? 0 : (long)((m < 1 ? 1 : m) + Q4_ROWS) * k * (long)sizeof(float);
}

/* x (m, k) row-major; w: groups as in q4_blocks.h; y (m, n) row-major; scratch: panel_q4_scratch(m, k) bytes.
   Returns 0, KERNEL_BAD_ARGUMENTS (k not a multiple of 32, n not of 16) or KERNEL_SMALL_SCRATCH. */
int panel_q4(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes) {
    if (!q4_shape_ok(m, k, n)) return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_bytes < panel_q4_scratch(m, k)) return KERNEL_SMALL_SCRATCH;
    float *xo = (float *)scratch;
    order_inputs(x, xo, m, k);
    const int strips = n / Q4_ROWS;
    if (m > Q4_LOOKUP_ROWS) {  /* rebuild each strip once for every pass of rows, not once per pass */
        float *strip = xo + (size_t)m * k;
        for (int nb = 0; nb < strips; nb++) {
            q4_rebuild_strip_ordered(w, k, nb, strips, strip);
            q4_strip_passes(xo, strip, y, m, k, n, nb);
        }
        return 0;
    }
    typedef void (*lookup_fn)(const uint8_t *, int, int, int, const float *, float *, int);
    static const lookup_fn lookups[Q4_LOOKUP_ROWS + 1] = {0, q4_lookup_pass1, q4_lookup_pass2, q4_lookup_pass3,
                                                          q4_lookup_pass4, q4_lookup_pass5, q4_lookup_pass6};
    for (int nb = 0; nb < strips && m > 0; nb++)  /* up to six rows: each rebuilt row stays in registers */
        lookups[m](w, k, nb, strips, xo, y, n);
    return 0;
}

#else
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

long panel_q4_scratch(int m, int k) {
    (void)m;
    return k < 1 ? 0 : (long)Q4_ROWS * k * (long)sizeof(float);
}

/* x (m, k) row-major; w: groups as in q4_blocks.h; y (m, n) row-major; scratch: panel_q4_scratch(m, k) bytes.
   Returns 0, KERNEL_BAD_ARGUMENTS (k not a multiple of 32, n not of 16) or KERNEL_SMALL_SCRATCH. */
int panel_q4(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes) {
    if (!q4_shape_ok(m, k, n)) return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_bytes < panel_q4_scratch(m, k)) return KERNEL_SMALL_SCRATCH;
    float *strip = (float *)scratch;
    int strips = n / Q4_ROWS;
    for (int nb = 0; nb < strips; nb++) {
        rebuild_strip(w, k, nb, strips, strip);
        q4_strip_passes(x, strip, y, m, k, n, nb);
    }
    return 0;
}

#endif

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
