"""What each `Settings` field allows, alone and against a loaded model's limits, with the bounds and their reasons.

`Settings` checks its fields with these rules when it is made; `tokenswift.validate` applies them again at the
boundaries against a model's limits. Below both: this module imports neither, so neither imports the other in a
circle.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .checks import InvalidRequest, one_of, real_number, shown, true_or_false, whole_number
from .kinds import AcceptanceRule, DraftMode, KVMode
from .tree import AUTO, product_nodes, spec_widths

# Bounds, each with its reason.
MIN_TEMPERATURE = 1e-3  # below it sampling is greedy in practice, and tiny values break float32 (1e-320 is 0: NaN)
MAX_TEMPERATURE = 100.0  # above it sampling is uniform in practice
MAX_PENALTY = 100.0  # theta; the paper uses 1.2
MAX_NGRAM_TOPK = 64  # reused 4-grams per depth-1 candidate (the paper: 20)
NGRAM_NODES = 4  # nodes the generator reserves per reused 4-gram (its NGRAM_SIZE)
MAX_VERIFY_NODES = 2048  # tree nodes plus n-gram branches in one verification pass (the paper's settings: 200)
MAX_POSITIONS = 131_072  # positions (KV budget, penalty window) when no model is known: above the paper's 100K
MAX_VOCAB = 1_048_576  # top_k when no model is known: above any tokenizer's vocabulary


class LoadedModel(Protocol):
    """What `ModelLimits.from_generator` reads of a `tokenswift.Generator` (a protocol, so that the rules do not
    import the generator, which imports them)."""

    model: Any  # the transformers model: its .config
    heads: Any  # tokenswift.Heads or None: its .num_heads
    adapter: Any  # its .vocab_size


@dataclass(frozen=True)
class ModelLimits:
    """What a loaded model allows."""

    max_positions: int  # prompt + new tokens
    vocab_size: int
    head_levels: int | None = None  # tree levels it can draft (its LM head + extra heads); None: no heads

    @classmethod
    def from_config(cls, config: Any, num_heads: int | None = None) -> "ModelLimits":
        """From a transformers config (and the number of TokenSwift heads, if any)."""
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if not positions:
            raise ValueError(f"{type(config).__name__} states no maximum number of positions")
        return cls(int(positions), int(config.vocab_size), None if num_heads is None else 1 + num_heads)

    @classmethod
    def from_generator(cls, generator: LoadedModel) -> "ModelLimits":
        heads = generator.heads
        limits = cls.from_config(generator.model.config, None if heads is None else heads.num_heads)
        return cls(limits.max_positions, generator.adapter.vocab_size, limits.head_levels)


def settings_values(data: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping of setting names to values -> every field's value (missing ones take `defaults`), refusing a
    value that is not a mapping and names that are not settings."""
    if not isinstance(data, Mapping):
        raise InvalidRequest(f"settings must be a mapping of setting names to values (a JSON object); "
                             f"got {shown(data)}.")
    unknown = [key for key in data if key not in defaults]
    if unknown:
        listed = ", ".join(shown(key) for key in unknown[:5])
        raise InvalidRequest(f"unknown setting(s) {listed}; the settings are {', '.join(defaults)}.")
    return {**defaults, **data}


