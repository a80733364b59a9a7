"""Generation settings: one typed dataclass, validated once at the boundary."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .kinds import AcceptanceRule, DraftMode, KVMode

KV_MODES = tuple(KVMode)
# The paper's sampling for long generation (Settings(**PAPER_SAMPLING)): used by the evaluation and benchmarks.
PAPER_SAMPLING = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)
DRAFT_MODES = tuple(DraftMode)
ACCEPTANCE_RULES = tuple(AcceptanceRule)


@dataclass(frozen=True)
class Settings:
    """Everything that shapes one generation.

    Sampling (shared by AR and TokenSwift, applied in this order):
      penalty      contextual (CTRL-style) repetition penalty theta; 1.0 turns it off. Positive logits of
                   tokens seen in the last `penalty_window` tokens are divided by theta, negative ones
                   multiplied by it.
      temperature  0.0 means greedy (argmax); otherwise logits are divided by it.
      top_k        keep the k most likely tokens (0: off).
      top_p        nucleus sampling (1.0: off).
      min_p        keep tokens whose probability is at least min_p x the top probability (0: off).
      eta          eta sampling threshold (0: off).
    Drafting:
      tree         "auto" (cost-aware: the tree that maximizes expected tokens per second on this machine,
                   see `tokenswift.auto`; drafts fused, from heads, suffix matches and 4-grams), a tree
                   preset name (see `tokenswift.tree.TREE_PRESETS`) or a product spec like "1x3x3x3".
      ngram_reuse  add the most frequent 4-grams starting with each depth-1 candidate as branches.
      ngram_topk   how many 4-grams per depth-1 candidate.
      kv_mode      partial KV cache for drafting: "full" (no partial cache), "once" (select at prefill,
                   then a rolling recent tail) or "dynamic" (re-select when the tail is full).
      kv_budget    positions held by the partial cache (per layer and KV head).
      kv_sink      first positions always kept.
      kv_recent    room for the recent tail (None: a quarter of the budget).
      draft        "paper": a draft forward of the last token over the partial cache each iteration (the
                   paper's scheme); "fused": no draft forward, the heads read the verification pass's hidden
                   state at the last accepted token (one level shallower, no partial cache; measured option
                   for CPUs, where the draft forward costs as much as an AR step).
    Other:
      stop_at_eos  stop when the tokenizer's end-of-sequence token is produced (off for long-form runs).
      acceptance   "exact" (lossless, one target sample per tree node) or "per_row_biased" (the original
                   code's rule, kept only to demonstrate its bias; not lossless).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    eta: float = 0.0
    penalty: float = 1.0
    penalty_window: int = 1024
    ngram_reuse: bool = True
    ngram_topk: int = 20
    tree: str = "1x3x3x3"
    kv_mode: str = "dynamic"
    kv_budget: int = 4096
    kv_sink: int = 16
    kv_recent: int | None = None
    draft: str = "paper"
    stop_at_eos: bool = False
    acceptance: str = "exact"

    def __post_init__(self) -> None:
        _check(self.temperature >= 0.0, f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(0.0 <= self.min_p < 1.0, f"min_p must be in [0, 1), got {self.min_p}")
        _check(0.0 <= self.eta < 1.0, f"eta must be in [0, 1), got {self.eta}")
        _check(self.penalty >= 1.0, f"penalty (theta) must be >= 1.0 (1.0 turns it off), got {self.penalty}")
        _check(self.penalty_window >= 1, f"penalty_window must be >= 1, got {self.penalty_window}")
        _check(self.ngram_topk >= 0, f"ngram_topk must be >= 0, got {self.ngram_topk}")
        _check(self.kv_mode in KV_MODES, f"kv_mode must be one of {', '.join(KV_MODES)}, got {self.kv_mode!r}")
        _check(self.draft in DRAFT_MODES, f"draft must be one of {', '.join(DRAFT_MODES)}, got {self.draft!r}")
        _check(self.kv_sink >= 0, f"kv_sink must be >= 0, got {self.kv_sink}")
        recent = self.recent_capacity
        _check(recent >= 1, f"kv_recent must be >= 1, got {recent}")
        _check(
            self.kv_budget >= self.kv_sink + recent + 1,
            f"kv_budget ({self.kv_budget}) must exceed kv_sink ({self.kv_sink}) + kv_recent ({recent})",
        )
        _check(
            self.acceptance in ACCEPTANCE_RULES,
            f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {self.acceptance!r}",
        )
        from .tree import parse_tree  # late import: tree.py does not depend on settings

        parse_tree(self.tree)  # raises ValueError with a readable message

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def recent_capacity(self) -> int:
        return self.kv_recent if self.kv_recent is not None else max(1, self.kv_budget // 4)

    def with_changes(self, **changes: Any) -> "Settings":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Settings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        _check(not unknown, f"unknown setting(s): {', '.join(unknown)}")
        return cls(**data)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
