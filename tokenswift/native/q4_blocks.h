/* GGUF Q4_1 weights laid out for the panel kernels, and the exact bfloat16 values they encode.

   Why: a decode step on a CPU is bound by the bytes of weights it streams. A model converted from a GGUF file (the
   built-in SmolLM2-135M: Q4_1 layers) holds weights that are, bit for bit, bfloat16 roundings of its blocks: a
   Q4_1 weight is bf16(d * q + m), q a 4-bit code, d and m float16 per 32 weights. The blocks take 5 bits a weight
   against bfloat16's 16, so a kernel that rebuilds those bfloat16 values in registers computes what the bfloat16
   weights would give from under a third of the bytes. (The same model's Q8_0 embedding, its LM head, is rebuilt
   on AMX tiles only, in panel_amx.c: in float32 lanes it cost more than streaming its bfloat16.)

   Exactness: a value is rebuilt with the operations the converter used (gguf's dequantization: float32 d times q,
   then plus m, each rounded; the multiply is exact, so one fused multiply-add gives the same value), then rounded
   to bfloat16 to nearest even (PyTorch's conversion), in float32 lanes. tokenswift/gguf_blocks.py refuses blocks
   whose values differ from the model's weights in any bit, and panels.py's self-check holds these functions to
   gguf_blocks' values, so a product over the blocks is a product over the model's own weights.

   Layout: W (n, k), n a multiple of 16 and k of 32, as groups of 16 rows x 32 inputs in the order
   [n / 16][k / 32]: uint16 d[16], uint16 m[16] (float16), then uint8 q[16][16]. Row i's 16 code bytes are 8
   little-endian 16-bit words, word j holding the codes of inputs j, j + 8, j + 16, j + 24 in its bits 0-3, 4-7,
   8-11, 12-15 (a GGUF block holds inputs j and j + 16 in byte j; gguf_blocks.py reorders them), so that the words
   shifted lane by lane put every input's code at the bottom of its lane, in input order.

   A row's 16 possible values are computed once (one register: d * c + m for c = 0..15) and looked up per input,
   so the cost per 32 weights is a multiply-add, a conversion, a shift and a lookup. */
#ifndef TOKENSWIFT_Q4_BLOCKS_H
#define TOKENSWIFT_Q4_BLOCKS_H
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>

#define Q4_ROWS 16  /* rows of a group */
#define Q4_K 32     /* inputs of a group (one GGUF block per row) */
#define Q4_GROUP_BYTES (2 * 16 * 2 + 16 * 16)

/* The group (nb, kb) of W (inputs k) laid out as above. */
static inline const uint8_t *q4_group(const uint8_t *w, int k, int nb, int kb) {
    return w + ((size_t)nb * (k / Q4_K) + kb) * Q4_GROUP_BYTES;
}

#if defined(__AVX512F__)
/* float32 lanes rounded to the nearest bfloat16, ties to even (finite values; what PyTorch's conversion does). */
static inline __m512 round_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* The group's 16 float16 d and 16 m as float32. */
static inline void q4_scales(const uint8_t *group, float *d, float *m) {
    _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)group)));
    _mm512_storeu_ps(m, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(group + 32))));
    /* read back from memory: a row's scale is then a broadcast load, not a shuffle on the port the lookups use */
    __asm__ volatile("" ::: "memory");
}

/* Row i's 16 values d * c + m, c = 0..15, in float32. One fused multiply-add is the converter's multiply, then add:
   d (a float16: 11 significant bits) times c (4 bits) is exact in float32, so only the add rounds either way. */
static inline __m512 q4_table(const float *d, const float *m, int i) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmadd_ps(_mm512_set1_ps(d[i]), codes, _mm512_set1_ps(m[i]));
}

/* Row i of a group into out[0..31] as float32: dword lanes 0..7 and 8..15 both hold words 0..7, shifted by 0 / 4
   (inputs 0..15) or 8 / 12 (inputs 16..31); the lookup reads the low 4 bits of each lane. */
static inline void q4_row_floats(const uint8_t *group, const float *d, const float *m, int i, float *out) {
    __m512 table = round_bf16(q4_table(d, m, i));
    __m512i words = _mm512_cvtepu16_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(group + 64 + 16 * i))));
    const __m512i first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i second = _mm512_setr_epi32(8, 8, 8, 8, 8, 8, 8, 8, 12, 12, 12, 12, 12, 12, 12, 12);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_srlv_epi32(words, first), table));
    _mm512_storeu_ps(out + 16, _mm512_permutexvar_ps(_mm512_srlv_epi32(words, second), table));
}

#if defined(__AVX512BF16__)
/* Rows i and i + 1 of a group as their 32 bfloat16 values each, in input order. Each row's table is rounded by the
   bfloat16 conversion (to nearest even, as round_bf16); one conversion rounds both tables into one register, row
   i's in words 0-15 and row i + 1's in 16-31 (it takes as long for two tables as for one: on a Sapphire Rapids
   Xeon, pairs cut a vector kernel's rebuild by about a tenth, docs/performance.md). Each row's 8 words, four times
   over and word w shifted by 4 * (w / 8), index its table: the lookup reads 5 bits, the low 4 the code and the
   fifth set to 0 or 1 to pick the row's own table. */
static inline void q4_row_pair_bf16(const uint8_t *group, const float *d, const float *m, int i, __m512i *row0,
                                    __m512i *row1) {
    __m512i tables = (__m512i)_mm512_cvtne2ps_pbh(q4_table(d, m, i + 1), q4_table(d, m, i));
    const __m512i shifts = _mm512_set_epi64(0x000C000C000C000Cll, 0x000C000C000C000Cll, 0x0008000800080008ll,
                                            0x0008000800080008ll, 0x0004000400040004ll, 0x0004000400040004ll, 0, 0);
    const __m512i code = _mm512_set1_epi16(15), second = _mm512_set1_epi16(16);
    const uint8_t *codes = group + 64 + 16 * i;
    __m512i idx0 = _mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)codes)), shifts);
    __m512i idx1 = _mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(codes + 16))), shifts);
    *row0 = _mm512_permutexvar_epi16(_mm512_and_si512(idx0, code), tables);
    *row1 = _mm512_permutexvar_epi16(_mm512_ternarylogic_epi32(idx1, code, second, 0xEA), tables);  /* (a & b) | c */
}
#endif

#elif defined(__AVX2__)
static inline __m256 round_bf16_8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
}

static inline void q4_scales(const uint8_t *group, float *d, float *m) {  /* F16C: every AVX2 CPU has it */
    for (int h = 0; h < 2; h++) {
        _mm256_storeu_ps(d + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16 * h))));
        _mm256_storeu_ps(m + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 32 + 16 * h))));
    }
}

/* Row i of a group into out[0..31] as float32: inputs 8q .. 8q + 7 are bits 4q .. 4q + 3 of the 8 words. */
static inline void q4_row_floats(const uint8_t *group, const float *d, const float *m, int i, float *out) {
    __m256 scale = _mm256_set1_ps(d[i]), offset = _mm256_set1_ps(m[i]);
    __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(group + 64 + 16 * i)));
    for (int quarter = 0; quarter < 4; quarter++) {
        __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, 4 * quarter), _mm256_set1_epi32(15)));
        _mm256_storeu_ps(out + 8 * quarter, round_bf16_8(_mm256_add_ps(_mm256_mul_ps(scale, q), offset)));
    }
}
#endif

#endif
