/* Sixteen float lanes for the native kernels of this folder, on AVX-512 or on AVX2 with FMA.

   Why: the kernels were written for AVX-512 (one 16-float register), but many CPUs a Space or a laptop
   runs on have only AVX2 (8 floats a register; Intel's client cores since 2021, many cloud AMD hosts).
   The kernels are written once against these names. With AVX-512 each name is the AVX-512 intrinsic
   itself, so that build compiles to the same code as before; with AVX2 a vector is a pair of 8-float
   registers and a mask 16 bits of an int, each operation done on both halves.

   Arithmetic is lane by lane and identical on both (the same multiplies, adds and fused multiply-adds in
   the same order per lane); only the lane reductions (vf_reduce_add, vf_reduce_max) may sum in another
   order, and a library is always built for one CPU, so its results never mix the two. */
#ifndef TOKENSWIFT_SIMD16_H
#define TOKENSWIFT_SIMD16_H
#include <immintrin.h>

#if defined(__AVX512F__)

#define SIMD16_ISA "avx512"
typedef __m512 vf;
typedef __mmask16 vmask;
#define vf_zero _mm512_setzero_ps
#define vf_set1 _mm512_set1_ps
#define vf_loadu _mm512_loadu_ps
#define vf_load _mm512_load_ps
#define vf_storeu _mm512_storeu_ps
#define vf_store _mm512_store_ps
#define vf_add _mm512_add_ps
#define vf_sub _mm512_sub_ps
#define vf_mul _mm512_mul_ps
#define vf_div _mm512_div_ps
#define vf_max _mm512_max_ps
#define vf_min _mm512_min_ps
#define vf_fmadd _mm512_fmadd_ps
#define vf_fnmadd _mm512_fnmadd_ps
#define vf_reduce_add _mm512_reduce_add_ps
#define vf_reduce_max _mm512_reduce_max_ps
#define vf_maskz_loadu _mm512_maskz_loadu_ps
#define vf_mask_storeu _mm512_mask_storeu_ps
#define vf_maskz_mov _mm512_maskz_mov_ps
#define vf_mask_max _mm512_mask_max_ps
#define vf_mask_mul _mm512_mask_mul_ps
#define vf_scalef _mm512_scalef_ps
#define vf_round_nearest(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vf_cmp_lt(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define vf_mask_cmp_eq(k, a, b) _mm512_mask_cmp_ps_mask((k), (a), (b), _CMP_EQ_OQ)
#define vf_mask_cmp_ge(k, a, b) _mm512_mask_cmp_ps_mask((k), (a), (b), _CMP_GE_OQ)

#elif defined(__AVX2__) && defined(__FMA__)

#define SIMD16_ISA "avx2"
typedef struct { __m256 lo, hi; } vf;
typedef unsigned int vmask;  /* bit i: lane i */

