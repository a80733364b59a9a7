/* Attention of a few query rows over a long key range, for decode and tree verification on a CPU.

   Why: PyTorch's batched matmuls for 3 to 48 stacked query rows over a KV head run far below this CPU's
   memory bandwidth, and the softmax between them is a separate pass. Here, per KV head, the keys are
   read once: on AVX-512 transposed 16 at a time in registers into a small buffer, so that every query row
   takes 16 scores per fused multiply-add; on AVX2 eight keys at a time, each row's dot products reduced
   together by a tree of horizontal adds; the softmax runs on vectors with our own exp, and the values are
   read once per group of rows kept in registers. Memory (AVX-512): as the keys stream, the same keys' values
   are prefetched into L2, and as the values pass runs, the next KV head's keys, so that memory stays busy while
   the passes compute (measured, 2-vCPU Zen 4: one new token's attention over 1K keys 0.77-0.80x the time, over 16K
   0.72-0.77x, the default model's 8 layers between weight streams; generation of 1,000 tokens after 1K, the
   libraries alternated in one process: AR 1.13x the speed, auto 1.07x). With the same prefetches the AVX2 passes
   measured faster at 1K keys but slower from 2K on, so they do not prefetch.

   A verified row is the row AR computes, bitwise. Each score is the same products and sums whatever the
   number of rows and wherever its key sits (one kernel per build for every row count: AVX-512's transposition
   was as fast as its lane-reduced form for one token, AVX2's reduced form, already used up to 8 tokens, as fast
   as its transposition for 10 to 16); a masked key weighs an exact zero; and the softmax's sum adds each new
   token a row sees in the lane AR would have added it in, the lane of its position along the row's path (a
   tree's nodes are laid out parents first, so a row's visible new tokens are its path in order). So the output
   of a tree's row is bitwise that of the same token decoded alone after its ancestors by this same build, and
   TokenSwift's tokens are AR's.

   q: (hkv, rows, d) contiguous, rows = g query heads x t new tokens (row r is token r % t).
   k, v: per KV head, keys 0..s-1 with a row stride of d floats and head_stride floats between heads.
   The first s - t keys are visible to every row; the last t keys are the new tokens, visible where
   block_mask[(r % t) * t + j] is nonzero (block_mask may be NULL: all visible).
   out: (hkv, rows, d). scratch: attend_rows_scratch(rows, s) floats for the scores (passed by the caller:
   nothing is allocated per call). Returns 0, KERNEL_BAD_ARGUMENTS for a head size it does not handle (64 and 128
   only: the key tile below holds 128 columns) or counts out of range (t at most MAX_NEW_TOKENS), or
   KERNEL_SMALL_SCRATCH. */
#include <math.h>
#include <string.h>
#include "kernels.h"
#include "vector_exp.h"

#define KEYS 16
#define MAX_NEW_TOKENS 48  /* new tokens per call (rows_attention.MAX_ROWS stacked rows at most) */
#ifndef VALUE_AHEAD
#define VALUE_AHEAD 8  /* values prefetched this many keys ahead */
#endif
#ifndef KEY_AHEAD
#define KEY_AHEAD 8  /* keys prefetched this many keys ahead (AVX2) */
#endif
#ifndef BLOCK_AHEAD
#define BLOCK_AHEAD 1  /* key blocks of 16 prefetched this many blocks ahead (AVX-512) */
#endif
#ifndef AHEAD_HINT
#define AHEAD_HINT _MM_HINT_T0
#endif
#ifndef L2_HINT
#define L2_HINT _MM_HINT_T1  /* the values while the keys stream, the next head's keys while the values do */
#endif

