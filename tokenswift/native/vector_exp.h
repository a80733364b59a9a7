/* A vector exp over sixteen float lanes (simd16.h), shared by the native kernels of this folder. */
#ifndef TOKENSWIFT_VECTOR_EXP_H
#define TOKENSWIFT_VECTOR_EXP_H
#include "simd16.h"

/* exp(x) for x <= 0 (scores minus their row maximum): 2^n * e^f with |f| <= ln2 / 2 and a degree-7
   Taylor polynomial (remainder below 6e-9 relative); exactly 0 below -87 (and for -inf). */
static inline vf exp_nonpositive(vf x) {
    const vf log2e = vf_set1(1.44269504088896341f);
    const vf ln2_hi = vf_set1(0.693145751953125f), ln2_lo = vf_set1(1.428606765330187045e-06f);
    vmask tiny = vf_cmp_lt(x, vf_set1(-87.0f));
    x = vf_max(x, vf_set1(-87.0f));
    vf n = vf_round_nearest(vf_mul(x, log2e));
    vf f = vf_fnmadd(n, ln2_hi, x);
    f = vf_fnmadd(n, ln2_lo, f);
    vf p = vf_set1(1.0f / 5040.0f);
    p = vf_fmadd(p, f, vf_set1(1.0f / 720.0f));
    p = vf_fmadd(p, f, vf_set1(1.0f / 120.0f));
    p = vf_fmadd(p, f, vf_set1(1.0f / 24.0f));
    p = vf_fmadd(p, f, vf_set1(1.0f / 6.0f));
    p = vf_fmadd(p, f, vf_set1(0.5f));
    p = vf_fmadd(p, f, vf_set1(1.0f));
    p = vf_fmadd(p, f, vf_set1(1.0f));
    return vf_maskz_mov((vmask)~tiny, vf_scalef(p, n));
}

#endif
