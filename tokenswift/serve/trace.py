"""What a run leaves behind, built only from the engine's Step events, with bounded memory.

A `RunTrace` holds one `MethodTrace` per pane (AR and TokenSwift). Per-iteration series go through a
`Series` that halves its resolution whenever it grows past a cap, so a 100K-token run keeps at most a
few thousand points per series; the full token ids are kept (needed for the text and the repetition
plots), and only the most recent draft trees.
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tokenswift.events import Step
from tokenswift.kinds import DRAFTED, Method, Source

SERIES_CAP = 2048
TREES_KEPT = 32


class Series:
    """(x, y) points appended in x order; past `cap` points, neighbours are merged (y averaged, or the
    max for event-like series) so memory stays bounded while the whole history stays visible."""

    def __init__(self, cap: int = SERIES_CAP, reduce: str = "mean") -> None:
        self.cap, self.reduce = cap, reduce
        self.x: list[float] = []
        self.y: list[float] = []
        self._stride = 1
        self._pending: list[tuple[float, float]] = []

    def append(self, x: float, y: float) -> None:
        self._pending.append((x, y))
        if len(self._pending) < self._stride:
            return
        xs, ys = zip(*self._pending)
        self._pending = []
        self.x.append(xs[-1])
        self.y.append(max(ys) if self.reduce == "max" else sum(ys) / len(ys))
        if len(self.x) > self.cap:
            self._halve()

    def _halve(self) -> None:
        pairs = range(0, len(self.x) - 1, 2)
        merge = (lambda a, b: max(a, b)) if self.reduce == "max" else (lambda a, b: (a + b) / 2)
        self.y = [merge(self.y[i], self.y[i + 1]) for i in pairs]
        self.x = [self.x[i + 1] for i in pairs]
        self._stride *= 2

    def points(self) -> tuple[list[float], list[float]]:
        if not self._pending:
            return list(self.x), list(self.y)
        xs, ys = zip(*self._pending)
        tail = max(ys) if self.reduce == "max" else sum(ys) / len(ys)
        return self.x + [xs[-1]], self.y + [tail]

    def to_dict(self) -> dict[str, Any]:
        x, y = self.points()
        return {"x": x, "y": y}


@dataclass
class MethodTrace:
    """Everything the panes and plots need about one method's run."""

    method: str
    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per token: head / ngram / bonus / ar
    iterations: int = 0
    compute_s: float = 0.0  # the method's own compute time (prefill excluded)
    prefill_s: float = 0.0
    source_totals: dict[str, int] = field(default_factory=dict)
    length_hist: dict[int, dict[str, int]] = field(default_factory=dict)  # accepted length -> source -> iterations
    accepted: Series = field(default_factory=Series)  # accepted tokens per iteration, by iteration
    cache_len: Series = field(default_factory=Series)  # full cache length, by generated tokens
    cache_mb: Series = field(default_factory=Series)
    partial_sink: Series = field(default_factory=Series)
    partial_selected: Series = field(default_factory=Series)
    partial_recent: Series = field(default_factory=Series)
    refresh_at: list[int] = field(default_factory=list)  # generated-token counts where the partial cache refreshed
    held_runs: list[tuple[int, int]] = field(default_factory=list)  # sink + selected runs at the last refresh
    partial_budget: int = 0
    partial_mode: str = "none"
    cache_length: int = 0
    trees: deque = field(default_factory=lambda: deque(maxlen=TREES_KEPT))  # (iteration, [TreeNode], [accepted])
    done: bool = False
    plan: str = ""  # tree="auto": the latest iteration's chosen tree and why
    # compact per-iteration records for export (a few bytes per iteration)
    per_iteration_accepted: array = field(default_factory=lambda: array("H"))
    per_iteration_nodes: array = field(default_factory=lambda: array("H"))
    per_iteration_ms: array = field(default_factory=lambda: array("f"))  # draft, verify, bookkeeping per iteration

    @property
    def generated(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.compute_s if self.compute_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.generated / self.iterations if self.iterations else 0.0

    def add(self, step: Step) -> None:
        for tok in step.tokens:
            self.token_ids.append(tok.token)
            self.sources.append(tok.source)
            self.source_totals[tok.source] = self.source_totals.get(tok.source, 0) + 1
        self.iterations += 1
        self.compute_s = step.elapsed_s
        self.prefill_s = step.prefill_s
        n = step.accepted_length
        main = _main_source(step)
        hist = self.length_hist.setdefault(n, {})
        hist[main] = hist.get(main, 0) + 1
        self.accepted.append(step.index, n)
        self.per_iteration_accepted.append(min(n, 65535))
        self.per_iteration_nodes.append(min(step.draft_nodes, 65535))
        if step.plan:
            self.plan = step.plan
        t = step.timings
        self.per_iteration_ms.extend((t.draft_s * 1e3, t.verify_s * 1e3, t.bookkeeping_s * 1e3))
        c = step.cache
        self.cache_length = c.length
        self.cache_len.append(step.generated, c.length)
        self.cache_mb.append(step.generated, c.bytes / 2**20)
        self.partial_mode, self.partial_budget = c.partial_mode, c.partial_budget
        if c.partial_budget:
            self.partial_sink.append(step.generated, c.partial_sink)
            self.partial_selected.append(step.generated, c.partial_selected)
            self.partial_recent.append(step.generated, c.partial_recent)
        if c.refreshed and step.index > 0:
            self.refresh_at.append(step.generated)
            if len(self.refresh_at) > SERIES_CAP:
                self.refresh_at = self.refresh_at[::2]
        if c.held_positions is not None:
            self.held_runs = list(c.held_positions)
        if step.tree:
            self.trees.append((step.index, list(step.tree), [t.token for t in step.tokens]))
        self.done = step.done

    def partial_recent_now(self) -> int:
        _, ys = self.partial_recent.points()
        return int(ys[-1]) if ys else 0


def _main_source(step: Step) -> str:
    """The source that produced most of an iteration's drafted tokens (bonus-only: "bonus")."""
    drafted = [t.source for t in step.tokens if t.source in DRAFTED]
    if not drafted:
        return step.tokens[-1].source if step.tokens else Source.AR
    return max(set(drafted), key=drafted.count)


@dataclass
class RunTrace:
    """Both panes of one run, plus what produced it."""

    prompt_ids: list[int]
    settings: dict[str, Any]
    max_new_tokens: int
    ar: MethodTrace = field(default_factory=lambda: MethodTrace(Method.AR))
    tokenswift: MethodTrace = field(default_factory=lambda: MethodTrace(Method.TOKENSWIFT))

    def pane(self, method: str) -> MethodTrace:
        return self.ar if method == Method.AR else self.tokenswift

    def add(self, step: Step) -> None:
        self.pane(step.method).add(step)

    @property
    def speedup(self) -> float:
        a, t = self.ar.tokens_per_s, self.tokenswift.tokens_per_s
        return t / a if a > 0 and t > 0 else 0.0

    def identical_prefix(self) -> int:
        """How many leading tokens the two panes share (the greedy losslessness check)."""
        n = 0
        for x, y in zip(self.ar.token_ids, self.tokenswift.token_ids):
            if x != y:
                break
            n += 1
        return n

