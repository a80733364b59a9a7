/* y = x @ W^T for a few float32 rows of x and a W that is exactly bfloat16, on AVX2 CPUs without AVX-512:
   bfloat16 panels widened to float32 in registers, half the bytes of float32 panels and bitwise the same
   products (the kernel is panel_mm.c's AVX2 build; this file is its library for the bfloat16 entry point).

   Why: there a decode step's weight products are bound by the bytes they stream (the default model: 50 MB
   of float32 layer weights, 2.9 ms of a 4.7 ms step at 1K context on a 2-vCPU AVX2 EPYC host, about
   17 GB/s); its weights are bfloat16, so they stay bfloat16 (25 MB, which also fits the 32 MB L3 such a
   host has). Greedy and sampled outputs do not change. AVX-512 CPUs keep float32 panels or AMX tiles. */
#if defined(__AVX512F__) || !defined(__AVX2__) || !defined(__FMA__)
#error "panel_bf16 is for AVX2 CPUs without AVX-512 (those use float32 panels or AMX tiles)"
#endif
#include "panel_mm.c"
