/* The whole decoder stack of a Llama-family model for a few new tokens, in one native call.

   Why: on a CPU the lean step's arithmetic for one token is a few milliseconds of weight streaming
   (panel_mm.c) and attention (attend_rows.c), but PyTorch adds about 40 small ops per layer around them
   (norms, rotary, residual adds, the cache write, views and copies): measured at 1K context on the
   2-vCPU Xeon, about half of an AR step. Here those parts are plain loops over a few rows, and the
   products call the same kernels as the PyTorch path (panel_mm.c's two, panel_amx.c or panel_q4.c, as each matrix
   is laid out, and attend_rows.c), so the step computes the same function. Both builds of panel_mm.c (AVX-512
   and AVX2) have the bfloat16 panels; AMX tiles only the library built with them (build.py's "amx" variant).

   The element-wise parts are exported too (rms_norm_rows, silu_mul_rows): the PyTorch path calls them
   for every forward this function does not serve (prefill chunks, big trees), so a row's arithmetic is
   the same whichever path ran it. Every part works row by row: a row's result does not depend on how
   many rows are computed with it. Built with -ffp-contract=off (see build.py): every product and sum
   is rounded where the C says, as in PyTorch's element-wise ops.

   The products and attention are other compilation units of the same library (kernels.h). Every function
   checks its sizes, indices and scratch before it writes anything (a head size above 128 would overflow
   rotate's buffer, a slot past the cache its buffers) and returns KERNEL_BAD_ARGUMENTS or KERNEL_SMALL_SCRATCH;
   the scratch (layer_rows_scratch, heads_top_scratch floats) is the caller's, so nothing is allocated per call. */
#include <math.h>
#include <string.h>
#include <time.h>
#include "kernels.h"
#include "vector_exp.h"

size_t sizeof_layer_weights(void) { return sizeof(layer_weights); }
size_t sizeof_head_weights(void) { return sizeof(head_weights); }

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for t rows of n floats (n a multiple of 16). */
int rms_norm_rows(const float *x, const float *w, float *y, int t, int n, float eps) {
    if (t < 0 || n < 16 || n % 16) return KERNEL_BAD_ARGUMENTS;
    for (int r = 0; r < t; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        vf acc = vf_zero();
        for (int i = 0; i < n; i += 16) {
            vf v = vf_loadu(xr + i);
            acc = vf_fmadd(v, v, acc);
        }
        float inv = 1.0f / sqrtf(vf_reduce_add(acc) / (float)n + eps);
        vf s = vf_set1(inv);
        for (int i = 0; i < n; i += 16)
            vf_storeu(yr + i, vf_mul(vf_mul(vf_loadu(xr + i), s), vf_loadu(w + i)));
    }
    return 0;
}

/* silu(x) = x * sigmoid(x), from exp of a non-positive argument only: x / (1 + e^-x) for x >= 0,
   x e^x / (1 + e^x) below. */
static inline vf silu16(vf x) {
    vf neg_abs = vf_min(x, vf_sub(vf_zero(), x));
    vf e = exp_nonpositive(neg_abs);
    vf denom = vf_add(vf_set1(1.0f), e);
    vmask negative = vf_cmp_lt(x, vf_zero());
    vf num = vf_mask_mul(x, negative, x, e);
    return vf_div(num, denom);
}

/* y[r][i] = silu(gu[r][i]) * gu[r][inter + i]: gate and up side by side in each row of 2 * inter floats. */
int silu_mul_rows(const float *gu, float *y, int t, int inter) {
    if (t < 0 || inter < 16 || inter % 16) return KERNEL_BAD_ARGUMENTS;
    for (int r = 0; r < t; r++) {
        const float *gate = gu + (size_t)r * 2 * inter, *up = gate + inter;
        float *yr = y + (size_t)r * inter;
        for (int i = 0; i < inter; i += 16)
            vf_storeu(yr + i, vf_mul(silu16(vf_loadu(gate + i)), vf_loadu(up + i)));
    }
    return 0;
}

#define MAX_HEAD_DIM 128

