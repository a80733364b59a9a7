"""How many tokens per iteration a product draft tree can accept on a given model, with its heads and with
perfect ("oracle") heads, measured along one AR sample.

With exact acceptance, the target samples each token from its own distribution and a depth is accepted iff
that sample is among the drafted candidates at that depth. So along an AR sample path x (distributed
exactly as TokenSwift's output), an iteration rooted at position t accepts depth d iff x[t + d] ranks below
the tree's width at depth d in its proposer's ranking, for every depth up to d:

- depth 1: the base LM head at t (its ranking is the target's own);
- depth d > 1: extra head d - 2 applied at t (real heads), or the target's own ranking at t + d - 1 given
  the true prefix (oracle heads: the best any drafter could do with that many candidates per depth, since
  no set of k tokens holds more of the target's probability than its top k).

The paper's tree is 1 wide at depth 1, so whatever the heads and n-grams propose below it, an iteration
accepts more than the bonus token only if the target's sample equals the base model's top-1. With
probability p1 of that, tokens per iteration <= 1 + depth * p1.
"""
from __future__ import annotations

import torch

from ..sampling import apply_penalty
from .head_training import last_layer_hidden


@torch.inference_mode()
def ranks_along(model, heads, ids: torch.Tensor, start: int, penalty: float, window: int) -> dict[str, torch.Tensor]:
    """Ranks of the sampled tokens in each proposer's (penalised) ranking.

    ids: (T,) prompt + AR sample; positions t in [start - 1, T - 2] are iteration roots.
    Returns {"base": (R,), "head0": (R,), ...} where entry r is for root t = start - 1 + r: base ranks
    x[t + 1] under the LM head at t; head j ranks x[t + 2 + j] under extra head j at t (-1 past the end).
    """
    h0 = last_layer_hidden(model, ids[None], bf16=False)[0]  # (T, H) last layer output before the final norm
    base = model.lm_head(model.model.norm(h0)).float()  # (T, V)
    head_logits = None
    if heads is not None:  # heads with a root input read x[t + 1], the token the tree at t starts from
        following = torch.cat([ids[1:], ids[-1:]])  # (T,): the last position has no successor; never ranked
        head_logits = model.lm_head(heads(h0, model.get_input_embeddings()(following))).float()  # (heads, T, V)
    total = ids.numel()
    roots = range(start - 1, total - 1)
    out = {"base": torch.full((len(roots),), -1, dtype=torch.long)}
    n_heads = 0 if head_logits is None else head_logits.shape[0]
    for j in range(n_heads):
        out[f"head{j}"] = torch.full((len(roots),), -1, dtype=torch.long)

    def rank(logits: torch.Tensor, root: int, target: int) -> int:
        seen = ids[max(0, root + 1 - window) : root + 1]
        x = apply_penalty(logits, seen, penalty)
        return int((x > x[target]).sum())

    for r, t in enumerate(roots):
        out["base"][r] = rank(base[t], t, int(ids[t + 1]))
        for j in range(n_heads):
            if t + 2 + j < total:
                out[f"head{j}"][r] = rank(head_logits[j, t], t, int(ids[t + 2 + j]))
    return out


def tokens_per_iteration(ranks: dict[str, torch.Tensor], widths: list[int], oracle: bool) -> float:
    """Mean tokens per iteration (bonus included) of the product tree `widths` over every root whose
    whole tree lies inside the sample."""
    depth = len(widths)
    count = ranks["base"].numel() - depth
    if count <= 0:
        raise ValueError("the sample is shorter than the tree")
    total = 0
    for r in range(count):
        for d, width in enumerate(widths):
            if oracle or d == 0:
                rank = int(ranks["base"][r + d])
            elif f"head{d - 1}" in ranks:
                rank = int(ranks[f"head{d - 1}"][r])
            else:  # no head proposes this depth
                break
            if not 0 <= rank < width:
                break
            total += 1
    return 1.0 + total / count
