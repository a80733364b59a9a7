"""Grouped-query attention over a preallocated cache, with a mask only where one is needed.

The keys are the cache prefix (visible to every query, no mask) followed by the T new tokens (the
"block", masked by a causal or tree mask). GQA never materialises repeated K/V: the g query heads of a
group are stacked into the query rows of their KV head, so one matmul per KV head reads K once. Long
key ranges are processed in chunks merged by log-sum-exp (as flash-decoding merges splits), which keeps
score tensors inside the CPU cache.

Many queries over a long prefix (a draft tree being verified, a prefill chunk) take the split form on
CPU: the unmasked prefix through PyTorch's CPU flash-attention kernel, which also returns each row's
log-sum-exp, and the small masked block by hand, merged by log-sum-exp. Measured on one core (6 query
heads, 2 KV heads, d 64, 72 tree nodes over 16K keys): 48 ms -> 24 ms per layer, outputs within 4e-8; end to
end (`python -m tokenswift.bench context`, default model, 16K context) verification 228 -> 186 ms per iteration.

A causal block of many new tokens (a prefill chunk) takes the flash kernel for the block too, with its causal
flag (which skips the masked half instead of scoring it). Measured on one core (SmolLM2's 9 query heads, 3 KV
heads, d 64; a 1,023-token prompt in chunks, ms per layer): chunks of 256 32.7 -> 19.7, of 128 23.7 -> 19.5; one
causal call over the whole prompt 17.7.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .native import rows_attention

KEY_CHUNK = 4096
SPLIT_MIN_ROWS = 16  # stacked query rows (group size x new tokens) from which the split form pays
SPLIT_MIN_PREFIX = 512  # prefix keys from which the split form pays
CAUSAL_FLASH_MIN_TOKENS = 64  # new tokens under a causal block mask from which the flash kernel takes the block
#                                (measured, 9 / 3 heads: 64 tokens over 1K keys 2.04 -> 1.86 ms; 16 tokens 0.47 -> 0.63)
SPLIT_ANY_ROWS_PREFIX = 6144  # from this prefix the split form pays even for one token (measured: 8K keys,
#                               one token, 3 stacked heads: 650 us split vs 757 plain; 12K: 867 vs 1,175)
_cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# The native few-row kernel (tokenswift/native/attend_rows.c), where it is available and measured faster here
# (one thread, 6 query heads, 2 KV heads, d 64; microseconds per layer, PyTorch / native):
#   1K keys: 1 token 149 / 70, 4 tokens 228 / 164, 16 tokens 565 / 406 (scoring four rows at a time since, over
#   1,100 keys: 4 / 9 / 16 tokens 68 -> 60, 146 -> 126, 224 -> 188 native, bitwise the same);
#   16K keys: 1 token 2,625 / 1,481, 4 tokens 3,420 / 3,101, 8 tokens 4,202 / 5,362 (PyTorch's flash kernel wins).
# With keys transposed in registers for several tokens: 4K keys, 4 / 8 / 16 tokens 450 / 358, 667 / 553,
# 1,106 / 1,051; 16K keys, 4 / 8 tokens 1,552 / 1,583, 2,184 / 2,851 (PyTorch's split form still wins there).
# Since the values are taken in chunks that every group of rows reads while cached (read from memory once), the
# native kernel wins at every length (ms for 8 layers, PyTorch's split form / native): 4K keys, 4 / 8 / 16 tokens
# 9.7 / 5.4, 12.0 / 8.7, 17.5 / 14.8; 9K keys 19.9 / 12.7, 25.1 / 21.8, 36.3 / 28.1; 16K keys 29.8 / 23.1,
# 37.0 / 33.2, 72.8 / 62.8 (`attend` with each routing forced, one thread).
NATIVE_ROWS = rows_attention.MAX_ROWS  # 48 stacked rows (group size x new tokens): the native kernel, any length


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    block_mask: torch.Tensor | None = None,
    extra_mask: torch.Tensor | None = None,
    native: bool = True,
) -> torch.Tensor:
    """q: (Hq, T, d); k, v: (Hkv, S, d) with the T new tokens as the last T keys.

    block_mask: (T, T) bool, True where query i may see new token j (None: all visible).
    extra_mask: (Hkv or 1, T, S) bool, True = allowed (sliding windows); None: no extra restriction.
    native: the few-row kernel may serve (the compute backend's `serves("attention")`).
    Returns (Hq, T, d).
    """
    if q.device.type == "cuda":
        return _attend_sdpa(q, k, v, scale, block_mask, extra_mask)
    hq, t, d = q.shape
    hkv, s, _ = k.shape
    g = hq // hkv
    qs = q.reshape(hkv, g * t, d)  # (Hkv, g*T, d): query heads of a group stacked as rows
    prefix = s - t
    rows = g * t
    if native and extra_mask is None and rows <= NATIVE_ROWS:
        out = rows_attention.attend_rows(qs, k, v, scale, t, block_mask)
        if out is not None:
            return out.reshape(hq, t, d)
    flash_ready = _cpu_flash is not None and extra_mask is None and q.dtype == k.dtype
    if flash_ready and t >= CAUSAL_FLASH_MIN_TOKENS and _is_causal(block_mask, t):
        return _attend_causal(q, k, v, scale, t, g)
    many_rows = g * t >= SPLIT_MIN_ROWS and prefix >= SPLIT_MIN_PREFIX
    if flash_ready and (many_rows or prefix >= SPLIT_ANY_ROWS_PREFIX):
        out = _attend_split(qs, k, v, scale, t, g, block_mask)
    elif s <= KEY_CHUNK:
        out = _attend_chunk(qs, k, v, scale, 0, s, t, g, block_mask, extra_mask)[0]
    else:
        out = _attend_chunked(qs, k, v, scale, t, g, block_mask, extra_mask)
    return out.reshape(hq, t, d)


def _masked_scores(
    qs: torch.Tensor, k: torch.Tensor, scale: float, c0: int, c1: int, t: int, g: int,
    block_mask: torch.Tensor | None, extra_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Scores of stacked queries against keys [c0, c1): (Hkv, g*T, c1-c0) float32, masked with -inf."""
    hkv, s = k.shape[0], k.shape[1]
    scores = torch.matmul(qs, k[:, c0:c1].transpose(1, 2)).float() * scale
    block_start = s - t
    if block_mask is not None and c1 > block_start:
        lo = max(c0, block_start)
        view = scores.view(hkv, g, t, c1 - c0)[..., lo - c0 :]
        view.masked_fill_(~block_mask[:, lo - block_start : c1 - block_start], float("-inf"))
    if extra_mask is not None:
        view = scores.view(hkv, g, t, c1 - c0)
        view.masked_fill_(~extra_mask[:, None, :, c0:c1], float("-inf"))
    return scores


def _attend_chunk(qs, k, v, scale, c0, c1, t, g, block_mask, extra_mask):
    scores = _masked_scores(qs, k, scale, c0, c1, t, g, block_mask, extra_mask)
    if c0 == 0 and c1 == k.shape[1]:
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs.to(v.dtype), v[:, c0:c1]), None, None
    peak = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # (Hkv, g*T, 1)
    weights = torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    return torch.matmul(weights.to(v.dtype), v[:, c0:c1]).float(), peak, total


