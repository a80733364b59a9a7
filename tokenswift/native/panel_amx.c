/* y = x @ W^T for a few rows of float32 x and a bfloat16 W, with Intel AMX tiles, exact to float32 rounding.

   Why: a decode step streams every weight once per token. The default model's weights are bfloat16, and
   the float32 panels (panel_mm.c) stream twice their bytes; at 9 rows they are also bound by the float32
   multiply-adds. Here W stays bfloat16 (half the bytes) and the products run on AMX tiles: a few rows then
   cost about what one row does.

   Exactness: each float32 x is split into three bfloat16 parts, x = x1 + x2 + x3 exactly (x1 its top 8
   significant bits, x2 the next 8, x3 the rest; for |x| above about 1e-33). A bfloat16 times a bfloat16
   is exact in float32, so every product W[n][k] * x_i[k] is exact; the tile accumulates them in float32,
   and y = (W.x1 + W.x2) + W.x3. The sums are rounded like any float32 dot product, in the tile's own order.
   Every row of x becomes three rows of the tile, and a row's result depends on that row alone: a row of a
   many-row call is bitwise the one-row call.

   Layout of W (n, k), n a multiple of 32 and k of 32: blocks of 16 columns by 32 k, each block the B tile
   of TDPBF16PS (16 rows of k pairs, each holding 16 columns x 2 bfloat16), in the order
   [n / 16][k / 32][16 k pairs][16 columns][2].

   Compiled into build.py's "amx" library only (flags -mamx-tile -mamx-bf16 -mavx512bf16 with AVX-512), which a
   process loads where /proc/cpuinfo lists amx_tile, amx_bf16 and avx512_bf16; the tile state is then asked of Linux once (amx_ready), and
   panel_amx refuses to run (KERNEL_NO_TILES) until it was granted. The split rows go to the caller's scratch
   (panel_amx_scratch bytes): nothing is allocated per call. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
#include "kernels.h"

#if !HAVE_AMX
#error "panel_amx needs AMX-TILE, AMX-BF16 and AVX-512F (it splits the inputs with AVX-512): build.py's amx variant"
#endif

#define AMX_TOKENS 5       /* tokens per tile pass: 3 split rows each, 15 of the tile's 16 rows */

static int amx_state = 0;  /* 0 not asked, 1 granted, -1 refused */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Ask the kernel for the AMX tile state (Linux: once per process). Returns 1 when the tiles may be used. */
int amx_ready(void) {
    if (amx_state == 0) {
        long rc = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
        amx_state = rc == 0 ? 1 : -1;
    }
    return amx_state == 1;
}

/* Bytes of scratch panel_amx needs for m rows of k: 16 split rows of k bfloat16 per AMX_TOKENS tokens. */
long panel_amx_scratch(int m, int k) {
    if (m < 1 || k < 1) return 0;
    return (long)((m + AMX_TOKENS - 1) / AMX_TOKENS) * 16 * k * (long)sizeof(uint16_t);
}

static void configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }  /* pairs of token passes use all 8 */
    /* not _tile_loadconfig: GCC 12's names only 8 bytes of the config as read, so the stores to the rest may be
       dropped (seen: a clone of the kernel loaded a configuration of garbage and faulted); this names all 64 */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* The top 8 significant bits of 16 floats as bfloat16 (truncation: the dropped bits are kept by the caller). */
static inline __m256i top_half(__m512 v) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}

/* v minus its top 8 significant bits (exact: what truncation to bfloat16 dropped). */
static inline __m512 rest_of(__m512 v) {
    __m512 top = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0xFFFF0000u)));
    return _mm512_sub_ps(v, top);
}

/* Split rows of x (m <= AMX_TOKENS, k a multiple of 16) into 3m rows of bfloat16 parts (16 rows of a, the rest
   zero): row 3r holds x's top 8 significant bits, 3r + 1 the next 8, 3r + 2 the rest. */