#if defined(__AVX512F__)
/* Transpose a 16 x 16 tile held in 16 registers (rows in, columns out) in four shuffle stages. */
static inline void transpose16(vf r[16]) {
    vf t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
        __m512d b0 = _mm512_castps_pd(t[4 * i + 2]), b1 = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, b0));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, b0));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, b1));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, b1));
    }
    /* r[4i + j] now holds, for rows 4i..4i+3, column j of each 128-bit lane: combine lanes across row groups */
    for (int j = 0; j < 4; j++) {
        vf a = r[j], b = r[4 + j], c = r[8 + j], d = r[12 + j];
        vf ab_lo = _mm512_shuffle_f32x4(a, b, 0x88), ab_hi = _mm512_shuffle_f32x4(a, b, 0xDD);
        vf cd_lo = _mm512_shuffle_f32x4(c, d, 0x88), cd_hi = _mm512_shuffle_f32x4(c, d, 0xDD);
        t[j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);
        t[8 + j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);
        t[4 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* scores[r][0..s) = scale * q_r . k_j, keys transposed 16 at a time (in registers) into a small buffer so
   that every query row takes 16 scores per fused multiply-add. The same keys' values are prefetched into L2 as
   the keys stream (`v`, see attend_rows). */
static void scores_of(const float *q, const float *k, const float *v, float *scores, int rows, int s, int s_pad, int d,
                      float scale) {
    float kt[128 * KEYS] __attribute__((aligned(64)));
    const vf sc = vf_set1(scale);
    for (int s0 = 0; s0 < s; s0 += KEYS) {
        int n = s - s0 < KEYS ? s - s0 : KEYS;
        const float *block = k + (size_t)s0 * d;
        /* the block BLOCK_AHEAD ahead of the stream (the cache comes from memory), spread over the column tiles
           (its bytes / (d / 16): 1 KiB per tile), not in one burst: measured 3-6% faster for 4 to 12 tokens over
           1K keys and for 4 and 6 over 16K; for 1 and 2 tokens within the host's noise */
        const char *ahead = (const char *)(block + (size_t)BLOCK_AHEAD * KEYS * d);
        const char *values = (const char *)(v + (size_t)s0 * d);
        const int share = KEYS * d * (int)sizeof(float) / (d / 16), fetch = s0 + BLOCK_AHEAD * KEYS < s;
        const int value_share = n * d * (int)sizeof(float) / (d / 16);
        for (int c = 0; c < d; c += 16) {
            if (fetch)
                for (int line = 0; line < share; line += 64) _mm_prefetch(ahead + (c / 16) * share + line, AHEAD_HINT);
            for (int line = 0; line < value_share; line += 64)
                _mm_prefetch(values + (c / 16) * value_share + line, L2_HINT);
            vf tile[16];
            for (int i = 0; i < 16; i++) tile[i] = i < n ? vf_loadu(block + (size_t)i * d + c) : vf_zero();
            transpose16(tile);
            for (int j = 0; j < 16; j++) vf_store(kt + (c + j) * KEYS, tile[j]);
        }
        const vmask keep = (vmask)((1u << n) - 1u);
        int r = 0;
        /* four rows at a time: each transposed key vector is loaded once for four rows, and the eight
           accumulator chains keep both FMA ports busy (per row the sums are the same as one row alone) */
        for (; r + 4 <= rows; r += 4) {
            const float *q0 = q + (size_t)r * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
            vf a0 = vf_zero(), a1 = vf_zero(), b0 = vf_zero(), b1 = vf_zero();
            vf c0 = vf_zero(), c1 = vf_zero(), e0 = vf_zero(), e1 = vf_zero();
            for (int j = 0; j < d; j += 2) {
                vf k0 = vf_load(kt + j * KEYS), k1 = vf_load(kt + (j + 1) * KEYS);
                a0 = vf_fmadd(vf_set1(q0[j]), k0, a0);
                a1 = vf_fmadd(vf_set1(q0[j + 1]), k1, a1);
                b0 = vf_fmadd(vf_set1(q1[j]), k0, b0);
                b1 = vf_fmadd(vf_set1(q1[j + 1]), k1, b1);
                c0 = vf_fmadd(vf_set1(q2[j]), k0, c0);
                c1 = vf_fmadd(vf_set1(q2[j + 1]), k1, c1);
                e0 = vf_fmadd(vf_set1(q3[j]), k0, e0);
                e1 = vf_fmadd(vf_set1(q3[j + 1]), k1, e1);
            }
            float *out = scores + (size_t)r * s_pad + s0;
            vf_mask_storeu(out, keep, vf_mul(vf_add(a0, a1), sc));
            vf_mask_storeu(out + s_pad, keep, vf_mul(vf_add(b0, b1), sc));
            vf_mask_storeu(out + 2 * (size_t)s_pad, keep, vf_mul(vf_add(c0, c1), sc));
            vf_mask_storeu(out + 3 * (size_t)s_pad, keep, vf_mul(vf_add(e0, e1), sc));
        }
        for (; r < rows; r++) {
            const float *qr = q + (size_t)r * d;
            vf a0 = vf_zero(), a1 = vf_zero();
            for (int j = 0; j < d; j += 2) {
                a0 = vf_fmadd(vf_set1(qr[j]), vf_load(kt + j * KEYS), a0);
                a1 = vf_fmadd(vf_set1(qr[j + 1]), vf_load(kt + (j + 1) * KEYS), a1);
            }
            vf_mask_storeu(scores + (size_t)r * s_pad + s0, keep, vf_mul(vf_add(a0, a1), sc));
        }
    }
}

#else
/* AVX2: scores eight keys at a time (a block of 2 KiB or 4 KiB, kept in the L1 cache while every row
   takes it): per row, eight accumulators of 8 lanes, reduced together by a tree of horizontal adds, which
   costs about what one lane reduction of a single key does. A key's sum is the same whatever the rows (and
   the tail block zero-fills its missing keys, so every key is reduced in the same order). */
static inline __m256 dots8(const float *qr, const float *block, int n, int d) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int c = 0; c < d; c += 8) {
        __m256 qv = _mm256_loadu_ps(qr + c);
        for (int i = 0; i < 8; i++)
            if (i < n) acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(block + (size_t)i * d + c), acc[i]);
    }
    __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
    /* h0123 = [k0 k1 k2 k3 (lanes 0-3) | k0 k1 k2 k3 (lanes 4-7)], h4567 likewise for keys 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

static void scores_of(const float *q, const float *k, const float *v, float *scores, int rows, int s, int s_pad, int d,
                      float scale) {
    (void)v;  /* AVX2: measured slower with the values prefetched from 2K keys on (Zen 4, forced AVX2) */
    const __m256 sc = _mm256_set1_ps(scale);
    for (int j = 0; j < s; j += 8) {
        int n = s - j < 8 ? s - j : 8;
        const float *block = k + (size_t)j * d;
        for (int line = 0; line < 8 * d; line += 16) _mm_prefetch((const char *)(block + KEY_AHEAD * d + line), AHEAD_HINT);
        if (n == 8) {  /* (a constant n: no tests in the inner loop) */
            for (int r = 0; r < rows; r++)
                _mm256_storeu_ps(scores + (size_t)r * s_pad + j, _mm256_mul_ps(dots8(q + (size_t)r * d, block, 8, d), sc));
            continue;
        }
        for (int r = 0; r < rows; r++) {
            float tmp[8];
            _mm256_storeu_ps(tmp, _mm256_mul_ps(dots8(q + (size_t)r * d, block, n, d), sc));
            for (int i = 0; i < n; i++) scores[(size_t)r * s_pad + j + i] = tmp[i];
        }
    }
}
#endif

