/* The target's token for a few rows of logits at once: the contextual penalty, then greedy argmax, or
   temperature, min-p and an inverse-CDF sample with one given uniform per row.

   Why: the same chain in PyTorch is about 30 small ops over the vocabulary (a window mask built by
   bincount, two where's, softmax, the min-p cut, two renormalisations, a float64 cumsum, searchsorted),
   about 0.4 ms for one row and 0.8 ms for a few on a 2-vCPU Xeon: a tenth of a decode step. Here it is
   one pass per row over 8K floats.

   Each row is decided on its own (nothing depends on how many rows come with it), so AR, which decides one
   row, and a tree verification, which decides many, produce the same token for the same row.

   logits: (rows, vocab) float32. Row r's penalty window is (history[0:n] + its extras)[-window:], where
   its extras are extras[offsets[r] : offsets[r + 1]] (its drafted ancestors and itself); every distinct
   token in it has its logit divided by `penalty` if positive, else multiplied by it (penalty 1: none).
   greedy: the first index of the largest penalised logit. Else y = x / temperature, e_i = exp(y_i - max y),
   tokens with e_i < min_p are removed (the probability cut p_i < min_p * p_max), and the token is the first
   i whose cumulative kept mass exceeds uniforms[r] times the total (summed in float64 per block of 16).
   probs (may be NULL): each row's distribution (greedy: the softmax of the penalised logits; sampling:
   the kept mass renormalised). scratch: decide_rows_scratch(vocab) bytes of the caller's (a row's floats, its
   blocks' float64 sums, a byte per token for the penalty's marks: nothing vocabulary-sized is allocated or put
   on the stack per call). Returns 0, or KERNEL_BAD_ARGUMENTS for a token outside the vocabulary, counts or
   offsets out of range, a missing uniform or a temperature that is not positive when sampling; or
   KERNEL_SMALL_SCRATCH.

   walk_tree (below) runs the exact acceptance walk over a verified tree with the same per-row decision, deciding
   only the rows the walk visits: one call where the Python walk took a dozen small ops, each several times its
   usual cost right after a forward has streamed the weights through the caches. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels.h"
#include "vector_exp.h"

#define LANES 16

/* A decision's scratch, carved from the caller's bytes: x (vocab floats, padded to whole blocks), the blocks'
   sums (float64), mark (vocab bytes). */
typedef struct {
    float *x;
    double *block_sum;
    unsigned char *mark;
} work;

static long blocks_of(int vocab) { return (vocab + LANES - 1) / LANES; }

/* Bytes of scratch decide_rows and walk_tree need for a vocabulary of `vocab` tokens. */
long decide_rows_scratch(int vocab) {
    if (vocab < 1) return 0;
    return blocks_of(vocab) * LANES * (long)sizeof(float) + blocks_of(vocab) * (long)sizeof(double) + vocab;
}

static work work_of(void *scratch, int vocab) {
    work w;
    w.x = (float *)scratch;
    w.block_sum = (double *)(w.x + blocks_of(vocab) * LANES);
    w.mark = (unsigned char *)(w.block_sum + blocks_of(vocab));
    return w;
}

static inline vmask tail_mask(int left) { return left >= LANES ? (vmask)0xFFFF : (vmask)((1u << left) - 1u); }

static float row_max(const float *x, int vocab) {
    vf m = vf_set1(-INFINITY);
    for (int j = 0; j < vocab; j += LANES) {
        vmask k = tail_mask(vocab - j);
        m = vf_mask_max(m, k, m, vf_maskz_loadu(k, x + j));
    }
    return vf_reduce_max(m);
}

/* e[j] = exp(scale * (x[j] - peak)) in place of out (out may be x); returns the float64 sum. */
static double exp_shifted(const float *x, float *out, int vocab, float peak, float scale) {
    const vf p = vf_set1(peak), s = vf_set1(scale);
    double total = 0.0;
    for (int j = 0; j < vocab; j += LANES) {
        vmask k = tail_mask(vocab - j);
        vf v = vf_maskz_loadu(k, x + j);
        vf e = vf_maskz_mov(k, exp_nonpositive(vf_mul(vf_sub(v, p), s)));
        vf_mask_storeu(out + j, k, e);
        total += (double)vf_reduce_add(e);
    }
    return total;
}

