"""The one logits-processing chain shared by AR and TokenSwift.

Every function here is pure. A token is chosen from one row of logits given the tokens that precede it
(for the contextual penalty) and one uniform random number (for sampling), so that AR and TokenSwift
consume the random stream in the same order: one uniform per produced token.
"""
from __future__ import annotations

import math

import torch

from .settings import Settings


def apply_penalty(logits: torch.Tensor, window: torch.Tensor, theta: float) -> torch.Tensor:
    """CTRL-style penalty on the tokens in `window`.

    logits: (V,) float32; window: (W,) int64 token ids. Positive logits are divided by theta, negative
    ones multiplied by it. Returns a new tensor.
    """
    if theta == 1.0 or window.numel() == 0:
        return logits
    seen = logits.new_zeros(logits.shape, dtype=torch.bool)
    seen[window] = True
    penalised = torch.where(logits > 0, logits / theta, logits * theta)
    return torch.where(seen, penalised, logits)


def truncation_mask(probs: torch.Tensor, settings: Settings) -> torch.Tensor:
    """Tokens removed by top-k, top-p, min-p and eta (applied to `probs` in that order, each on the
    renormalised survivors of the previous one). probs: (V,) float32. Returns (V,) bool, True = removed.
    At least one token (the most likely) always survives."""
    removed = torch.zeros_like(probs, dtype=torch.bool)
    top = int(torch.argmax(probs))
    if settings.top_k > 0 and settings.top_k < probs.numel():
        kth = torch.topk(probs, settings.top_k).values[-1]
        removed |= probs < kth
    if settings.top_p < 1.0:
        p = _renormalised(probs, removed)
        sorted_p, order = torch.sort(p, descending=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p  # mass strictly before each token
        drop_sorted = before >= settings.top_p
        removed |= torch.zeros_like(removed).scatter(0, order, drop_sorted)
    if settings.min_p > 0.0:
        p = _renormalised(probs, removed)
        removed |= p < settings.min_p * p.max()
    if settings.eta > 0.0:
        p = _renormalised(probs, removed)
        logp = torch.log(p.clamp_min(1e-30))
        entropy = -(p * logp).sum()
        threshold = min(settings.eta, math.sqrt(settings.eta) * float(torch.exp(-entropy)))
        removed |= p < threshold
    removed[top] = False
    return removed


def _renormalised(probs: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    kept = probs.masked_fill(removed, 0.0)
    return kept / kept.sum()


def target_distribution(logits: torch.Tensor, window: torch.Tensor, settings: Settings) -> torch.Tensor:
    """The distribution the target samples from. logits: (V,) any float dtype -> (V,) float32 probs.
    Greedy settings give a one-hot distribution on the argmax."""
    x = apply_penalty(logits.float(), window, settings.penalty)
    if settings.greedy:
        out = torch.zeros_like(x)
        out[int(torch.argmax(x))] = 1.0
        return out
    probs = torch.softmax(x / settings.temperature, dim=-1)
    removed = truncation_mask(probs, settings)
    return _renormalised(probs, removed)


def choose_token(logits: torch.Tensor, window: torch.Tensor, settings: Settings, uniform: float) -> int:
    """Pick the next token: argmax when greedy, else inverse-CDF sampling with `uniform` in [0, 1)."""
    if settings.greedy:
        return int(torch.argmax(apply_penalty(logits.float(), window, settings.penalty)))
    probs = target_distribution(logits, window, settings)
    return sample_from(probs, uniform)


def decide(logits: torch.Tensor, window: torch.Tensor, settings: Settings, uniform: float) -> tuple[int, torch.Tensor]:
    """Like `choose_token`, and also return the distribution it came from (for greedy: the model's
    softmax after the penalty, whose argmax was taken). Same token as `choose_token` in every case."""
    x = apply_penalty(logits.float(), window, settings.penalty)
    if settings.greedy:
        return int(torch.argmax(x)), torch.softmax(x, dim=-1)
    probs = torch.softmax(x / settings.temperature, dim=-1)
    probs = _renormalised(probs, truncation_mask(probs, settings))
    return sample_from(probs, uniform), probs


def sample_from(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF sample from (V,) probabilities; tokens with zero probability are never chosen."""
    cdf = torch.cumsum(probs.double(), 0)
    index = int(torch.searchsorted(cdf, torch.tensor([uniform * float(cdf[-1])], dtype=cdf.dtype), right=True))
    index = min(index, probs.numel() - 1)
    while probs[index] == 0.0 and index > 0:  # rounding pushed us onto a removed token: step back
        index -= 1
    return index


class UniformStream:
    """One uniform number in [0, 1) per produced token, from a seeded generator (CPU, reproducible)."""

    def __init__(self, seed: int) -> None:
        self._gen = torch.Generator().manual_seed(int(seed))

    def next(self) -> float:
        return float(torch.rand((), generator=self._gen, dtype=torch.float64))
