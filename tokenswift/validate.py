"""One validator for everything that crosses a boundary: the UI's controls, the `/generate` API, the command
line, `Settings` and `Generator.generate`/`stream`.

Values are checked for type (a bool is not a number, 3.5 is not a whole number, text is not a number),
finiteness, range and resource bounds (tree nodes, n-gram branches, KV budget, prompt and new tokens
against the model's positions), all before anything is allocated or expanded. A refusal is an
`InvalidRequest` (a ValueError) whose message is one sentence that says what is allowed.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

from .kinds import AcceptanceRule, DraftMode, KVMode
from .tree import AUTO, product_nodes, spec_widths

if TYPE_CHECKING:
    from .generator import Generator
    from .settings import Settings

# Bounds, each with its reason.
MIN_TEMPERATURE = 1e-3  # below it sampling is greedy in practice, and tiny values break float32 (1e-320 is 0: NaN)
MAX_TEMPERATURE = 100.0  # above it sampling is uniform in practice
MAX_PENALTY = 100.0  # theta; the paper uses 1.2
MAX_NGRAM_TOPK = 64  # reused 4-grams per depth-1 candidate (the paper: 20)
NGRAM_NODES = 4  # nodes the generator reserves per reused 4-gram (its NGRAM_SIZE)
MAX_VERIFY_NODES = 2048  # tree nodes plus n-gram branches in one verification pass (the paper's settings: 200)
MAX_POSITIONS = 131_072  # positions (KV budget, penalty window) when no model is known: above the paper's 100K
MAX_VOCAB = 1_048_576  # top_k when no model is known: above any tokenizer's vocabulary
MAX_SEED = 2**32 - 1  # seeds stay exact through JSON and JavaScript numbers


class InvalidRequest(ValueError):
    """A value refused at a boundary; the message is one sentence meant for the person who gave it."""


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
    def from_generator(cls, generator: "Generator") -> "ModelLimits":
        heads = generator.heads
        limits = cls.from_config(generator.model.config, None if heads is None else heads.num_heads)
        return cls(limits.max_positions, generator.adapter.vocab_size, limits.head_levels)


# ---- primitives --------------------------------------------------------------------------------------------
def shown(value: Any) -> str:
    """A short rendering of a refused value (never megabytes of it)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a number of {value.bit_length() * 0.30103:.0f} digits"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return f"a value of type {type(value).__name__}"


def whole_number(value: Any, name: str, low: int, high: int, allowed: str | None = None) -> int:
    """An int (or a float without a fraction, such as 3.0) from low to high; `allowed` words the range."""
    allowed = allowed or f"from {low:,} to {high:,}"
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidRequest(f"{name} must be a number: a whole one {allowed}; got {shown(value)}.")
    if isinstance(value, Integral):
        number = int(value)
    elif math.isfinite(value) and float(value).is_integer():
        number = int(value)
    else:
        raise InvalidRequest(f"{name} must be a whole number {allowed}; got {shown(value)}.")
    if not low <= number <= high:
        raise InvalidRequest(f"{name} must be a whole number {allowed}; got {shown(number)}.")
    return number


def real_number(value: Any, name: str, ok: Callable[[float], bool], allowed: str) -> float:
    """A finite int or float for which ok(value) holds; `allowed` words the range."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidRequest(f"{name} must be a number: {allowed}; got {shown(value)}.")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or not ok(number):
        raise InvalidRequest(f"{name} must be a number {allowed}; got {shown(value)}.")
    return number


def true_or_false(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false; got {shown(value)}.")
    return value


def one_of(value: Any, name: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in options:
        raise InvalidRequest(f"{name} must be one of {', '.join(options)}; got {shown(value)}.")
    return value


def validate_seed(value: Any, name: str = "seed") -> int:
    return whole_number(value, name, 0, MAX_SEED)


# ---- settings ----------------------------------------------------------------------------------------------
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


def validate_settings(data: "Mapping[str, Any] | Settings", limits: ModelLimits | None = None,
                      labels: Mapping[str, str] | None = None) -> "Settings":
    """A dict of setting names to values (missing ones take their defaults) or a Settings -> a Settings
    checked against the model's limits when they are given."""
    from .settings import Settings  # late import: settings.py checks its fields with this module

    if isinstance(data, Settings):
        values = {f.name: getattr(data, f.name) for f in fields(Settings)}
    elif isinstance(data, Mapping):
        known = [f.name for f in fields(Settings)]
        unknown = [key for key in data if key not in known]
        if unknown:
            listed = ", ".join(shown(key) for key in unknown[:5])
            raise InvalidRequest(f"unknown setting(s) {listed}; the settings are {', '.join(known)}.")
        values = {**{f.name: f.default for f in fields(Settings)}, **data}
    else:
        raise InvalidRequest(f"settings must be a mapping of setting names to values (a JSON object); "
                             f"got {shown(data)}.")
    return Settings(**check_settings_values(values, limits, labels))


# ---- a request: prompt and new tokens ---------------------------------------------------------------------
def validate_request(prompt_tokens: int, max_new_tokens: Any, limits: ModelLimits | None, max_new_limit: int,
                     max_prompt_limit: int | None = None, name: str = "max_new_tokens") -> int:
    """The prompt's length in tokens and the new tokens asked for, against the caller's limits and the
    model's positions. Returns max_new_tokens as an int."""
    new = whole_number(max_new_tokens, name, 1, max_new_limit)
    if prompt_tokens < 1:
        raise InvalidRequest("The prompt is empty: give at least one token.")
    if max_prompt_limit is not None and prompt_tokens > max_prompt_limit:
        raise InvalidRequest(f"The prompt is {prompt_tokens:,} tokens long; at most {max_prompt_limit:,} are "
                             f"allowed here.")
    if limits is not None and prompt_tokens + new > limits.max_positions:
        room = limits.max_positions - prompt_tokens
        fix = f"ask for at most {room:,} new tokens" if room >= 1 else "shorten the prompt"
        raise InvalidRequest(f"The prompt ({prompt_tokens:,} tokens) plus {name} ({new:,}) must fit the model's "
                             f"{limits.max_positions:,} positions; {fix}.")
    return new


def check_generation(generator: "Generator", prompt_ids: list[int], settings: "Settings",
                     max_new_tokens: Any) -> int:
    """Everything `Generator.stream` needs checked against its model before allocating: the settings (top_k
    against the vocabulary, KV sizes against the positions) and the prompt plus new tokens against the
    positions. Returns max_new_tokens as an int. A tree deeper than the heads is not refused: the generator
    trims it to them (so the library's default tree works with any number of heads)."""
    known = ModelLimits.from_generator(generator)
    limits = ModelLimits(known.max_positions, known.vocab_size)
    validate_settings(settings, limits)
    return validate_request(len(prompt_ids), max_new_tokens, limits, limits.max_positions)