/* The first n lanes (0 <= n <= KEYS). */
static inline vmask first_lanes(int n) { return (vmask)((1u << (n < KEYS ? n : KEYS)) - 1u); }

/* Whether a row's visible new tokens are the first ones (0 .. v-1, none after): then each sits in the lane AR's step
   adds it in, and the keys it does not see come after it, weighing zero. */
static int sees_in_order(const unsigned char *seen, int t) {
    int i = 0;
    while (i < t && seen[i]) i++;
    while (i < t && !seen[i]) i++;
    return i == t;
}

/* Row-wise softmax over [0, s) in place (lanes past s are left alone). The sum runs lane by lane as AR's step runs
   it, 16 keys a vector: the prefix's keys (the first s - t), then the new tokens the row sees at their positions
   along its path, in path order (gathered into a buffer where a tree's row skips a sibling); a key the row does not
   see weighs exp(-inf) = 0, and so adds +0 to its lane and nothing to the values' sums (values are finite). */
static void softmax_rows(float *scores, int rows, int s, int s_pad, int t, const unsigned char *block_mask) {
    const int prefix = s - t;
    for (int r = 0; r < rows; r++) {
        float *row = scores + (size_t)r * s_pad;
        vf m = vf_set1(-INFINITY);
        int j = 0;
        for (; j + KEYS <= s; j += KEYS) m = vf_max(m, vf_loadu(row + j));
        vmask tail = first_lanes(s - j);
        if (s - j) m = vf_mask_max(m, tail, m, vf_maskz_loadu(tail, row + j));
        vf peak = vf_set1(vf_reduce_max(m));
        vf total = vf_zero();
        for (j = 0; j + KEYS <= prefix; j += KEYS) {
            vf e = exp_nonpositive(vf_sub(vf_loadu(row + j), peak));
            vf_storeu(row + j, e);
            total = vf_add(total, e);
        }
        for (int at = j; at < s; at += KEYS) {  /* the prefix's last keys and the new tokens */
            vmask part = first_lanes(s - at);
            vf e = exp_nonpositive(vf_sub(vf_maskz_loadu(part, row + at), peak));
            vf_mask_storeu(row + at, part, e);
        }
        const unsigned char *seen = block_mask ? block_mask + (size_t)(r % t) * t : NULL;
        const float *rest = row + j;  /* from the last whole block of the prefix: AR's layout of the row's keys */
        float path[KEYS - 1 + MAX_NEW_TOKENS];  /* the prefix's last 15 keys at most, then the row's path */
        int n = s - j;
        if (seen && !sees_in_order(seen, t)) {
            n = prefix - j;
            for (int i = 0; i < n; i++) path[i] = row[j + i];
            for (int i = 0; i < t; i++)
                if (seen[i]) path[n++] = row[prefix + i];
            rest = path;
        }
        for (int at = 0; at < n; at += KEYS)
            total = vf_add(total, vf_maskz_loadu(first_lanes(n - at), rest + at));
        vf inv = vf_set1(1.0f / vf_reduce_add(total));
        for (j = 0; j + KEYS <= s; j += KEYS) vf_storeu(row + j, vf_mul(vf_loadu(row + j), inv));
        if (s - j) vf_mask_storeu(row + j, tail, vf_mul(vf_maskz_loadu(tail, row + j), inv));
    }
}