static void split_rows(const float *x, uint16_t *a, int m, int k) {
    memset(a + (size_t)3 * m * k, 0, (size_t)(16 - 3 * m) * k * sizeof(uint16_t));
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * k;
        uint16_t *a1 = a + (size_t)(3 * r) * k, *a2 = a1 + k, *a3 = a2 + k;
        for (int i = 0; i < k; i += 16) {
            __m512 v = _mm512_loadu_ps(xr + i);
            _mm256_storeu_si256((__m256i *)(a1 + i), top_half(v));
            v = rest_of(v);
            _mm256_storeu_si256((__m256i *)(a2 + i), top_half(v));
            v = rest_of(v);
            _mm256_storeu_si256((__m256i *)(a3 + i), top_half(v));
        }
    }
}

/* Tokens in pass g of m rows (AMX_TOKENS per pass, the last one the rest). */
static inline int tokens_in_pass(int m, int g) {
    return m - g * AMX_TOKENS < AMX_TOKENS ? m - g * AMX_TOKENS : AMX_TOKENS;
}

/* Zero the C tiles of one pass (0, 1), or of a pair of passes (0, 1 and 5, 6). */
static inline void zero_c_tiles(int pair) {
    _tile_zero(0);
    _tile_zero(1);
    if (pair) {
        _tile_zero(5);
        _tile_zero(6);
    }
}

/* Store the C tiles of one pass (0, 1), or of a pair of passes (0, 1 and 5, 6), into c. */
static inline void store_c_tiles(float c[4][16 * 16], int pair) {
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    if (pair) {
        _tile_stored(5, c[2], 64);
        _tile_stored(6, c[3], 64);
    }
}

/* y's outputs nb * 16 .. nb * 16 + 31 for the tokens of passes g (and g + 1 with pair) from their C tiles: output i
   of split row s at c[..] + i * out_stride + s * split_stride; a token's three split rows summed (x1 + x2) + x3. */
static inline void write_passes(float c[4][16 * 16], float *y, int m, int n, int g, int pair, int nb,
                                int out_stride, int split_stride) {
    for (int p = 0; p <= pair; p++) {
        const int rows = tokens_in_pass(m, g + p);
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < 2; h++) {
                float *out = y + (size_t)((g + p) * AMX_TOKENS + r) * n + (size_t)(nb + h) * 16;
                for (int i = 0; i < 16; i++) {
                    const float *ci = c[2 * p + h] + i * out_stride + 3 * r * split_stride;
                    out[i] = (ci[0] + ci[split_stride]) + ci[2 * split_stride];
                }
            }
    }
}

/* write_passes for C tiles of outputs by split rows (blocks_amx), passes of two tokens or more in vector lanes: per
   output (a C row, split rows in its lanes) the row plus itself shifted down one lane, plus itself shifted down two,
   holds (x1 + x2) + x3 of token r in lane 3 r (the same two float32 additions in the same order as write_passes:
   bitwise its sums); then each token's 16 outputs are gathered from lane 3 r of the 16 rows. Measured (AMX host,
   SmolLM2's matrices at 256 rows, ms): q/k/v 1.08 -> 0.84, o 0.69 -> 0.57, gate/up 3.06 -> 2.56; with the sums left
   out altogether, 0.78, 0.53, 2.26. */
static inline void write_passes_by_outputs(float c[4][16 * 16], float *y, int m, int n, int g, int pair, int nb) {
    float sums[16 * 16] __attribute__((aligned(64)));
    const __m512i rows_of = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(16));
    const __m512i zero = _mm512_setzero_si512();
    for (int p = 0; p <= pair; p++) {
        const int rows = tokens_in_pass(m, g + p);
        if (rows < 2) {
            write_passes(c + 2 * p, y, m, n, g + p, 0, nb, 16, 1);  /* this pass's tiles: c[2 p], c[2 p + 1] */
            continue;
        }
        for (int h = 0; h < 2; h++) {
            const float *tile = c[2 * p + h];
            for (int i = 0; i < 16; i++) {
                __m512i v = _mm512_load_si512((const void *)(tile + 16 * i));
                __m512 next = _mm512_castsi512_ps(_mm512_alignr_epi32(zero, v, 1));
                __m512 after = _mm512_castsi512_ps(_mm512_alignr_epi32(zero, v, 2));
                _mm512_store_ps(sums + 16 * i, _mm512_add_ps(_mm512_add_ps(_mm512_castsi512_ps(v), next), after));
            }
            for (int r = 0; r < rows; r++) {
                float *out = y + (size_t)((g + p) * AMX_TOKENS + r) * n + (size_t)(nb + h) * 16;
                _mm512_storeu_ps(out, _mm512_i32gather_ps(rows_of, sums + 3 * r, 4));
            }
        }
    }
}

