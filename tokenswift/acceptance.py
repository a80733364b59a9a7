"""Walking the draft tree against the target: which drafted tokens are accepted.

`pick(node)` returns the token the target produces at a node (argmax when greedy, one fresh sample
otherwise), given that node's logits and its own ancestors as context.
"""
from __future__ import annotations

from typing import Callable

from .tree import DraftTree

Pick = Callable[[int], int]


def exact_walk(tree: DraftTree, pick: Pick) -> tuple[list[int], int]:
    """The lossless rule (SpecInfer's naive sampling): one target token per visited node; follow the
    child holding that token, stop where none does. Returns (accepted nodes below the root, bonus token).

    Each produced token is drawn from the target's exact distribution given the true prefix, so the
    output is distributed exactly as autoregressive decoding, and greedy output is identical to it."""
    node, path = 0, []
    while True:
        token = pick(node)
        child = tree.children[node].get(token)
        if child is None:
            return path, token
        path.append(child)
        node = child


def per_row_walk(tree: DraftTree, pick: Pick) -> tuple[list[int], int]:
    """The original code's rule, kept only to show its bias: an independent target sample at every
    position of *every* root-to-leaf row, then the longest matching row wins (first on ties). Shared
    prefixes are re-sampled per row, which favours drafted tokens: this is NOT lossless."""
    best_path: list[int] = []
    best_bonus: int | None = None
    for leaf in tree.leaves():
        node, path, bonus = 0, [], None
        for child in tree.path_to(leaf):
            token = pick(node)
            if token != tree.tokens[child]:
                bonus = token
                break
            path.append(child)
            node = child
        if bonus is None:
            bonus = pick(node)
        if best_bonus is None or len(path) > len(best_path):
            best_path, best_bonus = path, bonus
    return best_path, best_bonus
