"""The one logits-processing chain shared by AR and TokenSwift, over rows of logits at once.

Every function here is pure. A token is chosen from one row of logits given the tokens that precede it
(for the contextual penalty) and one uniform random number (for sampling), so that AR and TokenSwift
consume the random stream in the same order: one uniform per produced token. The chain works on N rows
at once (a draft tree's nodes: one batched op for all of them); AR calls it with one row, so both
methods run literally the same code per row.
"""
from __future__ import annotations

import math

import torch

from .settings import Settings


# ---- the contextual penalty ------------------------------------------------------------------------
def penalize_rows(logits: torch.Tensor, seen: torch.Tensor | None, theta: float) -> torch.Tensor:
    """CTRL-style penalty. logits: (N, V) float32; seen: (N, V) bool, True for tokens in that row's
    window (None: no penalty). Positive logits are divided by theta, negative ones multiplied by it."""
    if theta == 1.0 or seen is None:
        return logits
    penalised = torch.where(logits > 0, logits / theta, logits * theta)
    return torch.where(seen, penalised, logits)


def seen_rows(history: torch.Tensor, n: int, window: int, extras: list[list[int]], vocab: int) -> torch.Tensor:
    """(N, V) bool: for each row, the tokens in the last `window` tokens of history[:n] followed by that
    row's `extras` (its drafted ancestors, the node itself included), exactly as AR would see them once
    those tokens were committed: a row with a extra tokens sees (history[:n] + extras)[-window:]."""
    base_start = max(0, n - window)
    counts = torch.bincount(history[base_start:n], minlength=vocab)[None].repeat(len(extras), 1)  # (N, V)
    rows, cols, vals = [], [], []
    for r, extra in enumerate(extras):
        a = len(extra)
        drop_end = min(n, max(0, n + a - window))
        for tok in history[base_start:drop_end].tolist() if drop_end > base_start else ():
            rows.append(r), cols.append(tok), vals.append(-1)
        for tok in extra[max(0, a - window) :]:
            rows.append(r), cols.append(tok), vals.append(1)
    if rows:
        counts.index_put_((torch.tensor(rows), torch.tensor(cols)), torch.tensor(vals, dtype=counts.dtype),
                          accumulate=True)
    return counts > 0


