"""One generation as the paper's phases: propose -> verify -> commit -> observe, one Step event per iteration.

The mode is an object (a drafter, tokenswift/drafters.py and tokenswift/auto.py), the decision and the walk belong to
the verifier (tokenswift/verifier.py), and the state all phases share to the run (tokenswift/run_state.py).
"""
from __future__ import annotations

import threading
import time
from typing import Iterator, Union

import torch

from . import events as ev
from .auto import AutoDrafter
from .drafters import ArDrafter, DraftingModel, FixedTreeDrafter
from .kinds import Method, Source
from .run_state import RunState
from .settings import Settings
from .tree import AUTO, DraftTree
from .verifier import Verdict, Verifier

Drafter = Union[ArDrafter, FixedTreeDrafter, AutoDrafter]


def make_drafter(gen: DraftingModel, settings: Settings, method: str) -> Drafter:
    if method == Method.AR:
        return ArDrafter(settings)
    if settings.tree == AUTO:
        return AutoDrafter(gen, settings)
    return FixedTreeDrafter(gen, settings)


class DecodeLoop:
    """A generation's loop: its drafter, its verifier and the state they share."""

    def __init__(self, gen: DraftingModel, ids: list[int], settings: Settings, max_new: int, method: str, seed: int,
                 eos: int | None, detail: bool = True) -> None:
        self.drafter = make_drafter(gen, settings, method)
        capacity = len(ids) + max_new + self.drafter.max_nodes + 1
        self.state = RunState(gen.adapter, ids, settings, capacity, seed, eos, detail)
        self.verifier = Verifier(self.state, settings.acceptance, gen.adapter.backend)
        self.method, self.max_new = method, max_new

    def steps(self, stop: threading.Event | None) -> Iterator[ev.Step]:
        st, drafter = self.state, self.drafter
        t0 = time.perf_counter()
        queries = st.prefill(stop, capture_queries=drafter.wants_queries)
        if queries is None:
            return
        drafter.start(st, self.verifier, queries)
        st.sync()
        prefill_s = time.perf_counter() - t0
        generated, elapsed, index = 0, 0.0, 0
        while generated < self.max_new:
            if stop is not None and stop.is_set():
                return
            timings = ev.Timings()
            tokens, tree, nodes, note = self.iterate(timings)
            t_book = time.perf_counter()
            produced = len(tokens)
            tokens = tokens[: self.max_new - generated]  # the last iteration keeps only what max_new allows
            done = False
            if st.s.stop_at_eos and st.eos is not None:
                for i, tok in enumerate(tokens):
                    if tok.token == st.eos:
                        tokens, done = tokens[: i + 1], True
                        break
            if len(tokens) < produced:  # drafted nodes past the cut are not part of the output (nor is the bonus)
                for node in tree:
                    if node.depth > len(tokens):
                        node.accepted = False
            generated += len(tokens)
            done = done or generated >= self.max_new
            cache = st.cache_state(drafter.partial_mode, drafter.partial, with_positions=index == 0)
            timings.bookkeeping_s += time.perf_counter() - t_book
            elapsed += timings.total_s
            yield ev.Step(index, self.method, tokens, cache, timings, generated, elapsed, prefill_s, tree, done,
                          nodes, note)
            index += 1
            st.iteration = index
            if done:
                return

    def iterate(self, timings: ev.Timings) -> tuple[list[ev.AcceptedToken], list[ev.TreeNode], int, str]:
        """One iteration: the accepted tokens, the tree's nodes for the event, the drafted node count, the plan."""
        st, drafter = self.state, self.drafter
        t = time.perf_counter()
        proposal = drafter.propose(st)  # propose
        if proposal.plain:  # nothing to verify: one AR-cost step
            draft_s = time.perf_counter() - t if drafter.drafts else 0.0  # AR proposes nothing: no drafting time
            root = st.ids[-1]
            h, token = self.verifier.one_row(timings)  # verify and commit one row
            timings.draft_s = draft_s
            drafter.observe_plain(st, proposal, h, timings)
            tokens, nodes = drafter.plain_events(root, token, st.detail)
            return tokens, nodes, 0, proposal.note
        st.sync()
        timings.draft_s = time.perf_counter() - t
        tree = proposal.tree
        base = st.full.length
        verdict = self.verifier.verify(tree, timings, capture_queries=drafter.partial is not None)  # verify
        t = time.perf_counter()
        self.verifier.commit(tree, verdict)  # commit
        drafter.observe(st, proposal, verdict, base)  # observe
        accepted = accepted_tokens(tree, verdict)
        nodes = tree_events(tree, verdict) if st.detail else []
        timings.bookkeeping_s = verdict.decide_s + time.perf_counter() - t
        drafter.observe_cost(proposal, verdict, timings)
        return accepted, nodes, len(tree) - 1, proposal.note


def accepted_tokens(tree: DraftTree, verdict: Verdict) -> list[ev.AcceptedToken]:
    """The accepted drafted tokens by source (suffix and datastore drafts count as n-gram reuse), then the bonus."""
    out = [ev.AcceptedToken(tree.tokens[n], Source.NGRAM if tree.sources[n] == Source.NGRAM else Source.HEAD,
                            tree.depths[n]) for n in verdict.path]
    out.append(ev.AcceptedToken(verdict.bonus, Source.BONUS, len(verdict.path) + 1))
    return out


def tree_events(tree: DraftTree, verdict: Verdict) -> list[ev.TreeNode]:
    """Every node of the verified tree: accepted or not, and where its parent was visited, the target's probability
    of it there and the token the target drew at the node itself (visited nodes only)."""
    path, picks, probs = verdict.path, verdict.picks, verdict.probs
    visited = set(path) | {0}
    if isinstance(probs, torch.Tensor):  # indexing numpy costs far less than a tensor
        probs = probs.float().cpu().numpy()
    has_picks = len(picks) > 0
    nodes = []
    for i in range(len(tree)):
        parent = tree.parents[i]
        target_prob = float(probs[parent, tree.tokens[i]]) if probs is not None and parent in visited else None
        sample = int(picks[i]) if has_picks and i in visited else None
        nodes.append(ev.TreeNode(tree.tokens[i], parent, tree.depths[i], tree.sources[i], tree.draft_probs[i],
                                 i in visited, target_prob, sample))
    return nodes
