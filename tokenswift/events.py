"""Step events: everything the engine tells the outside world, one event per iteration.

The app and the benchmarks are built only on these. They hold plain Python values (no tensors), so they
can be queued across threads, stored and exported as JSON.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .kinds import Source


@dataclass
class AcceptedToken:
    token: int
    source: Source  # HEAD, NGRAM, BONUS or AR
    depth: int = 0  # tree depth for drafted tokens (1 = first after the root)


@dataclass
class TreeNode:
    token: int
    parent: int  # -1 for the root
    depth: int
    source: Source  # ROOT, HEAD or NGRAM
    draft_prob: float  # probability its proposer gave it (n-grams: share of the n-gram counts)
    accepted: bool = False
    target_prob: float | None = None  # probability under the target at its parent, when the parent was visited
    target_sample: int | None = None  # the token the target drew at this node, when visited


@dataclass
class CacheState:
    length: int  # committed positions in the full cache
    capacity: int
    bytes: int
    partial_mode: str  # "full", "once", "dynamic" or "none" (AR)
    partial_budget: int = 0
    partial_sink: int = 0
    partial_selected: int = 0
    partial_recent: int = 0
    refreshed: bool = False
    refreshes: int = 0
    held_positions: list[tuple[int, int]] | None = None  # [start, end) runs held by one head (on refresh or on request)


@dataclass
class Timings:
    draft_s: float = 0.0
    verify_s: float = 0.0
    bookkeeping_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.bookkeeping_s


@dataclass
class Step:
    index: int  # iteration number, from 0
    method: str  # a Method
    tokens: list[AcceptedToken]
    cache: CacheState
    timings: Timings
    generated: int  # new tokens so far, this step included
    elapsed_s: float  # compute time since the first iteration (prefill excluded)
    prefill_s: float = 0.0
    tree: list[TreeNode] = field(default_factory=list)
    done: bool = False
    draft_nodes: int = 0  # drafted nodes verified this iteration (the tree's size without its root)
    plan: str = ""  # tree="auto": the chosen tree and why ("7 nodes: expected 2.40 tokens for 1.30 steps")

    @property
    def accepted_length(self) -> int:
        return len(self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return [t.token for t in self.tokens]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted_length"] = self.accepted_length
        return out


def position_runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted positions -> [start, end) runs; compact for a sink + scattered + tail layout."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs
