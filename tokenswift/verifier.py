"""The target's verdict on a draft tree: one forward of every node, each visited row's target token, the walk.

The decision (argmax, or a sample with the uniform of the node's depth, after the contextual penalty) and the
walk are the same for every drafter, so the verifier owns both: `exact` (the walk in one native call where the
kernels serve, else `acceptance.exact_walk`) or `per_row` (the original rule, a fresh draw per node, for tests).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from . import events as ev
from .acceptance import exact_walk, per_row_walk
from .backend import Backend
from .native import decide as native_decide
from .run_state import RunState
from .sampling import decide_rows
from .tree import DraftTree, verification_inputs


@dataclass
class Verdict:
    """What verifying a tree found. h: (N, H) hidden states of its rows; queries: per layer (Hq, N, d) when asked;
    path: accepted nodes, root excluded; picks: per node the target's token (visited nodes only); probs: (N, V)
    the visited rows' distributions (tensor or numpy) when events carry detail."""
    h: torch.Tensor
    queries: list[torch.Tensor]
    path: list[int]
    bonus: int
    picks: Any
    probs: Any
    decide_s: float

    @property
    def last_row(self) -> int:
        """The row of the last accepted node (the root's when nothing was accepted)."""
        return self.path[-1] if self.path else 0


class Verifier:
    def __init__(self, state: RunState, acceptance: str, backend: Backend) -> None:
        self.state = state
        self.exact = acceptance == "exact"
        rule = native_decide.rule_of(state.s)  # None where the native chain lacks one of the settings' steps
        self.decide_rule = rule if backend.serves("decide") else None  # None: PyTorch decides
        self.walk_rule = rule if backend.serves("walk") else None  # None: the walk in Python

    def decide(self, logits: torch.Tensor, extras: list[list[int]] | None, depths: list[int],
               want_probs: bool | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Every row's target token at once (argmax, or a sample with the uniform of its depth: the walk
        reaches depth d only after d tokens were produced, so that node's token is the (d+1)-th draw).
        extras: per row its drafted ancestors and itself, for the penalty window (None without a penalty).
        want_probs: also the rows' distributions (default: when events carry per-node detail)."""
        st = self.state
        want_probs = st.detail if want_probs is None else want_probs
        u = None
        if not st.s.greedy:
            if len(depths) == 1:  # one row, the root (an AR-cost step): the next uniform
                u = st.uniforms.peek(1)
            else:
                u = torch.from_numpy(st.uniforms.peek(max(depths) + 1).numpy()[depths])  # numpy's gather: ~10 us less
        fast = None if self.decide_rule is None else native_decide.decide_rows(
            logits, st.seq, len(st.ids), st.s.penalty_window, extras, self.decide_rule, u, want_probs=want_probs)
        if fast is not None:  # the same chain in one native pass (about 20 us instead of 0.2-0.8 ms)
            return fast
        return decide_rows(logits, st.seen(extras), st.s, u, want_probs=want_probs)

    def one_row(self, timings: ev.Timings) -> tuple[torch.Tensor, int]:
        """One token the AR way: forward of the last token, logits, decision (timed as verification), commit
        (bookkeeping). Returns the hidden state (1, H) and the token."""
        st = self.state
        t = time.perf_counter()
        h, _ = st.a.forward(torch.tensor([st.ids[-1]]), torch.tensor([len(st.ids) - 1]), st.full, st.full.length)
        tokens, _ = self.decide(st.a.logits(h), [[]], [0], want_probs=False)  # no event reads a one-row distribution
        if not st.s.greedy:
            st.uniforms.take(1)
        timings.verify_s = time.perf_counter() - t
        t = time.perf_counter()
        st.full.length += 1
        st.commit(tokens)
        timings.bookkeeping_s = time.perf_counter() - t
        return h, tokens[0]

    def verify(self, tree: DraftTree, timings: ev.Timings, capture_queries: bool) -> Verdict:
        """Forward every node of `tree` (rooted at the last committed token) in one pass (timed as verification),
        then decide and walk (its seconds in Verdict.decide_s)."""
        st = self.state
        t = time.perf_counter()
        base = st.full.length  # slot of the root (the last accepted token)
        tokens, positions, mask, table = verification_inputs(tree, base)
        h, queries = st.a.forward(tokens, positions, st.full, base, mask, capture_queries=capture_queries)
        logits = st.a.logits(h)  # (N, V)
        timings.verify_s = time.perf_counter() - t
        t = time.perf_counter()
        path, bonus, picks, probs = self.exact_walk(tree, logits, table) if self.exact else \
            self.per_row_walk(tree, logits)
        return Verdict(h, queries, path, bonus, picks, probs, time.perf_counter() - t)

    def exact_walk(self, tree: DraftTree, logits: torch.Tensor, table: Any) -> tuple[list[int], int, Any, Any]:
        st = self.state
        walked = None
        if self.walk_rule is not None and logits.device.type == "cpu":  # the walk in one native call, visited rows only
            walked = native_decide.walk_tree(logits, st.seq_ptr, len(st.ids), st.s.penalty_window, table,
                                             self.walk_rule,
                                             0 if st.s.greedy else st.uniforms.address(max(tree.depths) + 1),
                                             st.detail)
        if walked is not None:
            path, bonus, picks, probs = walked
        else:
            extras = tree.ancestor_tokens() if st.s.penalty != 1.0 else None  # only a penalty window reads them
            picks, probs = self.decide(logits, extras, tree.depths)
            path, bonus = exact_walk(tree, picks.__getitem__)
        if not st.s.greedy:
            st.uniforms.take(len(path) + 1)
        return path, bonus, picks, probs

    def per_row_walk(self, tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int, Any, Any]:
        """The original per-row rule (for the tests only): a fresh draw every time a node is asked."""
        st = self.state
        extras = tree.ancestor_tokens()

        def pick(node: int) -> int:
            u = None if st.s.greedy else torch.tensor([st.uniforms.next()], dtype=torch.float64)
            return decide_rows(logits[node : node + 1], st.seen([extras[node]]), st.s, u, want_probs=False)[0][0]

        path, bonus = per_row_walk(tree, pick)
        return path, bonus, [], None

    def probe_rows(self, q: int) -> None:
        """One verification of q rows (a chain of the last token) in the scratch slots past the cache, for timing."""
        st = self.state
        base = st.full.length
        tokens = torch.full((q,), st.ids[-1], dtype=torch.long)
        mask = torch.ones(q, q, dtype=torch.bool).tril_()
        h, _ = st.a.forward(tokens, base + torch.arange(q), st.full, base, mask)
        self.decide(st.a.logits(h), [[st.ids[-1]] * d for d in range(q)], list(range(q)))

    def commit(self, tree: DraftTree, verdict: Verdict) -> list[int]:
        """Keep the accepted nodes' cache rows in order after the root's, commit their tokens and the bonus."""
        st = self.state
        base = st.full.length
        st.full.compact([base + node for node in verdict.path], base + 1)
        st.full.length = base + len(verdict.path) + 1
        new_tokens = [tree.tokens[node] for node in verdict.path] + [verdict.bonus]
        st.commit(new_tokens)
        return new_tokens