def _attend_chunked(qs, k, v, scale, t, g, block_mask, extra_mask):
    s = k.shape[1]
    acc = peak = total = None
    for c0 in range(0, s, KEY_CHUNK):
        c1 = min(s, c0 + KEY_CHUNK)
        out, m, l = _attend_chunk(qs, k, v, scale, c0, c1, t, g, block_mask, extra_mask)
        if acc is None:
            acc, peak, total = out, m, l
            continue
        new_peak = torch.maximum(peak, m)
        a, b = torch.exp(peak - new_peak), torch.exp(m - new_peak)
        acc = acc * a + out * b
        total = total * a + l * b
        peak = new_peak
    return (acc / total).to(v.dtype)


def _attend_split(qs, k, v, scale, t, g, block_mask):
    """Prefix (unmasked, flash kernel) + block (masked, by hand), merged by log-sum-exp: (Hkv, g*T, d)."""
    p = k.shape[1] - t
    prefix_out, prefix_lse = _flash_prefix(qs, k, v, p, scale)
    block_out, block_peak, block_total = _attend_chunk(qs, k, v, scale, p, p + t, t, g, block_mask, None)
    return _merge(prefix_out, prefix_lse, block_out, block_peak, block_total).to(v.dtype)


def _flash_prefix(qs, k, v, p, scale):
    """Stacked rows (Hkv, R, d) over the first p keys, unmasked, by the flash kernel: the float32 output (Hkv, R, d)
    and each row's log-sum-exp (Hkv, R, 1)."""
    out, lse = _cpu_flash(qs[None], k[None, :, :p], v[None, :, :p], scale=scale)[:2]
    return out[0].float(), lse[0, ..., None]