static int penalise(float *x, int vocab, const int64_t *history, long n, long window, const int64_t *extra,
                    long a, float penalty, unsigned char *mark) {
    memset(mark, 0, (size_t)vocab);
    long start = n + a - window;  /* index into history[0:n] + extra */
    if (start < 0) start = 0;
    for (long i = start; i < n + a; i++) {
        int64_t tok = i < n ? history[i] : extra[i - n];
        if (tok < 0 || tok >= vocab) return -1;
        if (mark[tok]) continue;
        mark[tok] = 1;
        float v = x[tok];
        x[tok] = v > 0.0f ? v / penalty : v * penalty;
    }
    return 0;
}

static int first_index_of(const float *x, int vocab, float value) {
    const vf v = vf_set1(value);
    for (int j = 0; j < vocab; j += LANES) {
        vmask k = tail_mask(vocab - j);
        vmask hit = vf_mask_cmp_eq(k, vf_maskz_loadu(k, x + j), v);
        if (hit) return j + __builtin_ctz((unsigned)hit);
    }
    return 0;  /* only for a row of NaN */
}

/* Inverse-CDF sample over kept masses e[0..vocab) (0 = removed) with target u * total; the total (summed in
   float64 per block of 16) goes to *kept. block_sum: room for the blocks' sums. */
static int sample_kept(const float *e, int vocab, double u, double *kept, double *block_sum) {
    double total = 0.0;
    int blocks = (int)blocks_of(vocab);
    for (int b = 0; b < blocks; b++) {
        vmask k = tail_mask(vocab - b * LANES);
        block_sum[b] = (double)vf_reduce_add(vf_maskz_loadu(k, e + b * LANES));
        total += block_sum[b];
    }
    *kept = total;
    double target = u * total, before = 0.0;
    for (int b = 0; b < blocks; b++) {
        if (before + block_sum[b] > target) {
            double rest = target - before, acc = 0.0;
            int end = (b + 1) * LANES < vocab ? (b + 1) * LANES : vocab, last = -1;
            for (int j = b * LANES; j < end; j++) {
                if (e[j] > 0.0f) last = j;
                acc += (double)e[j];
                if (acc > rest && e[j] > 0.0f) return j;
            }
            if (last >= 0) return last;  /* rounding: the block's sum and its running sum differ in the last bit */
        }
        before += block_sum[b];
    }
    for (int j = vocab - 1; j >= 0; j--)  /* u * total rounded up to the total: the last kept token */
        if (e[j] > 0.0f) return j;
    return 0;
}

/* One row's decision (see decide_rows): row's logits, its window's drafted part extra[0..a), its uniform u
   (ignored when greedy); the token goes to *token, the distribution to out (may be NULL). */
static int decide_row(const float *row, int vocab, const int64_t *history, long n, long window, const int64_t *extra,
                      long a, float penalty, int greedy, float temperature, float min_p, double u, int64_t *token,
                      float *out, work w) {
    float *x = w.x;
    memcpy(x, row, sizeof(float) * (size_t)vocab);
    if (penalty != 1.0f && penalise(x, vocab, history, n, window, extra, a, penalty, w.mark) != 0)
        return KERNEL_BAD_ARGUMENTS;
    float peak = row_max(x, vocab);
    if (greedy) {
        *token = first_index_of(x, vocab, peak);
        if (out != NULL) {
            double total = exp_shifted(x, out, vocab, peak, 1.0f);
            const vf inv = vf_set1((float)(1.0 / total));
            for (int j = 0; j < vocab; j += LANES) {
                vmask k = tail_mask(vocab - j);
                vf_mask_storeu(out + j, k, vf_mul(vf_maskz_loadu(k, out + j), inv));
            }
        }
        return 0;
    }
    /* y = x / temperature; exp(y - max y) = exp((x - max x) / temperature) */
    exp_shifted(x, x, vocab, peak, 1.0f / temperature);
    double kept = 0.0;
    if (min_p > 0.0f) {
        const vf cut = vf_set1(min_p);
        for (int j = 0; j < vocab; j += LANES) {
            vmask k = tail_mask(vocab - j);
            vf e = vf_maskz_loadu(k, x + j);
            vmask keep = vf_mask_cmp_ge(k, e, cut);
            e = vf_maskz_mov(keep, e);
            vf_mask_storeu(x + j, k, e);
        }
    }
    *token = sample_kept(x, vocab, u, &kept, w.block_sum);
    if (out != NULL) {  /* the kept mass renormalised by the sampler's own total */
        const vf inv = vf_set1((float)(1.0 / kept));
        for (int j = 0; j < vocab; j += LANES) {
            vmask k = tail_mask(vocab - j);
            vf_mask_storeu(out + j, k, vf_mul(vf_maskz_loadu(k, x + j), inv));
        }
    }
    return 0;
}

