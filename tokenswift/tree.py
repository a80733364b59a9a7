"""Draft trees as data: declarative specs, the candidate trie, and its attention mask.

A tree spec is a list of *rank paths*: (0, 2, 1) means "the base model's top-1 candidate at depth 1, the
first head's 3rd candidate at depth 2, the second head's 2nd candidate at depth 3". A product spec
"1x3x3x3" expands to every path over those ranks (1 + 3 + 9 + 27 = 40 drafted nodes in the paper).

The draft trie has node 0 as the root (the last accepted token, whose K/V is not yet cached); every other
node is a drafted token. Equal prefixes share one node, whatever proposed them.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np
import torch

from .kinds import Source

TREE_PRESETS: dict[str, str] = {
    "paper": "1x3x3x3",  # the official default: 40 drafted nodes
    "wide": "2x3x2x2",
    "medium": "1x2x2x2",  # 15 nodes
    "small": "1x2x2",  # 7 nodes
    "chain": "1x1x1x1",  # 4 nodes, one guess per head
    "base-only": "1",  # only the base model's top-1 (no heads needed)
    "none": "",  # no model drafts: n-gram reuse only
}

AUTO = "auto"  # cost-aware drafting (tokenswift.auto): no fixed spec

# Bounds on a product spec, checked on the widths before any path is built. The paper's tree has 40 nodes
# and the widest preset 44; 256 leaves room to experiment while the tree's mask and verification rows stay
# small (a spec such as "64x64x64x64x64" would otherwise expand to about a billion paths).
MAX_TREE_WIDTH = 64  # candidates per level
MAX_TREE_DEPTH = 16  # levels
MAX_TREE_NODES = 256  # drafted nodes (the root excluded)
_SPEC = re.compile(r"\s*[0-9]{1,3}\s*(?:x\s*[0-9]{1,3}\s*)*", re.ASCII)
_SPEC_MAX_CHARS = 200  # longer than any spec within the bounds (16 levels of "64x" and spaces)


def spec_widths(spec: str) -> list[int]:
    """A preset name, "auto" or a product spec -> its widths per level ([] for "auto" and "none"), checked
    against the bounds above from the widths alone. Raises ValueError with one sentence saying what is
    allowed."""
    allowed = f"'auto', a preset ({', '.join(TREE_PRESETS)}) or widths like '1x3x3x3'"
    if not isinstance(spec, str):
        raise ValueError(f"tree must be {allowed}; got a value of type {type(spec).__name__}.")
    if len(spec) > _SPEC_MAX_CHARS:
        raise ValueError(f"tree must be {allowed}; got a text of {len(spec):,} characters.")
    text = spec.strip()
    if text == AUTO:
        return []
    text = TREE_PRESETS.get(text, text).lower()
    if text == "":
        return []
    if not _SPEC.fullmatch(text):
        raise ValueError(f"tree must be {allowed}; got {spec!r}.")
    widths = [int(part) for part in text.split("x")]
    if len(widths) > MAX_TREE_DEPTH:
        raise ValueError(f"tree must have at most {MAX_TREE_DEPTH} levels; got {len(widths)} in {spec!r}.")
    if not all(1 <= w <= MAX_TREE_WIDTH for w in widths):
        raise ValueError(f"tree widths must each be from 1 to {MAX_TREE_WIDTH}; got {spec!r}.")
    nodes = product_nodes(widths)
    if nodes > MAX_TREE_NODES:
        raise ValueError(f"tree {spec!r} has {nodes:,} nodes; at most {MAX_TREE_NODES} are allowed "
                         f"(the paper's 1x3x3x3 has 40).")
    return widths


def product_nodes(widths: list[int]) -> int:
    """Drafted nodes of a product spec: w1 + w1*w2 + ... (arithmetic only, nothing expanded)."""
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


def parse_tree(spec: str) -> list[tuple[int, ...]]:
    """A preset name or a product spec ("1x3x3x3") -> sorted list of rank paths (no root). "auto" has no
    fixed paths: []. The spec is checked against the bounds before it is expanded."""
    widths = spec_widths(spec)
    paths: list[tuple[int, ...]] = []
    for depth in range(1, len(widths) + 1):
        paths.extend(itertools.product(*(range(w) for w in widths[:depth])))
    return paths


def tree_widths(paths: list[tuple[int, ...]]) -> list[int]:
    """How many candidates each depth needs (max rank + 1); depth 1 comes from the base LM head."""
    depth = max((len(p) for p in paths), default=0)
    return [1 + max(p[d] for p in paths if len(p) > d) for d in range(depth)]


@dataclass
class DraftTree:
    """A trie of drafted tokens. Node 0 is the root (last accepted token)."""

    tokens: list[int]
    parents: list[int]  # -1 for the root
    depths: list[int]
    sources: list[str]
    draft_probs: list[float]  # probability the proposer gave this token (1.0 for the root, count share for n-grams)
    children: list[dict[int, int]] = field(default_factory=list)  # token -> child node

    @classmethod
    def with_root(cls, token: int) -> "DraftTree":
        return cls([token], [-1], [0], [Source.ROOT], [1.0], [{}])

    def __len__(self) -> int:
        return len(self.tokens)

    def add_path(self, tokens: list[int], source: str, probs: list[float] | None = None, max_nodes: int = 10**9) -> list[int]:
        """Insert a path below the root, sharing existing prefixes; returns its nodes (fewer when the tree
        is full)."""
        node, nodes = 0, []
        for i, token in enumerate(tokens):
            child = self.children[node].get(token)
            if child is None:
                if len(self.tokens) >= max_nodes:
                    return nodes
                child = self.add_node(node, token, source, probs[i] if probs is not None else 0.0)
            node = child
            nodes.append(node)
        return nodes

    def add_node(self, parent: int, token: int, source: str, prob: float) -> int:
        """Append one child of `parent` (which must not already have a child with this token)."""
        child = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.sources.append(source)
        self.draft_probs.append(prob)
        self.children.append({})
        self.children[parent][token] = child
        return child

    def ancestor_tokens(self) -> list[list[int]]:
        """Per node, the drafted tokens from the root's child down to the node itself (root: [])."""
        out: list[list[int]] = [[]]
        for i in range(1, len(self.tokens)):
            out.append(out[self.parents[i]] + [self.tokens[i]])
        return out

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node` (the root itself excluded)."""
        out: list[int] = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def leaves(self) -> list[int]:
        return [i for i in range(len(self)) if not self.children[i]]


def build_head_paths(
    candidates: list[list[int]], candidate_probs: list[list[float]], paths: list[tuple[int, ...]]
) -> list[tuple[list[int], list[float]]]:
    """Rank paths -> token paths. candidates[d] are the ranked tokens proposed for depth d + 1."""
    out = []
    for path in paths:
        if len(path) > len(candidates):
            continue
        if any(rank >= len(candidates[d]) for d, rank in enumerate(path)):
            continue
        tokens = [candidates[d][rank] for d, rank in enumerate(path)]
        probs = [candidate_probs[d][rank] for d, rank in enumerate(path)]
        out.append((tokens, probs))
    return out


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: entry [i, j] is True when node j is node i or one of its ancestors."""
    n = len(parents)
    mask = np.zeros((n, n), dtype=np.bool_)
    for i, parent in enumerate(parents):  # parents always precede their children: a row is its parent's plus itself
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return torch.from_numpy(mask)  # numpy rows, then no copy: a few microseconds where a nested list took ~15


def verification_inputs(tree: "DraftTree", base: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, np.ndarray]:
    """A tree's verification pass inputs: token ids (N,), positions base + depth (N,) and the ancestor mask (None
    for the root alone), from one numpy array (each small tensor made from a list costs ~5-20 us here, and several
    times that right after a forward has streamed the weights through the caches); and that (3, N) int64 array:
    tokens, parents, positions (its first two rows are what `native.decide.walk_tree` reads)."""
    table = np.array([tree.tokens, tree.parents, tree.depths], dtype=np.int64)  # (3, N)
    table[2] += base
    view = torch.from_numpy(table)
    mask = ancestor_mask(tree.parents) if len(tree.tokens) > 1 else None
    return view[0], view[2], mask, table