/* x: (m, k) float32 row-major; w: packed as above; y: (m, n) float32; scratch: panel_amx_scratch(m, k) bytes.
   Returns 0, KERNEL_BAD_ARGUMENTS for sizes it does not handle, KERNEL_SMALL_SCRATCH or KERNEL_NO_TILES. The
   columns are the outer loop, so that the passes of more than AMX_TOKENS rows find a block's weights in the
   core's caches. */
int panel_amx(const float *x, const uint16_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes) {
    if (k < 32 || k > AMX_MAX_K || k % 32 || n < 32 || n % 32 || m < 1) return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_bytes < panel_amx_scratch(m, k)) return KERNEL_SMALL_SCRATCH;
    if (amx_state != 1) return KERNEL_NO_TILES;
    const int groups = (m + AMX_TOKENS - 1) / AMX_TOKENS;
    uint16_t *a = (uint16_t *)scratch;
    for (int g = 0; g < groups; g++) {
        split_rows(x + (size_t)g * AMX_TOKENS * k, a + (size_t)g * 16 * k, tokens_in_pass(m, g), k);
    }
    float c[4][16 * 16] __attribute__((aligned(64)));
    const int kb_count = k / 32;
    const size_t block = 16 * 32;  /* bfloat16 per B tile */
    configure();
    for (int nb = 0; nb < n / 16; nb += 2) {
        const uint16_t *b0 = w + (size_t)nb * kb_count * block, *b1 = b0 + (size_t)kb_count * block;
        /* two passes of tokens at a time share each pair of weight tiles (C tiles 0, 1 and 5, 6; A tiles 2 and 7):
           the same products in the same order per C tile as one pass at a time, with a third fewer tile loads */
        for (int g = 0; g < groups; g += 2) {
            const int pair = g + 1 < groups;
            const uint16_t *ag = a + (size_t)g * 16 * k, *ag2 = a + (size_t)(g + pair) * 16 * k;
            zero_c_tiles(pair);
            for (int kb = 0; kb < kb_count; kb++) {
                _tile_loadd(2, ag + kb * 32, k * 2);
                _tile_loadd(3, b0 + kb * block, 64);
                _tile_loadd(4, b1 + kb * block, 64);
                _tile_dpbf16ps(0, 2, 3);
                _tile_dpbf16ps(1, 2, 4);
                if (pair) {
                    _tile_loadd(7, ag2 + kb * 32, k * 2);
                    _tile_dpbf16ps(5, 7, 3);
                    _tile_dpbf16ps(6, 7, 4);
                }
            }
            store_c_tiles(c, pair);
            write_passes(c, y, m, n, g, pair, nb, 1, 16);  /* C: split rows by outputs */
        }
    }
    _tile_release();
    return 0;
}

/* ---- the same over GGUF blocks: Q4_1 (q4_blocks.h) and Q8_0 ------------------------------------------------------
   panel_q4_amx, panel_q8_amx: y = x @ W^T with W held as GGUF blocks, on AMX tiles. The weights take the A side
   of the tile product (A's rows are W's rows, 32 inputs each: a group's row rebuilt to bfloat16 is one row of an A
   tile, no transposition), and x's split rows the B side (16 input pairs by 16 split rows, scattered there as they
   are split). So C holds 16 outputs by 15 split rows; y = (C.x1 + C.x2) + C.x3 as in panel_amx, and the products
   and sums are panel_amx's (the tile multiplies the same pairs in the same order, whichever side holds which): the
   results are bitwise panel_amx's over the blocks' bfloat16 values, which panels.py's self-check holds them to.
   Per 32 outputs the strip of their groups is rebuilt once (two A tiles per 32 inputs); while the tiles multiply
   one strip the vector units rebuild the next into a second buffer, and every pass of AMX_TOKENS tokens runs over
   a strip.

   Q8_0 (SmolLM2's embedding, its tied LM head: 8.5 bits a weight against 16) is a weight bf16(d * q), q an int8 and
   d a float16 per 32 weights; its group of 16 rows x 32 inputs is uint16 d[16], then int8 q[16][32]. Only here:
   rebuilding it in float32 lanes for the vector kernels cost more than streaming its bfloat16 (docs/performance.md).
   */