/* The arguments every decision shares, checked once per call. */
static int bad_rule(int vocab, long n, long window, float penalty, int greedy, float temperature,
                    const double *uniforms, void *scratch, long scratch_bytes) {
    if (vocab < 1 || n < 0 || window < 0 || !(penalty > 0.0f) || (!greedy && (uniforms == NULL || !(temperature > 0.0f))))
        return KERNEL_BAD_ARGUMENTS;
    if (scratch == NULL || scratch_bytes < decide_rows_scratch(vocab)) return KERNEL_SMALL_SCRATCH;
    return 0;
}

int decide_rows(const float *logits, int rows, int vocab, const int64_t *history, long n, long window,
                const int64_t *extras, const int64_t *offsets, float penalty, int greedy, float temperature,
                float min_p, const double *uniforms, int64_t *tokens, float *probs, void *scratch,
                long scratch_bytes) {
    int code = bad_rule(vocab, n, window, penalty, greedy, temperature, uniforms, scratch, scratch_bytes);
    if (code) return code;
    if (rows < 1 || (penalty != 1.0f && (offsets == NULL || offsets[0] != 0))) return KERNEL_BAD_ARGUMENTS;
    if (penalty != 1.0f)
        for (int r = 0; r < rows; r++)
            if (offsets[r + 1] < offsets[r]) return KERNEL_BAD_ARGUMENTS;
    work w = work_of(scratch, vocab);
    for (int r = 0; r < rows; r++) {
        const int64_t *extra = penalty != 1.0f ? extras + offsets[r] : NULL;
        long a = penalty != 1.0f ? (long)(offsets[r + 1] - offsets[r]) : 0;
        if (decide_row(logits + (size_t)r * vocab, vocab, history, n, window, extra, a, penalty, greedy, temperature,
                       min_p, greedy ? 0.0 : uniforms[r], tokens + r, probs != NULL ? probs + (size_t)r * vocab : NULL,
                       w) != 0)
            return KERNEL_BAD_ARGUMENTS;
    }
    return 0;
}

/* The exact acceptance walk (SpecInfer's naive sampling, `acceptance.exact_walk`) over a verified draft tree,
   deciding only the rows it visits. The tree: nodes rows of logits, node 0 the root, tree[0 .. nodes) the
   tokens and tree[nodes .. 2 nodes) the parents (-1 for the root; a parent precedes its children). From the
   root: decide the node's row (its window's drafted part is the path so far, the node's own token included;
   a node at depth d takes uniforms[d]), follow the child holding that token, stop where none does.
   picks[node]: the token decided at each visited node (other entries untouched); probs (may be NULL): the
   visited rows' distributions; path[0 .. k): the accepted nodes below the root; *bonus: the last decision;
   extra: room for `nodes` ids. Returns k, or KERNEL_BAD_ARGUMENTS (a token outside the vocabulary, a tree whose
   root is not node 0 or whose parents do not precede their children, which would let the walk run past `nodes`),
   or KERNEL_SMALL_SCRATCH. */
int walk_tree(const float *logits, int nodes, int vocab, const int64_t *history, long n, long window,
              const int64_t *tree, float penalty, int greedy, float temperature, float min_p,
              const double *uniforms, int64_t *picks, int64_t *path, int64_t *bonus, float *probs, void *scratch,
              long scratch_bytes, int64_t *extra) {
    int code = bad_rule(vocab, n, window, penalty, greedy, temperature, uniforms, scratch, scratch_bytes);
    if (code) return code;
    const int64_t *tokens = tree, *parents = tree + nodes;
    if (nodes < 1 || parents[0] != -1) return KERNEL_BAD_ARGUMENTS;
    for (int j = 1; j < nodes; j++)
        if (parents[j] < 0 || parents[j] >= j) return KERNEL_BAD_ARGUMENTS;
    work w = work_of(scratch, vocab);
    int node = 0, depth = 0;
    for (;;) {
        int64_t token;
        if (decide_row(logits + (size_t)node * vocab, vocab, history, n, window, extra, depth, penalty, greedy,
                       temperature, min_p, greedy ? 0.0 : uniforms[depth], &token,
                       probs != NULL ? probs + (size_t)node * vocab : NULL, w) != 0)
            return KERNEL_BAD_ARGUMENTS;
        picks[node] = token;
        int child = -1;
        for (int j = node + 1; j < nodes; j++) {
            if (parents[j] == node && tokens[j] == token) {
                child = j;
                break;
            }
        }
        if (child < 0) {
            *bonus = token;
            return depth;
        }
        path[depth] = child;
        extra[depth] = token;
        depth++;
        node = child;
    }
}
