"""One validator for everything that crosses a boundary: the UI's controls, the `/generate` API, the command
line, `Settings` and `Generator.generate`/`stream`.

Values are checked for type (a bool is not a number, 3.5 is not a whole number, text is not a number),
finiteness, range and resource bounds (tree nodes, n-gram branches, KV budget, prompt and new tokens
against the model's positions), all before anything is allocated or expanded. A refusal is an
`InvalidRequest` (a ValueError) whose message is one sentence that says what is allowed.

The checkers themselves are `tokenswift.checks` (shared with the trace file's loader) and what each setting allows
is `tokenswift.setting_rules`; the names callers use are re-exported here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from .checks import InvalidRequest, one_of, real_number, shown, true_or_false, whole_number
from .setting_rules import (MAX_NGRAM_TOPK, MAX_PENALTY, MAX_POSITIONS, MAX_TEMPERATURE, MAX_VERIFY_NODES, MAX_VOCAB,
                            MIN_TEMPERATURE, NGRAM_NODES, LoadedModel, ModelLimits, check_settings_values,
                            settings_values)
from .settings import Settings

__all__ = ["InvalidRequest", "LoadedModel", "MAX_NGRAM_TOPK", "MAX_PENALTY", "MAX_POSITIONS", "MAX_SEED",
           "MAX_TEMPERATURE", "MAX_VERIFY_NODES", "MAX_VOCAB", "MIN_TEMPERATURE", "NGRAM_NODES", "ModelLimits",
           "check_generation", "check_settings_values", "one_of", "real_number", "shown", "true_or_false",
           "validate_request", "validate_seed", "validate_settings", "whole_number"]

MAX_SEED = 2**32 - 1  # seeds stay exact through JSON and JavaScript numbers


def validate_seed(value: Any, name: str = "seed") -> int:
    return whole_number(value, name, 0, MAX_SEED)


# ---- settings ----------------------------------------------------------------------------------------------
def validate_settings(data: Mapping[str, Any] | Settings, limits: ModelLimits | None = None,
                      labels: Mapping[str, str] | None = None) -> Settings:
    """A dict of setting names to values (missing ones take their defaults) or a Settings -> a Settings
    checked against the model's limits when they are given."""
    if isinstance(data, Settings):
        values = {f.name: getattr(data, f.name) for f in fields(Settings)}
    else:
        values = settings_values(data, {f.name: f.default for f in fields(Settings)})
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


def check_generation(generator: LoadedModel, prompt_ids: list[int], settings: Settings, max_new_tokens: Any) -> int:
    """Everything `Generator.stream` needs checked against its model before allocating: the settings (top_k
    against the vocabulary, KV sizes against the positions) and the prompt plus new tokens against the
    positions. Returns max_new_tokens as an int. A tree deeper than the heads is not refused: the generator
    trims it to them (so the library's default tree works with any number of heads)."""
    known = ModelLimits.from_generator(generator)
    limits = ModelLimits(known.max_positions, known.vocab_size)
    validate_settings(settings, limits)
    return validate_request(len(prompt_ids), max_new_tokens, limits, limits.max_positions)
