"""The control panel's values -> validated engine settings (one place, clear messages)."""
from __future__ import annotations

from dataclasses import dataclass

from tokenswift import TREE_PRESETS, Settings
from tokenswift.tree import AUTO

MAX_NEW_TOKENS = 50_000

# The controls' starting values (the layout and the measurement script both read these).
UI_DEFAULTS = dict(max_new=500, greedy=False, temperature=1.0, top_p=1.0, min_p=0.1, seed=0, penalty_on=True,
                   theta=1.2, window=1024, reuse_on=True, ngram_topk=20, tree=AUTO, kv_mode="dynamic",
                   kv_budget=1024, draft="paper")
CONTROL_ORDER = ("max_new", "greedy", "temperature", "top_p", "min_p", "seed", "penalty_on", "theta", "window",
                 "reuse_on", "ngram_topk", "tree", "kv_mode", "kv_budget", "draft")

EXAMPLE_PROMPTS = {
    "Austen (held-out Persuasion)": (
        "Anne Elliot, with all her claims of birth, beauty, and mind, to throw herself away at nineteen; "
        "involve herself at nineteen in an engagement with a young man"
    ),
    "Austen (held-out Emma)": (
        "Mr. Knightley, a sensible man about seven or eight-and-thirty, was not only a very old and intimate "
        "friend of the family, but particularly connected with it"
    ),
    "Classroom: how drafting works": "It is a truth universally acknowledged, that",
    "Repetition-prone": "And it came to pass, that the king said unto the people, and the people said unto the king,",
}


@dataclass(frozen=True)
class RunControls:
    prompt: str
    max_new_tokens: int
    seed: int
    model: str
    settings: Settings


def parse_controls(prompt: str, max_new_tokens: float, greedy: bool, temperature: float, top_p: float, min_p: float,
                   seed: float, penalty_on: bool, theta: float, window: float, reuse_on: bool, ngram_topk: float,
                   tree: str, kv_mode: str, kv_budget: float, draft: str, model: str) -> RunControls:
    """Raises ValueError with a message meant for the user."""
    if prompt is None or not str(prompt).strip():
        raise ValueError("Type a prompt (or pick an example) first.")
    if len(prompt) > 200_000:
        raise ValueError("The prompt is too long for this demo (200,000 characters at most).")
    n = _whole(max_new_tokens, "Max new tokens")
    if not 1 <= n <= MAX_NEW_TOKENS:
        raise ValueError(f"Max new tokens must be between 1 and {MAX_NEW_TOKENS:,}.")
    settings = Settings(
        temperature=0.0 if greedy else float(temperature),
        top_p=float(top_p), min_p=float(min_p),
        penalty=float(theta) if penalty_on else 1.0, penalty_window=_whole(window, "Penalty window"),
        ngram_reuse=bool(reuse_on), ngram_topk=_whole(ngram_topk, "N-gram top-k"),
        tree=str(tree), kv_mode=str(kv_mode), kv_budget=_whole(kv_budget, "KV budget"), draft=str(draft),
    )
    if not greedy and settings.temperature == 0.0:
        raise ValueError("Temperature 0 is greedy: tick 'Greedy' or choose a temperature above 0.")
    return RunControls(str(prompt), n, _whole(seed, "Seed"), str(model), settings)


def _whole(value, name: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number.") from None
    if number != int(number):
        raise ValueError(f"{name} must be a whole number.")
    return int(number)


TREE_CHOICES = [AUTO, *TREE_PRESETS]


def default_controls(prompt: str, model: str, **changes) -> RunControls:
    """The controls as the page starts, with optional changes (e.g. max_new=2000)."""
    values = {**UI_DEFAULTS, **changes}
    return parse_controls(prompt, *(values[k] for k in CONTROL_ORDER), model)