#include "q4_blocks.h"

#if !defined(__AVX512BF16__)
#error "panel_q4_amx rebuilds bfloat16 with AVX-512 BF16 (every AMX CPU has it): build.py's amx variant"
#endif

/* Bytes of scratch for m rows of k: the B tiles of the split rows, and two strips of 32 outputs' A tiles. */
long panel_q4_amx_scratch(int m, int k) {
    if (m < 1 || k < 1) return 0;
    return panel_amx_scratch(m, k) + 2 * 2L * k * 32;
}

/* x's rows (m <= AMX_TOKENS, k a multiple of 32) split as split_rows does, into B tiles [k / 32][16 pairs][16 split
   rows] of input pairs: split row 3r + s of token r holds part s; the other split rows are zero. */
static void split_to_tiles(const float *x, uint32_t *tiles, int m, int k) {
    memset(tiles, 0, (size_t)k * 32);
    const __m512i stride = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(16));
    for (int r = 0; r < m; r++)
        for (int kb = 0; kb < k / 32; kb++) {
            __m512 lo = _mm512_loadu_ps(x + (size_t)r * k + kb * 32), hi = _mm512_loadu_ps(x + (size_t)r * k + kb * 32 + 16);
            for (int s = 0; s < 3; s++) {
                __m512i pairs = _mm512_inserti64x4(_mm512_castsi256_si512(top_half(lo)), top_half(hi), 1);
                _mm512_i32scatter_epi32(tiles + (size_t)kb * 256 + 3 * r + s, stride, pairs, 4);
                lo = rest_of(lo);
                hi = rest_of(hi);
            }
        }
}

#define FORMAT_Q4_1 1
#define FORMAT_Q8_0 2
#define Q8_GROUP_BYTES (16 * 2 + 16 * 32)

static inline long group_bytes(int format) { return format == FORMAT_Q4_1 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES; }

/* Row i of a Q8_0 group as its 32 bfloat16 values: d * q in float32 (exact), rounded to nearest even. */
static inline __m512i q8_row_bf16(const uint8_t *group, const float *d, int i) {
    const int8_t *q = (const int8_t *)(group + 32 + 32 * i);
    __m512 scale = _mm512_set1_ps(d[i]);
    __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), scale);
    __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))), scale);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Rebuild the groups (nb, kb) and (nb + 1, kb) as bfloat16 A tiles into strip[h][kb], prefetching the groups of
   the strip after the next. */
static inline void rebuild_pair(const uint8_t *w, int format, int k, int nb, int kb, int blocks_n, uint16_t *strip) {
    const long kb_count = k / 32, bytes = group_bytes(format);
    float d[16], m[16];
    for (int h = 0; h < 2; h++) {
        const uint8_t *group = w + ((size_t)(nb + h) * kb_count + kb) * bytes;
        if (nb + 4 < blocks_n)
            for (long b = 0; b < bytes; b += 64) _mm_prefetch((const char *)group + 4 * kb_count * bytes + b, _MM_HINT_T0);
        uint16_t *tile = strip + ((size_t)h * kb_count + kb) * 16 * 32;
        if (format == FORMAT_Q4_1) {
            q4_scales(group, d, m);
            for (int i = 0; i < 16; i += 2) {
                __m512i row0, row1;
                q4_row_pair_bf16(group, d, m, i, &row0, &row1);
                _mm512_storeu_si512((void *)(tile + i * 32), row0);
                _mm512_storeu_si512((void *)(tile + (i + 1) * 32), row1);
            }
        } else {
            _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)group)));
            __asm__ volatile("" ::: "memory");  /* as q4_scales: the scale as a broadcast load */
            for (int i = 0; i < 16; i++) _mm512_storeu_si512((void *)(tile + i * 32), q8_row_bf16(group, d, i));
        }
    }
}