/* One head vector (d floats) rotated in place: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
   d <= MAX_HEAD_DIM: layer_rows checks it before any call. */
static inline void rotate(float *x, const float *cos, const float *sin, int d) {
    int half = d / 2;
    float tmp[MAX_HEAD_DIM] __attribute__((aligned(64)));
    for (int i = 0; i < half; i++) tmp[i] = -x[half + i];
    for (int i = 0; i < half; i++) tmp[half + i] = x[i];
    for (int i = 0; i < d; i++) {
        float a = x[i] * cos[i];
        float b = tmp[i] * sin[i];
        x[i] = a + b;
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* y (t, n) = x (t, k) @ W^T through the kernel W is laid out for (AMX tiles with amx_bytes of scratch at amx);
   its seconds are added to parts[1] (parts non-NULL). */
static int product(const void *w, int kind, const float *x, float *y, int t, int k, int n, double *parts,
                   void *amx, long amx_bytes) {
    double t0 = parts ? now() : 0.0;
    int code = KERNEL_NO_KIND;
#if HAVE_AMX
    if (kind == 1) code = panel_amx(x, (const uint16_t *)w, y, t, k, n, amx, amx_bytes);
    if (kind == 4) code = panel_q4_amx(x, (const uint8_t *)w, y, t, k, n, amx, amx_bytes);
    if (kind == 5) code = panel_q8_amx(x, (const uint8_t *)w, y, t, k, n, amx, amx_bytes);
#endif
    if (kind == 3) code = panel_q4(x, (const uint8_t *)w, y, t, k, n, amx, amx_bytes);
    if (kind == 2) code = panel_bf16(x, (const uint16_t *)w, y, t, k, n);  /* panel_mm.c: in every build */
    if (kind == 0) code = panel_mm(x, (const float *)w, y, t, k, n);
    if (parts) parts[1] += now() - t0;
    return code;
}

/* Bytes of scratch the products of t rows with inputs of up to `widest` floats need, whatever kernel each weight
   is laid out for (AMX tiles, GGUF blocks); the panels' Python wrapper sizes its scratch with it too. */
long product_scratch(int t, int widest) {
    long bytes = panel_q4_scratch(t, widest);
#if HAVE_AMX
    long tiles = panel_amx_scratch(t, widest), q4_tiles = panel_q4_amx_scratch(t, widest);
    if (tiles > bytes) bytes = tiles;
    if (q4_tiles > bytes) bytes = q4_tiles;
#endif
    return bytes;
}

static long round16(long floats) { return (floats + 15) / 16 * 16; }

/* Whether this library has a kernel for weights laid out as `kind`. */
static int kind_served(int kind) {
    return kind == 0 || kind == 2 || kind == 3 || (HAVE_AMX && (kind == 1 || kind == 4 || kind == 5));
}

/* layer_rows's scratch for t rows over s keys, in floats: the rows' buffers, then the attention scores (from
   *scores_at), then the products' scratch (from *amx_at: AMX split rows, rebuilt strips of GGUF blocks). Returns
   the total. */
static long layer_scratch(int t, int hidden, int hq, int hkv, int d, int inter, int s, long *scores_at, long *amx_at) {
    long nqkv = (long)(hq + 2 * hkv) * d;
    *scores_at = round16((long)t * (2L * hidden + nqkv + 3L * hq * d + 3L * inter));
    *amx_at = round16(*scores_at + attend_rows_scratch(hq / hkv * t, s));
    int widest = hidden > hq * d ? hidden : hq * d;
    if (inter > widest) widest = inter;
    return *amx_at + (product_scratch(t, widest) + 3) / 4;
}

/* h: (t, hidden) residual stream, updated in place through every layer. cos, sin: (t, d) rotary tables of
   the new tokens' positions. k_cache[l], v_cache[l]: layer l's (hkv, capacity, d) buffers, head_stride =
   capacity * d; the new tokens' keys and values go to slots start .. start + t - 1 and attention covers
   slots 0 .. start + t - 1. block_mask: (t, t) visibility among the new tokens (NULL: all visible).
   scratch: at least layer_rows_scratch(...) floats. parts: NULL, or two seconds counters to which the time in
   attention and in the weight products is added (python -m tokenswift.bench rows). Returns 0,
   KERNEL_BAD_ARGUMENTS (before writing anything: sizes the kernels do not handle, slots past the cache's
   head_stride / d), KERNEL_NO_KIND (a weight layout this build has no kernel for), KERNEL_SMALL_SCRATCH, or a
   product's code (KERNEL_NO_TILES: h and the cache may then be partly written). */
int layer_rows(float *h, int t, int layers, const layer_weights *weights, const float *cos, const float *sin,
               float *const *k_cache, float *const *v_cache, long head_stride, int start,
               const unsigned char *block_mask, int hidden, int hq, int hkv, int d, int inter, float eps,
               float scale, float *scratch, long scratch_floats, double *parts) {
    if (t < 1 || layers < 1 || (d != 64 && d != MAX_HEAD_DIM) || hq < 1 || hkv < 1 || hq % hkv || hidden < 16
            || hidden % 16 || inter < 16 || inter % 16 || start < 0 || (long)(start + t) * d > head_stride)
        return KERNEL_BAD_ARGUMENTS;
    for (int l = 0; l < layers; l++)
        for (int i = 0; i < 4; i++)
            if (!kind_served(weights[l].kinds[i])) return KERNEL_NO_KIND;
    long scores_at, amx_at;
    if (scratch == NULL || scratch_floats < layer_scratch(t, hidden, hq, hkv, d, inter, start + t, &scores_at, &amx_at))
        return KERNEL_SMALL_SCRATCH;
    float *scores = scratch + scores_at;
    long scores_floats = amx_at - scores_at;
    void *amx = scratch + amx_at;
    long amx_bytes = (scratch_floats - amx_at) * (long)sizeof(float);
    int g = hq / hkv, nqkv = (hq + 2 * hkv) * d;
    float *x = scratch;                           /* (t, hidden) normed input */
    float *qkv = x + (size_t)t * hidden;          /* (t, nqkv) */
    float *qs = qkv + (size_t)t * nqkv;           /* (hkv, g t, d) stacked queries */
    float *att = qs + (size_t)t * hq * d;         /* (hq, t, d) attention output */
    float *o_in = att + (size_t)t * hq * d;       /* (t, hq d) */
    float *gu = o_in + (size_t)t * hq * d;        /* (t, 2 inter) */
    float *act = gu + (size_t)t * 2 * inter;      /* (t, inter) */
    float *y = act + (size_t)t * inter;           /* (t, hidden) a product's output */
    for (int l = 0; l < layers; l++) {
        const layer_weights *w = weights + l;
        rms_norm_rows(h, w->in_norm, x, t, hidden, eps);
        int code = product(w->qkv, w->kinds[0], x, qkv, t, hidden, nqkv, parts, amx, amx_bytes);
        if (code) return code;
        if (w->qkv_bias)
            for (int r = 0; r < t; r++)
                for (int i = 0; i < nqkv; i++) qkv[(size_t)r * nqkv + i] = qkv[(size_t)r * nqkv + i] + w->qkv_bias[i];
        float *kc = k_cache[l], *vc = v_cache[l];
        for (int r = 0; r < t; r++) {
            float *row = qkv + (size_t)r * nqkv;
            for (int head = 0; head < hq + hkv; head++) rotate(row + (size_t)head * d, cos + (size_t)r * d, sin + (size_t)r * d, d);
            for (int j = 0; j < hq; j++)  /* query head j = kv head j / g, member j % g: stacked row (j % g) t + r */
                memcpy(qs + ((size_t)(j / g) * g * t + (size_t)(j % g) * t + r) * d, row + (size_t)j * d, d * sizeof(float));
            for (int kv = 0; kv < hkv; kv++) {
                memcpy(kc + kv * head_stride + (size_t)(start + r) * d, row + (size_t)(hq + kv) * d, d * sizeof(float));
                memcpy(vc + kv * head_stride + (size_t)(start + r) * d, row + (size_t)(hq + hkv + kv) * d, d * sizeof(float));
            }
        }
        double t0 = parts ? now() : 0.0;
        code = attend_rows(qs, kc, vc, head_stride, att, hkv, g * t, t, start + t, d, scale, block_mask, scores,
                           scores_floats);
        if (code) return code;
        if (parts) parts[0] += now() - t0;
        for (int r = 0; r < t; r++)  /* (hq, t, d) -> (t, hq d) */
            for (int j = 0; j < hq; j++)
                memcpy(o_in + ((size_t)r * hq + j) * d, att + ((size_t)j * t + r) * d, d * sizeof(float));
        if ((code = product(w->o, w->kinds[1], o_in, y, t, hq * d, hidden, parts, amx, amx_bytes))) return code;
        for (size_t i = 0; i < (size_t)t * hidden; i++) h[i] = h[i] + y[i];
        rms_norm_rows(h, w->post_norm, x, t, hidden, eps);
        if ((code = product(w->gate_up, w->kinds[2], x, gu, t, hidden, 2 * inter, parts, amx, amx_bytes))) return code;
        silu_mul_rows(gu, act, t, inter);
        if ((code = product(w->down, w->kinds[3], act, y, t, inter, hidden, parts, amx, amx_bytes))) return code;
        for (size_t i = 0; i < (size_t)t * hidden; i++) h[i] = h[i] + y[i];
    }
    return 0;
}

/* Floats of scratch layer_rows needs for up to t rows over a cache of `capacity` slots (0 for sizes it refuses). */
long layer_rows_scratch(int t, int hidden, int hq, int hkv, int d, int inter, int capacity) {
    long scores_at, amx_at;
    if (t < 1 || hq < 1 || hkv < 1 || capacity < 1) return 0;
    return layer_scratch(t, hidden, hq, hkv, d, inter, capacity, &scores_at, &amx_at);
}

/* The cache's compaction after a verification: in every layer and KV head, the rows of slots src[0..n) move to
   slots dst .. dst + n - 1, in order. The accepted path's slots ascend and src[i] >= dst + i, so copying in
   order never overwrites a row still to be moved. Returns KERNEL_BAD_ARGUMENTS (moving nothing) for a slot
   outside the cache's head_stride / d slots or sources that do not ascend from dst. */
int move_slots(float *const *k_cache, float *const *v_cache, int layers, int hkv, long head_stride, int d,
               const long *src, int n, int dst) {
    if (layers < 0 || hkv < 1 || d < 1 || n < 0 || dst < 0 || (long)(dst + n) * d > head_stride)
        return KERNEL_BAD_ARGUMENTS;
    long slots = head_stride / d;
    for (int i = 0; i < n; i++)
        if (src[i] < dst + i || src[i] >= slots || (i && src[i] <= src[i - 1])) return KERNEL_BAD_ARGUMENTS;
    for (int l = 0; l < layers; l++)
        for (int h = 0; h < hkv; h++) {
            float *kh = k_cache[l] + h * head_stride, *vh = v_cache[l] + h * head_stride;
            for (int i = 0; i < n; i++) {
                if (src[i] == dst + i) continue;
                memmove(kh + (size_t)(dst + i) * d, kh + (size_t)src[i] * d, d * sizeof(float));
                memmove(vh + (size_t)(dst + i) * d, vh + (size_t)src[i] * d, d * sizeof(float));
            }
        }
    return 0;
}

/* One multi-token head in the TokenSwift (Medusa) layout (head_weights, kernels.h): h <- h + W rms_norm(h, in_norm);
   the head's output, read by the LM head, is rms_norm(h, post_norm). The heads are chained: head i + 1 starts from
   head i's h. */
#define MAX_HEADS 16
#define MAX_TOP 16

/* Floats of scratch heads_top needs for up to MAX_HEADS heads: the rows, every level's logits, the AMX split rows. */
long heads_top_scratch(int hidden, int vocab) {
    if (hidden < 1 || vocab < 1) return 0;
    return round16((3L + MAX_HEADS) * hidden + (long)MAX_HEADS * vocab)
           + (product_scratch(MAX_HEADS, hidden) + 3) / 4;
}

/* The drafts of `levels` chained heads for one hidden row h0 (hidden floats, the last layer's output before the
   final norm): per level, the `top` most likely ids of the drafting LM head (`vocab` rows, laid out as lm_kind)
   with their softmax probabilities over those rows, most likely first (a tie: the lower id first). ids and probs
   are (levels, top); scratch holds scratch_floats >= heads_top_scratch(hidden, vocab) floats. Returns 0,
   KERNEL_BAD_ARGUMENTS for `levels` or `top` outside 1..16 or a hidden size that is not a multiple of 16,
   KERNEL_SMALL_SCRATCH, or a kernel's error code.

   Why: in Python the same chain is about 15 small PyTorch calls, a softmax and a top-k, 0.5-0.9 ms in the
   decode loop of the 2-vCPU AVX2 host (caches cold after the step's weight stream), a fifth of a step; the
   products and norms here are the lean step's own kernels. Drafts are only proposals (every token is verified),
   so this changes which tokens are offered, never the output. */
int heads_top(const float *h0, int levels, const head_weights *heads, const void *lm, int lm_kind, int vocab,
              int hidden, int top, long *ids, float *probs, float *scratch, long scratch_floats) {
    if (top < 1 || top > MAX_TOP || levels < 1 || levels > MAX_HEADS || hidden < 16 || hidden % 16 || vocab < 1)
        return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_floats < heads_top_scratch(hidden, vocab)) return KERNEL_SMALL_SCRATCH;
    long amx_at = round16((3L + MAX_HEADS) * hidden + (long)MAX_HEADS * vocab);
    void *amx = scratch + amx_at;
    long amx_bytes = (scratch_floats - amx_at) * (long)sizeof(float);
    float *h = scratch, *x = h + hidden, *y = x + hidden, *outs = y + hidden, *logits = outs + (size_t)levels * hidden;
    memcpy(h, h0, (size_t)hidden * sizeof(float));
    int code;
    for (int l = 0; l < levels; l++) {
        const head_weights *w = heads + l;
        rms_norm_rows(h, w->in_norm, x, 1, hidden, w->eps);
        if ((code = product(w->linear, w->kind, x, y, 1, hidden, hidden, NULL, amx, amx_bytes))) return code;
        for (int i = 0; i < hidden; i++) h[i] = h[i] + y[i];
        rms_norm_rows(h, w->post_norm, outs + (size_t)l * hidden, 1, hidden, w->eps);
    }
    /* every level's LM-head row in one product: the drafting rows are read once */
    if ((code = product(lm, lm_kind, outs, logits, levels, hidden, vocab, NULL, amx, amx_bytes))) return code;
    for (int l = 0; l < levels; l++) {
        const float *row = logits + (size_t)l * vocab;
        /* the top ids by insertion into a short sorted list; then the softmax's normaliser over every row */
        long *best = ids + (size_t)l * top;
        float *best_p = probs + (size_t)l * top;
        int found = 0;
        for (int j = 0; j < vocab; j++) {
            float v = row[j];
            if (found == top && !(v > row[best[top - 1]])) continue;
            int at = found < top ? found++ : top - 1;
            while (at > 0 && v > row[best[at - 1]]) { best[at] = best[at - 1]; at--; }
            best[at] = j;
        }
        float peak = row[best[0]];
        vf total = vf_zero();
        int j = 0;
        for (; j + 16 <= vocab; j += 16) total = vf_add(total, exp_nonpositive(vf_sub(vf_loadu(row + j), vf_set1(peak))));
        float sum = vf_reduce_add(total);
        for (; j < vocab; j++) sum += expf(row[j] - peak);
        for (int i = 0; i < found; i++) best_p[i] = expf(row[best[i]] - peak) / sum;
        for (int i = found; i < top; i++) { best[i] = -1; best_p[i] = 0.0f; }
    }
    return 0;
}

