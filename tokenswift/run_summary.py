"""Running totals over a generation's Step events: the summary `Generator.generate` returns in Result.stats."""
from __future__ import annotations

from . import events as ev


class RunSummary:
    """Running totals over Step events -> the summary in Result.stats."""

    def __init__(self) -> None:
        self.iterations = 0
        self.tokens = 0
        self.by_source: dict[str, int] = {}
        self.nodes = 0
        self.draft_s = self.verify_s = self.bookkeeping_s = 0.0
        self.elapsed_s = 0.0
        self.prefill_s = 0.0
        self.refreshes = 0

    def add(self, step: ev.Step) -> None:
        self.iterations += 1
        self.tokens += len(step.tokens)
        for t in step.tokens:
            self.by_source[t.source] = self.by_source.get(t.source, 0) + 1
        self.nodes += step.draft_nodes
        self.draft_s += step.timings.draft_s
        self.verify_s += step.timings.verify_s
        self.bookkeeping_s += step.timings.bookkeeping_s
        self.elapsed_s = step.elapsed_s
        self.prefill_s = step.prefill_s
        self.refreshes = step.cache.refreshes

    def summary(self, method: str) -> dict:
        it = max(1, self.iterations)
        return {
            "method": method,
            "new_tokens": self.tokens,
            "iterations": self.iterations,
            "mean_accepted": self.tokens / it,
            "accepted_by_source": dict(self.by_source),
            "mean_draft_nodes": self.nodes / it,
            "time_s": self.elapsed_s,
            "prefill_s": self.prefill_s,
            "tokens_per_s": self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "bookkeeping_s": self.bookkeeping_s,
            "partial_refreshes": self.refreshes,
        }