static inline vf vf_pair(__m256 lo, __m256 hi) { vf r = {lo, hi}; return r; }
static inline vf vf_zero(void) { return vf_pair(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline vf vf_set1(float x) { __m256 v = _mm256_set1_ps(x); return vf_pair(v, v); }
static inline vf vf_loadu(const float *p) { return vf_pair(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline vf vf_load(const float *p) { return vf_pair(_mm256_load_ps(p), _mm256_load_ps(p + 8)); }
static inline void vf_storeu(float *p, vf v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline void vf_store(float *p, vf v) { _mm256_store_ps(p, v.lo); _mm256_store_ps(p + 8, v.hi); }
#define SIMD16_BINARY(NAME, OP) \
    static inline vf NAME(vf a, vf b) { return vf_pair(OP(a.lo, b.lo), OP(a.hi, b.hi)); }
SIMD16_BINARY(vf_add, _mm256_add_ps)
SIMD16_BINARY(vf_sub, _mm256_sub_ps)
SIMD16_BINARY(vf_mul, _mm256_mul_ps)
SIMD16_BINARY(vf_div, _mm256_div_ps)
SIMD16_BINARY(vf_max, _mm256_max_ps)
SIMD16_BINARY(vf_min, _mm256_min_ps)
#undef SIMD16_BINARY
static inline vf vf_fmadd(vf a, vf b, vf c) { return vf_pair(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return vf_pair(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)); }

static inline float simd16_sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vf_reduce_add(vf v) { return simd16_sum8(_mm256_add_ps(v.lo, v.hi)); }
static inline float vf_reduce_max(vf v) {
    __m256 m = _mm256_max_ps(v.lo, v.hi);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The eight lanes of bits 0-7 of `bits` as all-ones / all-zeros 32-bit lanes. */
static inline __m256i simd16_lanes(unsigned int bits) {
    const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), select), select);
}
static inline vf vf_maskz_loadu(vmask k, const float *p) {
    if ((k & 0xFFFFu) == 0xFFFFu) return vf_loadu(p);
    return vf_pair(_mm256_maskload_ps(p, simd16_lanes(k)), _mm256_maskload_ps(p + 8, simd16_lanes(k >> 8)));
}
static inline void vf_mask_storeu(float *p, vmask k, vf v) {
    if ((k & 0xFFFFu) == 0xFFFFu) { vf_storeu(p, v); return; }
    _mm256_maskstore_ps(p, simd16_lanes(k), v.lo);
    _mm256_maskstore_ps(p + 8, simd16_lanes(k >> 8), v.hi);
}
static inline vf vf_maskz_mov(vmask k, vf v) {
    return vf_pair(_mm256_and_ps(v.lo, _mm256_castsi256_ps(simd16_lanes(k))),
                   _mm256_and_ps(v.hi, _mm256_castsi256_ps(simd16_lanes(k >> 8))));
}
/* lanes of k: op(a, b); others: src */
static inline vf vf_mask_max(vf src, vmask k, vf a, vf b) {
    return vf_pair(_mm256_blendv_ps(src.lo, _mm256_max_ps(a.lo, b.lo), _mm256_castsi256_ps(simd16_lanes(k))),
                   _mm256_blendv_ps(src.hi, _mm256_max_ps(a.hi, b.hi), _mm256_castsi256_ps(simd16_lanes(k >> 8))));
}
static inline vf vf_mask_mul(vf src, vmask k, vf a, vf b) {
    return vf_pair(_mm256_blendv_ps(src.lo, _mm256_mul_ps(a.lo, b.lo), _mm256_castsi256_ps(simd16_lanes(k))),
                   _mm256_blendv_ps(src.hi, _mm256_mul_ps(a.hi, b.hi), _mm256_castsi256_ps(simd16_lanes(k >> 8))));
}
static inline vf vf_round_nearest(vf x) {
    return vf_pair(_mm256_round_ps(x.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                   _mm256_round_ps(x.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* p * 2^n for whole n in [-126, 127] (the only use: exp_nonpositive, n in [-126, 0]): exact, as scalef is. */
static inline __m256 simd16_scale8(__m256 p, __m256 n) {
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
static inline vf vf_scalef(vf p, vf n) { return vf_pair(simd16_scale8(p.lo, n.lo), simd16_scale8(p.hi, n.hi)); }
static inline vmask simd16_bits(__m256 lo, __m256 hi) {
    return (vmask)_mm256_movemask_ps(lo) | ((vmask)_mm256_movemask_ps(hi) << 8);
}
static inline vmask vf_cmp_lt(vf a, vf b) {
    return simd16_bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ));
}
static inline vmask vf_mask_cmp_eq(vmask k, vf a, vf b) {
    return k & simd16_bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_EQ_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_EQ_OQ));
}
static inline vmask vf_mask_cmp_ge(vmask k, vf a, vf b) {
    return k & simd16_bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_GE_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GE_OQ));
}

#else
#error "the native kernels need AVX-512F, or AVX2 with FMA"
#endif

#endif