def _merge(prefix_out, prefix_lse, block_out, block_peak, block_total):
    """Attention over the prefix and over the block, merged by log-sum-exp: the block's output weighted by
    block_total * exp(block_peak) (a normalized block: total 1, peak its log-sum-exp)."""
    peak = torch.maximum(prefix_lse, block_peak)  # every row sees its own token: block_peak is finite
    a = torch.exp(prefix_lse - peak)
    b = torch.exp(block_peak - peak)
    return (prefix_out * a + block_out * b) / (a + block_total * b)


def _is_causal(block_mask: torch.Tensor | None, t: int) -> bool:
    """Whether new token i sees exactly new tokens 0..i (a prefill chunk's mask; a tree's only when it is a chain)."""
    if block_mask is None or block_mask.shape != (t, t):
        return False
    return torch.equal(block_mask, _causal_mask(t, block_mask.device))


@functools.lru_cache(maxsize=4)
def _causal_mask(t: int, device: torch.device) -> torch.Tensor:
    """(t, t) bool, True on and below the diagonal: built once per size, not once per layer."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril_()


def _attend_causal(q, k, v, scale, t, g):
    """q: (Hq, T, d), k, v: (Hkv, S, d), the T new tokens last and causally masked -> (Hq, T, d): the block through
    the flash kernel's causal form (K/V repeated per query head: T rows, cheap), the prefix (if any) through its
    plain form on stacked rows as in `_attend_split`, merged by log-sum-exp."""
    hq, _, d = q.shape
    hkv, s, _ = k.shape
    p = s - t
    kb, vb = k[:, p:], v[:, p:]
    if g > 1:
        kb, vb = kb.repeat_interleave(g, dim=0), vb.repeat_interleave(g, dim=0)  # (Hq, T, d)
    block_out, block_lse = _cpu_flash(q[None], kb[None], vb[None], is_causal=True, scale=scale)[:2]
    if p == 0:
        return block_out[0].to(v.dtype)
    block_out, block_lse = block_out[0].float(), block_lse[0, ..., None]  # (Hq, T, d), (Hq, T, 1)
    prefix_out, prefix_lse = _flash_prefix(q.reshape(hkv, g * t, d), k, v, p, scale)
    merged = _merge(prefix_out.reshape(hq, t, d), prefix_lse.reshape(hq, t, 1), block_out, block_lse, 1.0)
    return merged.to(v.dtype)


def _attend_sdpa(q, k, v, scale, block_mask, extra_mask):
    hq, t, d = q.shape
    s = k.shape[1]
    mask = None
    if block_mask is not None or extra_mask is not None:
        mask = torch.ones(1, t, s, dtype=torch.bool, device=q.device)
        if block_mask is not None:
            mask[:, :, s - t :] = block_mask
        if extra_mask is not None:
            mask = mask & extra_mask  # (Hkv or 1, T, S)
            if mask.shape[0] > 1:  # per-KV-head mask: expand to query heads
                mask = mask.repeat_interleave(hq // k.shape[0], dim=0)
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=None if mask is None else mask[None], scale=scale,
        enable_gqa=k.shape[0] != hq,
    )
    return out[0]