static int blocks_amx(const float *x, const uint8_t *w, int format, float *y, int m, int k, int n, void *scratch,
                      long scratch_bytes) {
    if (k < 32 || k > AMX_MAX_K || k % 32 || n < 32 || n % 32 || m < 1) return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_bytes < panel_q4_amx_scratch(m, k)) return KERNEL_SMALL_SCRATCH;
    if (amx_state != 1) return KERNEL_NO_TILES;
    const int groups = (m + AMX_TOKENS - 1) / AMX_TOKENS, kb_count = k / 32, blocks_n = n / 16;
    uint32_t *bt = (uint32_t *)scratch;  /* [g][kb][16 pairs][16 split rows] */
    uint16_t *strips = (uint16_t *)((char *)scratch + panel_amx_scratch(m, k));  /* two of [2][kb][16 rows][32] */
    const size_t strip_words = (size_t)2 * kb_count * 16 * 32;
    for (int g = 0; g < groups; g++) {
        split_to_tiles(x + (size_t)g * AMX_TOKENS * k, bt + (size_t)g * 8 * k, tokens_in_pass(m, g), k);
    }
    float c[4][16 * 16] __attribute__((aligned(64)));
    configure();
    for (int kb = 0; kb < kb_count; kb++) rebuild_pair(w, format, k, 0, kb, blocks_n, strips);
    for (int nb = 0; nb < blocks_n; nb += 2) {
        const uint16_t *strip = strips + (size_t)((nb / 2) & 1) * strip_words;
        uint16_t *next = strips + (size_t)((nb / 2 + 1) & 1) * strip_words;
        int more = nb + 2 < blocks_n;
        /* two passes of tokens at a time share each pair of A tiles (C tiles 0, 1 and 5, 6; B tiles 2 and 7): the
           same products in the same order per C tile as one pass at a time, with a third fewer tile loads */
        for (int g = 0; g < groups; g += 2) {
            const int pair = g + 1 < groups;
            const uint32_t *bg = bt + (size_t)g * 8 * k, *bg2 = bt + (size_t)(g + pair) * 8 * k;
            zero_c_tiles(pair);
            for (int kb = 0; kb < kb_count; kb++) {
                _tile_loadd(2, bg + (size_t)kb * 256, 64);
                _tile_loadd(3, strip + (size_t)kb * 512, 64);
                _tile_loadd(4, strip + ((size_t)kb_count + kb) * 512, 64);
                _tile_dpbf16ps(0, 3, 2);
                _tile_dpbf16ps(1, 4, 2);
                if (pair) {
                    _tile_loadd(7, bg2 + (size_t)kb * 256, 64);
                    _tile_dpbf16ps(5, 3, 7);
                    _tile_dpbf16ps(6, 4, 7);
                }
                if (g == 0 && more) rebuild_pair(w, format, k, nb + 2, kb, blocks_n, next);
            }
            store_c_tiles(c, pair);
            if (m > 16)  /* many rows (prefill chunks); a decode step's few keep the scalar sums (not measurably slower) */
                write_passes_by_outputs(c, y, m, n, g, pair, nb);  /* C: outputs by split rows */
            else
                write_passes(c, y, m, n, g, pair, nb, 16, 1);
        }
    }
    _tile_release();
    return 0;
}

int panel_q4_amx(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes) {
    return blocks_amx(x, w, FORMAT_Q4_1, y, m, k, n, scratch, scratch_bytes);
}

/* The same for Q8_0 groups; scratch of panel_q4_amx_scratch(m, k) bytes. */
int panel_q8_amx(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes) {
    return blocks_amx(x, w, FORMAT_Q8_0, y, m, k, n, scratch, scratch_bytes);
}