def check_settings_values(values: Mapping[str, Any], limits: ModelLimits | None = None,
                          labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every Settings field checked (and ints/floats normalised: 3.0 -> 3 for whole numbers, 1 -> 1.0 for
    real ones). `labels` renames fields in messages (the UI's names for its controls)."""
    labels = labels or {}
    rules = _field_rules(limits)
    out = {key: rule(values[key], labels.get(key, key)) for key, rule in rules.items()}
    _check_kv_room(out, labels)
    _check_verify_nodes(out)
    return out


def _field_rules(limits: ModelLimits | None) -> dict[str, Callable[[Any, str], Any]]:
    positions = MAX_POSITIONS if limits is None else min(MAX_POSITIONS, limits.max_positions)
    vocab = MAX_VOCAB if limits is None else limits.vocab_size
    head_levels = None if limits is None else limits.head_levels

    def probability_cut(value: Any, name: str) -> float:
        return real_number(value, name, lambda x: 0.0 <= x < 1.0, "from 0 (off) up to but not including 1")

    def kv_recent(value: Any, name: str) -> int | None:
        allowed = f"from 1 to {positions:,} (or None: a quarter of kv_budget)"
        return None if value is None else whole_number(value, name, 1, positions, allowed)

    return {
        "temperature": _temperature,
        "top_k": lambda v, n: whole_number(v, n, 0, vocab, f"from 0 (off) to {vocab:,} (the vocabulary size)"),
        "top_p": lambda v, n: real_number(v, n, lambda x: 0.0 < x <= 1.0,
                                          "greater than 0 and at most 1 (1 turns it off)"),
        "min_p": probability_cut,
        "eta": probability_cut,
        "penalty": lambda v, n: real_number(v, n, lambda x: 1.0 <= x <= MAX_PENALTY,
                                            f"from 1 (off) to {MAX_PENALTY:g}"),
        "penalty_window": lambda v, n: whole_number(v, n, 1, positions),
        "ngram_reuse": true_or_false,
        "ngram_topk": lambda v, n: whole_number(v, n, 0, MAX_NGRAM_TOPK),
        "tree": lambda v, n: _tree(v, head_levels),
        "kv_mode": lambda v, n: one_of(v, n, tuple(KVMode)),
        "kv_budget": lambda v, n: whole_number(v, n, 2, positions),
        "kv_sink": lambda v, n: whole_number(v, n, 0, positions),
        "kv_recent": kv_recent,
        "draft": lambda v, n: one_of(v, n, tuple(DraftMode)),
        "stop_at_eos": true_or_false,
        "acceptance": lambda v, n: one_of(v, n, tuple(AcceptanceRule)),
    }


def _temperature(value: Any, name: str) -> float:
    allowed = f"equal to 0 (greedy) or from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}"
    return real_number(value, name, lambda x: x == 0.0 or MIN_TEMPERATURE <= x <= MAX_TEMPERATURE, allowed)


def _tree(value: Any, head_levels: int | None) -> str:
    try:
        widths = spec_widths(value)  # bounds checked on the widths alone, nothing expanded
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if head_levels is not None and len(widths) > head_levels:
        raise InvalidRequest(f"tree {value!r} has {len(widths)} levels; this model drafts at most {head_levels} "
                             f"(its LM head and {head_levels - 1} heads).")
    return value.strip()


def _check_kv_room(values: dict[str, Any], labels: Mapping[str, str]) -> None:
    budget, sink, recent = values["kv_budget"], values["kv_sink"], values["kv_recent"]
    recent = recent if recent is not None else max(1, budget // 4)
    if budget < sink + recent + 1:
        name = labels.get("kv_budget", "kv_budget")
        raise InvalidRequest(f"{name} must be larger than kv_sink + kv_recent ({sink:,} + {recent:,}) so that the "
                             f"partial cache can select positions; got {budget:,}.")


def _check_verify_nodes(values: dict[str, Any]) -> None:
    """Tree nodes plus the n-gram branches the generator reserves room for (auto has its own bound)."""
    tree = values["tree"]
    if tree == AUTO or not values["ngram_reuse"]:
        return
    widths = spec_widths(tree)
    nodes = product_nodes(widths) + ((widths[0] if widths else 0) + 1) * values["ngram_topk"] * NGRAM_NODES
    if nodes > MAX_VERIFY_NODES:
        raise InvalidRequest(f"tree {tree!r} with ngram_topk {values['ngram_topk']} may verify {nodes:,} nodes per "
                             f"step; at most {MAX_VERIFY_NODES:,} are allowed (lower ngram_topk or the first width).")
