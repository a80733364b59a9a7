/* What the compilation units of a kernel library export, to each other and to Python.

   Why: the kernels were once C files that included each other (layer_rows.c included panel_mm.c, attend_rows.c
   and panel_amx.c), so panel_mm was compiled into three libraries, up to five loaded, and one library's AMX code
   relied on a permission asked for by another. Now every .c file is its own compilation unit, and one variant's
   units are linked into one library (build.py); this header is the only thing they share besides simd16.h.
   tokenswift/native/abi.py mirrors the structs below for ctypes and build.py refuses a library whose sizes
   (sizeof_layer_weights, sizeof_head_weights) differ from the mirror's.

   Every kernel checks its arguments and returns 0, or one of the codes below; none allocates memory: the
   callers pass scratch, sized by the *_scratch functions (their sizes are checked too). */
#ifndef TOKENSWIFT_KERNELS_H
#define TOKENSWIFT_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#define KERNEL_BAD_ARGUMENTS (-1)  /* a size, count or index outside what the kernel handles */
#define KERNEL_SMALL_SCRATCH (-2)  /* the scratch passed is smaller than the *_scratch function asks for */
#define KERNEL_NO_KIND (-3)        /* a weight layout this library has no kernel for (AMX tiles off AMX builds) */
#define KERNEL_NO_TILES (-4)       /* the AMX tile state was not granted (amx_ready() not called or refused) */

/* The AMX kernel is in the library built with AMX (build.py's "amx" variant) only. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

#define AMX_MAX_K 4096  /* the widest input panel_amx takes (its split rows are 16 x k bfloat16 per 5 tokens) */

/* The weights of one decoder layer, as the lean step lays them out. */
typedef struct {
    const float *in_norm, *post_norm;  /* (hidden,) */
    const void *qkv, *o, *gate_up, *down;  /* (hq + 2 hkv) d x hidden, hidden x hq d, 2 inter x hidden, hidden x inter */
    const float *qkv_bias;  /* ((hq + 2 hkv) d,) or NULL (Qwen2 has one) */
    int kinds[4];  /* per matrix above: 0 float32 panels (panel_mm), 1 bfloat16 AMX tiles (panel_amx),
                     2 bfloat16 panels widened in registers (panel_bf16), 3 GGUF Q4_1 groups (panel_q4),
                     4 Q4_1 groups on AMX tiles (panel_q4_amx), 5 Q8_0 groups on AMX tiles (panel_q8_amx) */
} layer_weights;

/* One multi-token head in the TokenSwift (Medusa) layout (see heads_top in layer_rows.c). */
typedef struct {
    const float *in_norm, *post_norm;  /* (hidden,) */
    const void *linear;                /* hidden x hidden */
    int kind;                          /* as layer_weights.kinds */
    float eps;
} head_weights;

size_t sizeof_layer_weights(void);
size_t sizeof_head_weights(void);

/* panel_mm.c: y (m, n) = x (m, k) @ W^T, W as n / 32 panels of (k, 32), float32 or bfloat16 (each k row
   interleaved: panels.py's BF16_ORDER). */
int panel_mm(const float *x, const float *panels, float *y, int m, int k, int n);
int panel_bf16(const float *x, const uint16_t *panels, float *y, int m, int k, int n);
const char *panel_isa(void);

/* panel_amx.c (HAVE_AMX builds): the same over AMX tiles; scratch of panel_amx_scratch(m, k) bytes. */
int amx_ready(void);
long panel_amx_scratch(int m, int k);
int panel_amx(const float *x, const uint16_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes);

/* panel_q4.c: the same for W held as GGUF Q4_1 blocks (q4_blocks.h), in every build; scratch of
   panel_q4_scratch(m, k) bytes. q4_dequantize: W's values as the kernels rebuild them. */
long panel_q4_scratch(int m, int k);
int panel_q4(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes);
int q4_dequantize(const uint8_t *w, int n, int k, float *out);

/* panel_amx.c (HAVE_AMX builds): Q4_1 and Q8_0 blocks on AMX tiles; scratch of panel_q4_amx_scratch(m, k) bytes. */
long panel_q4_amx_scratch(int m, int k);
int panel_q4_amx(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes);
int panel_q8_amx(const float *x, const uint8_t *w, float *y, int m, int k, int n, void *scratch, long scratch_bytes);

/* layer_rows.c: bytes of scratch any of the products above needs for t rows of up to `widest` inputs. */
long product_scratch(int t, int widest);

/* attend_rows.c: attention of a few stacked query rows; scratch of attend_rows_scratch(rows, s) floats. */
long attend_rows_scratch(int rows, int s);
int attend_rows(const float *q, const float *k, const float *v, long head_stride, float *out, int hkv, int rows,
                int t, int s, int d, float scale, const unsigned char *block_mask, float *scratch, long scratch_floats);

#endif