/* out[r] = sum_j p[r][j] v_j for groups of G rows with D16 = d / 16 registers each. The keys go in chunks of
   VALUE_CHUNK: every group takes a chunk while it is still in the L1/L2 cache (the first group brings it in; the
   scores pass has already asked for it), so the values are read from memory once however many groups there are;
   between chunks a group's sums wait in `out`. Each row's sum runs over j in order whatever its group: the same
   for one row alone. */
#define VALUE_CHUNK 128
#define DEFINE_VALUES(NAME, G, D16)                                                             \
static void NAME(const float *p, const float *v, const float *next, float *out, int rows, int s, int s_pad) { \
    for (int j0 = 0; j0 < s; j0 += VALUE_CHUNK) {                                               \
        int j1 = s - j0 < VALUE_CHUNK ? s : j0 + VALUE_CHUNK;                                   \
        for (int r0 = 0; r0 < rows; r0 += G) {                                                  \
            int g = rows - r0 < G ? rows - r0 : G;                                              \
            float *o = out + (size_t)r0 * D16 * 16;                                             \
            vf acc[G][D16];                                                                     \
            for (int a = 0; a < G; a++)                                                         \
                for (int b = 0; b < D16; b++)                                                   \
                    acc[a][b] = (j0 && a < g) ? vf_loadu(o + (size_t)a * D16 * 16 + b * 16) : vf_zero(); \
            for (int j = j0; j < j1; j++) {                                                     \
                const float *vj = v + (size_t)j * D16 * 16;                                     \
                if (r0 == 0) { /* the first group reads the values: some keys ahead; the next head's keys into L2 */ \
                    for (int b = 0; b < D16; b++) _mm_prefetch((const char *)(vj + VALUE_AHEAD * D16 * 16 + b * 16), AHEAD_HINT); \
                    for (int b = 0; next && b < D16; b++)                                       \
                        _mm_prefetch((const char *)(next + (size_t)j * D16 * 16 + b * 16), L2_HINT); \
                }                                                                               \
                vf vv[D16];                                                                     \
                for (int b = 0; b < D16; b++) vv[b] = vf_loadu(vj + b * 16);                    \
                for (int a = 0; a < G; a++) {                                                   \
                    if (a < g) {                                                                \
                        vf w = vf_set1(p[(size_t)(r0 + a) * s_pad + j]);                        \
                        for (int b = 0; b < D16; b++) acc[a][b] = vf_fmadd(w, vv[b], acc[a][b]); \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
            for (int a = 0; a < g; a++)                                                         \
                for (int b = 0; b < D16; b++) vf_storeu(o + (size_t)a * D16 * 16 + b * 16, acc[a][b]); \
        }                                                                                       \
    }                                                                                           \
}
#if defined(__AVX512F__)
DEFINE_VALUES(values_d64, 6, 4)
DEFINE_VALUES(values_d128, 3, 8)
#else
/* AVX2 (16 registers of 8 floats): a row's 64 sums would take 8 registers, so passes take 32 columns of up to 3
   rows (12 accumulators; the values are read as operands of the fused multiply-adds). The column slices of a
   value row are distinct cache lines, so every slice's first pass streams its own lines from memory: with one
   group of rows (one new token) the passes read the values once, back to back, with nothing re-read. With
   several groups, the later groups of a slice re-read it from the L1 cache while memory would idle: there, every
   pass prefetches its share of the next chunk's lines for its slice instead. */
#define SLICE 32
#define DEFINE_VALUES_AVX2(NAME, D)                                                                  \
static void NAME(const float *p, const float *v, const float *next, float *out, int rows, int s, int s_pad) { \
    (void)next;  /* AVX2: no prefetches for the next head (measured slower from 2K keys, see scores_of) */ \
    const int groups = (rows + 2) / 3;                                                              \
    const size_t share = ((size_t)1 << 16) / (size_t)groups;  /* next-chunk keys per key step, 16.16 */ \
    for (int j0 = 0; j0 < s; j0 += VALUE_CHUNK) {                                                   \
        int j1 = s - j0 < VALUE_CHUNK ? s : j0 + VALUE_CHUNK;                                       \
        for (int c0 = 0; c0 < D; c0 += SLICE) {                                                     \
            const float *following = v + (size_t)j1 * D + c0;  /* the next chunk's slice */          \
            for (int gi = 0; gi < groups; gi++) {                                                   \
                int r0 = 3 * gi, g = rows - r0 < 3 ? rows - r0 : 3;                                 \
                const float *p0 = p + (size_t)r0 * s_pad;                                           \
                const float *p1 = g > 1 ? p0 + s_pad : p0, *p2 = g > 2 ? p0 + 2 * (size_t)s_pad : p1; \
                __m256 acc[3][4];                                                                   \
                for (int a = 0; a < 3; a++)                                                         \
                    for (int b = 0; b < 4; b++)                                                     \
                        acc[a][b] = (j0 && a < g) ? _mm256_loadu_ps(out + (size_t)(r0 + a) * D + c0 + 8 * b) \
                                                  : _mm256_setzero_ps();                            \
                size_t ahead = (size_t)gi * VALUE_CHUNK * share;                                    \
                for (int j = j0; j < j1; j++) {                                                     \
                    const float *vj = v + (size_t)j * D + c0;                                       \
                    const float *pf = groups == 1 ? vj + (size_t)VALUE_AHEAD * D                    \
                                                  : following + (ahead >> 16) * D;                  \
                    _mm_prefetch((const char *)pf, AHEAD_HINT);                                     \
                    _mm_prefetch((const char *)(pf + 16), AHEAD_HINT);                              \
                    ahead += share;                                                                 \
                    /* 3 weights, one value register, 12 accumulators: 16 registers (rows past g repeat \
                       the last row's weight into sums that are never stored) */                    \
                    __m256 w0 = _mm256_set1_ps(p0[j]), w1 = _mm256_set1_ps(p1[j]), w2 = _mm256_set1_ps(p2[j]); \
                    for (int b = 0; b < 4; b++) {                                                   \
                        __m256 vb = _mm256_loadu_ps(vj + 8 * b);                                    \
                        acc[0][b] = _mm256_fmadd_ps(w0, vb, acc[0][b]);                             \
                        acc[1][b] = _mm256_fmadd_ps(w1, vb, acc[1][b]);                             \
                        acc[2][b] = _mm256_fmadd_ps(w2, vb, acc[2][b]);                             \
                    }                                                                               \
                }                                                                                   \
                for (int a = 0; a < g; a++)                                                         \
                    for (int b = 0; b < 4; b++) _mm256_storeu_ps(out + (size_t)(r0 + a) * D + c0 + 8 * b, acc[a][b]); \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
}
DEFINE_VALUES_AVX2(values_d64, 64)
DEFINE_VALUES_AVX2(values_d128, 128)
#endif

/* Floats of scratch attend_rows needs: one row of scores per query row, padded to whole key blocks. */
long attend_rows_scratch(int rows, int s) {
    if (rows < 1 || s < 1) return 0;
    return (long)rows * ((s + KEYS - 1) / KEYS * KEYS);
}

int attend_rows(const float *q, const float *k, const float *v, long head_stride, float *out, int hkv, int rows,
                int t, int s, int d, float scale, const unsigned char *block_mask, float *scratch, long scratch_floats) {
    if ((d != 64 && d != 128) || hkv < 1 || t < 1 || t > MAX_NEW_TOKENS || rows < 1 || s < t
            || (hkv > 1 && head_stride < (long)s * d))
        return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_floats < attend_rows_scratch(rows, s)) return KERNEL_SMALL_SCRATCH;
    int s_pad = (s + KEYS - 1) / KEYS * KEYS;
    float *scores = scratch;
    int prefix = s - t;
    for (int h = 0; h < hkv; h++) {
        const float *qh = q + (size_t)h * rows * d;
        const float *kh = k + (size_t)h * head_stride, *vh = v + (size_t)h * head_stride;
        scores_of(qh, kh, vh, scores, rows, s, s_pad, d, scale);
        if (block_mask)
            for (int r = 0; r < rows; r++) {
                const unsigned char *allowed = block_mask + (size_t)(r % t) * t;
                float *row = scores + (size_t)r * s_pad + prefix;
                for (int j = 0; j < t; j++) if (!allowed[j]) row[j] = -INFINITY;
            }
        softmax_rows(scores, rows, s, s_pad, t, block_mask);
        float *oh = out + (size_t)h * rows * d;
        const float *next_keys = h + 1 < hkv ? kh + head_stride : NULL;
        if (d == 64) values_d64(scores, vh, next_keys, oh, rows, s, s_pad);
        else values_d128(scores, vh, next_keys, oh, rows, s, s_pad);
    }
    return 0;
}