# ---- truncation -------------------------------------------------------------------------------------
def _renormalised(probs: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    kept = probs.masked_fill(removed, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def truncation_mask_rows(probs: torch.Tensor, settings: Settings) -> torch.Tensor:
    """Tokens removed by top-k, top-p, min-p and eta (applied in that order, each on the renormalised
    survivors of the previous one). probs: (N, V) float32 -> (N, V) bool, True = removed. The most likely
    token of each row always survives."""
    removed = torch.zeros_like(probs, dtype=torch.bool)
    top = probs.argmax(dim=-1, keepdim=True)  # (N, 1)
    fresh = True  # nothing removed yet: the survivors are `probs` itself (no renormalisation needed)

    def survivors() -> torch.Tensor:
        return probs if fresh else _renormalised(probs, removed)

    if settings.top_k > 0 and settings.top_k < probs.shape[-1]:
        kth = torch.topk(probs, settings.top_k, dim=-1).values[:, -1:]
        removed |= probs < kth
        fresh = False
    if settings.top_p < 1.0:
        p = survivors()
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly before each token
        removed |= torch.zeros_like(removed).scatter(-1, order, before >= settings.top_p)
        fresh = False
    if settings.min_p > 0.0:
        p = survivors()
        removed |= p < settings.min_p * p.amax(dim=-1, keepdim=True)
        fresh = False
    if settings.eta > 0.0:
        p = survivors()
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1, keepdim=True)
        threshold = torch.clamp(math.sqrt(settings.eta) * torch.exp(-entropy), max=settings.eta)
        removed |= p < threshold
    removed.scatter_(-1, top, False)
    return removed


# ---- the decision -------------------------------------------------------------------------------------
def decide_rows(logits: torch.Tensor, seen: torch.Tensor | None, settings: Settings,
                uniforms: torch.Tensor | None, want_probs: bool = True) -> tuple[list[int], torch.Tensor | None]:
    """Choose one token per row: argmax when greedy, else inverse-CDF sampling with that row's uniform.

    logits: (N, V); seen: (N, V) bool or None; uniforms: (N,) float64 in [0, 1) (ignored when greedy).
    Returns the tokens and the (N, V) distributions they came from (greedy: the softmax after the
    penalty, whose argmax was taken; None when greedy and not `want_probs`)."""
    x = penalize_rows(logits.float(), seen, settings.penalty)
    if settings.greedy:
        return x.argmax(dim=-1).tolist(), torch.softmax(x, dim=-1) if want_probs else None
    probs = torch.softmax(x / settings.temperature, dim=-1)
    probs = _renormalised(probs, truncation_mask_rows(probs, settings))
    return sample_rows(probs, uniforms), probs


def sample_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> list[int]:
    """Inverse-CDF sample per row of (N, V) probabilities with (N,) uniforms; zero-probability tokens are
    never chosen (when rounding lands on one, the nearest kept token before it is taken)."""
    cdf = torch.cumsum(probs.double(), dim=-1)  # (N, V)
    target = (uniforms.double() * cdf[:, -1])[:, None]
    index = torch.searchsorted(cdf, target, right=True).clamp_max_(probs.shape[-1] - 1)  # (N, 1)
    if bool((probs.gather(-1, index) > 0).all()):
        return index[:, 0].tolist()
    positions = torch.arange(probs.shape[-1]).expand_as(probs)
    last_kept = torch.where(probs > 0, positions, -1).cummax(dim=-1).values  # (N, V)
    return last_kept.gather(-1, index).clamp_min_(0)[:, 0].tolist()


# ---- single-row forms (the tests and the per-row rule use these) -----------------------------------
def apply_penalty(logits: torch.Tensor, window: torch.Tensor, theta: float) -> torch.Tensor:
    """(V,) logits with the penalty on the tokens in `window` ((W,) int64 ids). Returns a new tensor."""
    if theta == 1.0 or window.numel() == 0:
        return logits
    seen = logits.new_zeros(logits.shape, dtype=torch.bool)
    seen[window] = True
    return penalize_rows(logits[None], seen[None], theta)[0]


def truncation_mask(probs: torch.Tensor, settings: Settings) -> torch.Tensor:
    """(V,) form of `truncation_mask_rows`."""
    return truncation_mask_rows(probs[None], settings)[0]


def target_distribution(logits: torch.Tensor, window: torch.Tensor, settings: Settings) -> torch.Tensor:
    """The distribution the target samples from. logits: (V,) -> (V,) float32 probs; greedy settings give
    a one-hot distribution on the argmax."""
    x = apply_penalty(logits.float(), window, settings.penalty)
    if settings.greedy:
        out = torch.zeros_like(x)
        out[int(torch.argmax(x))] = 1.0
        return out
    probs = torch.softmax(x / settings.temperature, dim=-1)
    return _renormalised(probs[None], truncation_mask(probs, settings)[None])[0]


def _seen_of(logits: torch.Tensor, window: torch.Tensor, settings: Settings) -> torch.Tensor | None:
    if settings.penalty == 1.0 or window.numel() == 0:
        return None
    seen = torch.zeros(1, logits.shape[-1], dtype=torch.bool)
    seen[0, window] = True
    return seen


def decide(logits: torch.Tensor, window: torch.Tensor, settings: Settings, uniform: float) -> tuple[int, torch.Tensor]:
    """One row of `decide_rows`: (V,) logits and their window -> (token, (V,) distribution)."""
    tokens, probs = decide_rows(logits[None], _seen_of(logits, window, settings), settings,
                                torch.tensor([uniform], dtype=torch.float64))
    return tokens[0], probs[0]


def sample_from(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF sample from (V,) probabilities; tokens with zero probability are never chosen."""
    return sample_rows(probs[None], torch.tensor([uniform], dtype=torch.float64))[0]


class UniformStream:
    """One uniform number in [0, 1) per produced token, from a seeded generator (CPU, reproducible).

    Numbers are drawn in blocks; `peek(k)` shows the next k without consuming them (a tree walk needs one
    per possible depth but consumes only one per produced token)."""

    BLOCK = 256

    def __init__(self, seed: int) -> None:
        self._gen = torch.Generator().manual_seed(int(seed))
        self._buffer = torch.empty(0, dtype=torch.float64)
        self._next = 0
        self._address = self._buffer.data_ptr()

    def _ensure(self, k: int) -> None:
        if self._next + k > self._buffer.numel():
            rest = self._buffer[self._next :]
            more = torch.rand(max(self.BLOCK, k), generator=self._gen, dtype=torch.float64)
            self._buffer, self._next = torch.cat([rest, more]), 0
            self._address = self._buffer.data_ptr()

    def peek(self, k: int) -> torch.Tensor:
        self._ensure(k)
        return self._buffer[self._next : self._next + k]

    def address(self, k: int) -> int:
        """The memory address of the next k uniforms (float64, contiguous), as `peek(k)` would show them; valid
        until the next `take` or `address`/`peek` call that refills the block."""
        self._ensure(k)
        return self._address + 8 * self._next

    def take(self, k: int) -> None:
        self._ensure(k)
        self._next += k

    def next(self) -> float:
        value = float(self.peek(1)[0])
        self.take(1)
        return value
