"""Drafters: what proposes the tree each iteration verifies, and what each learns from the verdict.

Every drafter answers the same questions for the decode loop (tokenswift/decode_loop.py): how many rows a
verification may hold, whether the prefill must capture queries, what to propose now (`propose`), and what to
keep from a verdict (`observe`). Three exist:
* `ArDrafter`: proposes nothing; every iteration is one AR step (the baseline).
* `FixedTreeDrafter`: the paper's fixed tree spec (`Settings.tree`), its heads either after a draft forward over
  the dynamic partial KV cache (`draft="paper"`) or on the verification's hidden state (`draft="fused"`), with
  the paper's n-gram reuse.
* `AutoDrafter` (tokenswift/auto.py): the cost-aware planner of `tree="auto"`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from . import events as ev
from .adapter import ModelAdapter
from .datastore import Datastore
from .heads import Heads
from .kinds import PartialMode, Source
from .ngram import NGramTable
from .partial_cache import PartialKVCache
from .run_state import RunState
from .sampling import penalize_rows
from .settings import Settings
from .suffix import SuffixIndex
from .tree import DraftTree, build_head_paths, parse_tree, tree_widths
from .validate import NGRAM_NODES
from .verifier import Verdict, Verifier

NGRAM_SIZE = NGRAM_NODES  # reused n-grams are 4-grams; the validator bounds the nodes they add


class DraftingModel(Protocol):
    """What drafters read from the generator (tokenswift.generator.Generator)."""
    adapter: ModelAdapter
    heads: Heads | None
    datastore: Datastore | None

    def heads_input(self, hidden: torch.Tensor, root: int | None) -> torch.Tensor: ...

    def run_heads(self, hidden: torch.Tensor, levels: int, draft_vocab: bool = False) -> torch.Tensor: ...

    def head_drafts(self, hidden: torch.Tensor, levels: int, k: int, root: int | None = None
                    ) -> tuple[list[list[int]], list[list[float]]]: ...


@dataclass
class Proposal:
    """A drafter's tree for this iteration. plain: verify nothing, take one AR-cost step; note: why (the plan);
    keys: per node the acceptance-statistics kinds it was proposed as (auto); expected: the tokens the plan expects
    to be accepted; probe_s: seconds spent this iteration measuring the machine (not drafting's usual cost)."""
    tree: DraftTree
    plain: bool = False
    note: str = ""
    keys: list[list] = field(default_factory=list)
    expected: float = 0.0
    probe_s: float = 0.0


class FusedInput:
    """The verification pass's hidden state at the last accepted node: the heads' input when drafting is fused.
    Sliced only when the heads read it (a tensor op right after a forward costs about 0.03-0.1 ms)."""

    def __init__(self, move_to: torch.device | None) -> None:
        self._pass: tuple[torch.Tensor, int] | None = None
        self._row: torch.Tensor | None = None
        self._move_to = move_to  # the heads' device, when it is not the last layer's

    def keep(self, h: torch.Tensor, row: int) -> None:
        """h (T, H): a verification's hidden states; row: the last accepted node's."""
        self._pass, self._row = (h, row), None

    @property
    def hidden(self) -> torch.Tensor | None:
        """(1, H) on the heads' device, None before the first verification."""
        if self._row is None and self._pass is not None:
            h, row = self._pass
            self._row = h[row : row + 1] if self._move_to is None else h[row : row + 1].to(self._move_to)
        return self._row


def fused_input(gen: DraftingModel) -> FusedInput:
    a = gen.adapter
    return FusedInput(a.head_device if a.layer_devices[-1] != a.head_device else None)


class ReuseIndex:
    """The committed tokens indexed for reuse: a 4-gram table and a suffix index (either may be off). Brought up to
    date where drafts are looked up, not at every commit (a batch indexes exactly as the same tokens one at a time)."""

    def __init__(self, ngrams: bool, suffix: bool) -> None:
        self.ngrams = NGramTable(NGRAM_SIZE) if ngrams else None
        self.suffix = SuffixIndex() if suffix else None
        self.indexed = 0  # tokens the tables have seen

    def update(self, ids: list[int]) -> None:
        if self.ngrams is None and self.suffix is None:
            return
        new = ids[self.indexed :]
        if not new:
            return
        if self.ngrams is not None:
            self.ngrams.extend(new)
        if self.suffix is not None:
            self.suffix.extend(new)
        self.indexed = len(ids)


class ArDrafter:
    """Plain autoregressive decoding: nothing proposed, one token per iteration from the target."""
    drafts = False
    wants_queries = False
    partial: PartialKVCache | None = None
    partial_mode = PartialMode.NONE

    def __init__(self, settings: Settings) -> None:
        self.max_nodes = 1 + settings.ngram_topk * NGRAM_SIZE  # rows a verification could hold (the cache's slack)

    def start(self, state: RunState, verifier: Verifier, queries: list[torch.Tensor]) -> None:
        pass

    def propose(self, state: RunState) -> Proposal:
        return Proposal(DraftTree.with_root(state.ids[-1]), plain=True)

    def plain_events(self, root: int, token: int, detail: bool) -> tuple[list[ev.AcceptedToken], list[ev.TreeNode]]:
        return [ev.AcceptedToken(token, Source.AR)], []

    def observe_plain(self, state: RunState, proposal: Proposal, h: torch.Tensor, timings: ev.Timings) -> None:
        pass


class FixedTreeDrafter:
    """The paper's drafting: a fixed tree spec of head candidates plus n-gram continuations of its depth-1 tokens."""
    drafts = True

    def __init__(self, gen: DraftingModel, settings: Settings) -> None:
        self.gen, self.s = gen, settings
        heads = gen.heads
        self.fused = heads is not None and settings.draft == "fused"
        paths = parse_tree(settings.tree)
        if heads is None:
            paths = []  # no heads: n-gram drafts only
        else:  # paper: base LM head + each extra head; fused: the extra heads only
            levels = heads.num_heads if self.fused else 1 + heads.num_heads
            paths = [p for p in paths if len(p) <= levels]
        self.paths, self.widths = paths, tree_widths(paths)
        self.reuse = ReuseIndex(ngrams=settings.ngram_reuse and settings.ngram_topk > 0, suffix=False)
        self.max_nodes = 1 + len(paths) + ((self.widths[0] if self.widths else 0) + 1) * settings.ngram_topk * NGRAM_SIZE
        self.wants_queries = bool(paths) and settings.kv_mode != "full" and not self.fused
        self.partial_mode = PartialMode.NONE if not paths else PartialMode.FUSED if self.fused else \
            PartialMode(settings.kv_mode)
        self.partial: PartialKVCache | None = None
        self.input = fused_input(gen)

    def start(self, state: RunState, verifier: Verifier, queries: list[torch.Tensor]) -> None:
        self.reuse.update(state.ids)
        if self.wants_queries:
            s = self.s
            self.partial = PartialKVCache(state.full, s.kv_budget, s.kv_sink, s.recent_capacity, s.kv_mode,
                                          state.a.num_layers // 2)
            self.partial.refresh(state.full, queries)

    def propose(self, state: RunState) -> Proposal:
        """Head candidates (see `head_logits`) and n-gram reuse, merged into one trie."""
        last = state.ids[-1]
        tree = DraftTree.with_root(last)
        firsts: list[int] = []
        self.reuse.update(state.ids)
        if self.paths:
            cands, cprobs = self.head_candidates(state)
            for tokens, p in build_head_paths(cands, cprobs, self.paths):
                tree.add_path(tokens, Source.HEAD, p)
            firsts = cands[0]
        ngrams = self.reuse.ngrams
        if ngrams is not None:
            # n-grams starting with each depth-1 candidate (the paper), and, when the model proposes no
            # depth-1 token of its own (no heads, or fused drafting), n-grams starting with the root.
            starts = [(first, [first]) for first in firsts]
            if not firsts or self.input.hidden is not None:
                starts.append((last, []))
            for key, prefix in starts:
                found = ngrams.top(key, self.s.ngram_topk)
                total = sum(c for _, c in found) or 1
                for cont, count in found:
                    path = prefix + list(cont)
                    tree.add_path(path, Source.NGRAM, [count / total] * len(path))
        return Proposal(tree)

    def head_logits(self, state: RunState, levels: int) -> torch.Tensor:
        """(levels, V) logits proposing depths 1, 2, ... of the tree.

        paper: one forward of the last token over the partial cache; the base LM head proposes depth 1
        and extra head i depth i + 2. fused (after the first iteration): extra head i applied to the
        verification pass's hidden state at the last accepted node proposes depth i + 1. Heads with a root input
        read the root (fused) or depth 1's most likely token after the penalty (paper: the token their depths follow)."""
        hidden = self.input.hidden
        if hidden is not None:
            return self.gen.run_heads(self.gen.heads_input(hidden, state.ids[-1]), levels)[:, 0]  # (levels, V)
        full, partial = state.full, self.partial
        cache = full if partial is None else partial
        start = full.length if partial is None else partial.count
        pos = torch.tensor([len(state.ids) - 1])
        h, _ = state.a.forward(torch.tensor([state.ids[-1]]), pos, cache, start)  # (1, H)
        rows = [state.a.logits(h)]
        if levels > 1:  # the heads follow depth 1's top token, ranked as head_candidates ranks it (penalised)
            first_row = rows[0].float()  # (1, V)
            if self.s.penalty != 1.0:
                first_row = penalize_rows(first_row, state.seen([[]]), self.s.penalty)
            first = int(first_row[0].argmax())
            rows.append(self.gen.run_heads(self.gen.heads_input(h, first), levels - 1)[:, 0])  # (levels - 1, V)
        return torch.cat(rows)

    def head_candidates(self, state: RunState) -> tuple[list[list[int]], list[list[float]]]:
        """Ranked tokens and their draft probabilities per depth (the base window's penalty applied)."""
        logits = self.head_logits(state, len(self.widths)).float()  # (depths, V)
        if self.s.penalty != 1.0:
            seen = state.seen([[]]).expand(logits.shape[0], -1)
            logits = penalize_rows(logits, seen, self.s.penalty)
        top = torch.topk(torch.softmax(logits, dim=-1), max(self.widths), dim=-1)
        cands = [top.indices[d, :w].tolist() for d, w in enumerate(self.widths)]
        cprobs = [top.values[d, :w].tolist() for d, w in enumerate(self.widths)]
        return cands, cprobs

    def observe(self, state: RunState, proposal: Proposal, verdict: Verdict, base: int) -> None:
        """After the commit: the heads' next input, and the partial cache's new rows (positions base.. now)."""
        if self.fused:
            self.input.keep(verdict.h, verdict.last_row)
        if self.partial is not None:
            self.partial.append(state.full, list(range(base, state.full.length)),
                                [q[:, verdict.last_row] for q in verdict.queries])

    def observe_cost(self, proposal: Proposal, verdict: Verdict, timings: ev.Timings) -> None:
        pass
