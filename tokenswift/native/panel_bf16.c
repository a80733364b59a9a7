/* y = x @ W^T for a few float32 rows of x and a W that is exactly bfloat16, on AVX-512 or AVX2 CPUs:
   bfloat16 panels widened to float32 in registers, half the bytes of float32 panels and bitwise the same
   products (the kernel is panel_mm.c's, built for this CPU; this file is its library for the bfloat16 entry
   point).

   Why: there a decode step's weight products are bound by the bytes they stream (the default model: 50 MB
   of float32 layer weights, 2.9 ms of a 4.7 ms step at 1K context on a 2-vCPU AVX2 EPYC host, about
   17 GB/s); its weights are bfloat16, so they stay bfloat16 (25 MB, which also fits the 32 MB L3 such a
   host has). Greedy and sampled outputs do not change. AVX-512 CPUs with AMX keep AMX tiles (panel_amx.c)
   where they serve; without AMX (an AMD EPYC with AVX-512, or TOKENSWIFT_AMX=0) these panels serve, and keep
   the AVX-512 build's passes of up to 12 rows. Measured on a 2-vCPU Sapphire Rapids host with AMX turned off
   (one thread, a training job sharing the host: fastest of 60 / 30 interleaved runs), one forward and its
   logits at 1K context for 1 / 4 / 8 rows: the default model 6.2 / 6.9 / 8.6 ms with float32 panels ->
   4.0 / 4.5 / 4.6 (AMX tiles 3.8 / 4.3 / 4.7; the forced AVX2 build's bfloat16 panels 4.2 / 5.2 / 6.8);
   SmolLM2-135M 47 / 55 / 66 -> 29 / 33 / 39 (AMX 29 / 31 / 38; AVX2 build 31 / 40 / 56). */
#include "panel_mm.c"
