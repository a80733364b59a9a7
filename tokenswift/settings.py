"""Generation settings: one typed dataclass, validated once at the boundary."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .kinds import AcceptanceRule, DraftMode, KVMode
from .setting_rules import check_settings_values, settings_values

KV_MODES = tuple(KVMode)
# The paper's sampling for long generation (Settings(**PAPER_SAMPLING)): used by the evaluation and benchmarks.
PAPER_SAMPLING = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)
DRAFT_MODES = tuple(DraftMode)
ACCEPTANCE_RULES = tuple(AcceptanceRule)


def _opt(default: Any, help: str) -> Any:
    """A field with its description (the command line's help for its flag)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    """Everything that shapes one generation; each field's description is in its metadata["help"].

    Sampling is shared by AR and TokenSwift and applied in this order: penalty, temperature, top_k, top_p,
    min_p, eta. Every value is checked by `tokenswift.setting_rules` when the object is made (types, ranges and
    resource bounds), so a Settings that exists is one the engine can run; `tokenswift.validate` checks it
    again against a loaded model's limits.
    """

    temperature: float = _opt(0.0, "0 means greedy (argmax); otherwise logits are divided by it")
    top_k: int = _opt(0, "keep the k most likely tokens (0: off)")
    top_p: float = _opt(1.0, "nucleus sampling (1.0: off)")
    min_p: float = _opt(0.0, "keep tokens whose probability is at least min_p x the top probability (0: off)")
    eta: float = _opt(0.0, "eta sampling threshold (0: off)")
    penalty: float = _opt(1.0, "contextual (CTRL-style) repetition penalty theta on the tokens of the last "
                               "penalty_window tokens: positive logits divided by it, negative ones multiplied "
                               "(1.0: off; the paper: 1.2)")
    penalty_window: int = _opt(1024, "tokens the penalty looks back over")
    ngram_reuse: bool = _opt(True, "add the most frequent 4-grams starting with each depth-1 candidate as branches")
    ngram_topk: int = _opt(20, "how many 4-grams per depth-1 candidate")
    tree: str = _opt("1x3x3x3", "'auto' (cost-aware: the tree that maximizes expected tokens per second on this "
                                "machine, drafted fused from heads, suffix matches and 4-grams), a preset of "
                                "tokenswift.tree.TREE_PRESETS or widths like '1x3x3x3'")
    kv_mode: str = _opt("dynamic", "partial KV cache for drafting: 'full' (none), 'once' (select at prefill, "
                                        "then a rolling recent tail) or 'dynamic' (re-select when the tail is full)")
    kv_budget: int = _opt(4096, "positions held by the partial cache (per layer and KV head)")
    kv_sink: int = _opt(16, "first positions the partial cache always keeps")
    kv_recent: int | None = _opt(None, "room for the recent tail (default: a quarter of kv_budget)")
    draft: str = _opt("paper", "'paper': a draft forward of the last token over the partial cache each "
                                       "iteration (the paper's scheme); 'fused': the heads read the verification "
                                       "pass's hidden state (one level shallower, no partial cache; for CPUs)")
    stop_at_eos: bool = _opt(False, "stop when the tokenizer's end-of-sequence token is produced")
    acceptance: str = _opt("exact", "'exact' (lossless, one target sample per tree node) or "
                                                 "'per_row_biased' (the original code's rule, kept only to "
                                                 "demonstrate its bias; not lossless)")

    def __post_init__(self) -> None:
        checked = check_settings_values({f.name: getattr(self, f.name) for f in fields(self)})
        for name, value in checked.items():  # normalised: 3.0 -> 3 for whole numbers, 1 -> 1.0 for real ones
            object.__setattr__(self, name, value)

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
        """From a mapping of setting names to values (missing ones take their defaults); unknown names,
        wrong types and out-of-range values raise `tokenswift.validate.InvalidRequest`."""
        return cls(**settings_values(data, {f.name: f.default for f in fields(cls)}))
