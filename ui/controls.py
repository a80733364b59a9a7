"""The control panel's values -> settings checked by `tokenswift.validate` (its messages shown as they are)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tokenswift import TREE_PRESETS, Settings
from tokenswift.tree import AUTO
from tokenswift.validate import InvalidRequest, shown, true_or_false, validate_seed, validate_settings, whole_number

MAX_NEW_TOKENS = 50_000
MAX_PROMPT_CHARS = 200_000  # a cap before tokenizing; the limit that counts is in tokens
# The controls' names in messages, where they differ from the Settings field they set.
LABELS = {"penalty": "Theta", "penalty_window": "Penalty window", "ngram_topk": "N-gram top-k",
          "ngram_reuse": "Token reuse"}

# The controls' starting values (the layout and the measurement script both read these).
UI_DEFAULTS = dict(max_new=1000, greedy=True, temperature=1.0, top_p=1.0, min_p=0.1, seed=0, penalty_on=True,
                   theta=1.2, window=1024, reuse_on=True, ngram_topk=20, tree=AUTO, kv_mode="dynamic",
                   kv_budget=1024, draft="paper")
CONTROL_ORDER = ("max_new", "greedy", "temperature", "top_p", "min_p", "seed", "penalty_on", "theta", "window",
                 "reuse_on", "ngram_topk", "tree", "kv_mode", "kv_budget", "draft")
CONTROL_NAMES = ("prompt", *CONTROL_ORDER, "model")  # every control a Run or Step reads, by component name

# The page opens on a long prefix and a long continuation (the paper's prefix is 4,096 tokens of PG-19), scaled to a
# CPU: a story written for this demo (about 900 tokens), so that no shipped model trained on it, continued greedily
# with the paper's contextual penalty (theta 1.2 over 1,024 tokens), where drafting pays on a CPU. The paper's
# sampling is one preset away (ui/presets.py). A page of Emma's held-out part (808 tokens, text the bundled model
# never trained on; the speed benchmark's prompt comes from there too) is the first example.
PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts"
STORY = (PROMPTS / "the-keeper.txt").read_text(encoding="utf-8").strip()
BOOK_PAGE = (PROMPTS / "emma-held-out.txt").read_text(encoding="utf-8").strip()

EXAMPLE_PROMPTS = {
    "A story written for this demo (The Keeper)": STORY,
    "Emma: a whole page (about 800 tokens, held out)": BOOK_PAGE,
    "Persuasion: one sentence (held out)": (
        "Anne Elliot, with all her claims of birth, beauty, and mind, to throw herself away at nineteen; "
        "involve herself at nineteen in an engagement with a young man"
    ),
    "Emma: one sentence about Mr. Knightley (held out)": (
        "Mr. Knightley, a sensible man about seven or eight-and-thirty, was not only a very old and intimate "
        "friend of the family, but particularly connected with it"
    ),
    "Classroom: how drafting works": "It is a truth universally acknowledged, that",
    "Repetition-prone": "And it came to pass, that the king said unto the people, and the people said unto the king,",
}
PAGE_MODEL_ENV = "TOKENSWIFT_PAGE_MODEL"  # the menu entry the page opens on (default: see page_model)


def page_model(models: Mapping[str, str]) -> str:
    """The model menu's entry the page opens on: $TOKENSWIFT_PAGE_MODEL where it names an entry (or a built-in
    model's name, e.g. smollm2-135m), else the first built-in real model already fetched (SmolLM2-135M-Instruct after
    `python -m tokenswift fetch smollm2-135m`, or after a visitor picked it once), else the first entry (the bundled
    model: the page then works offline)."""
    from tokenswift.builtin import is_builtin, is_fetched
    from tokenswift.serve.models import entry_named

    names = list(models)
    chosen = entry_named(models, os.environ.get(PAGE_MODEL_ENV, ""))
    if chosen in models:
        return chosen
    for name, source in models.items():
        if is_builtin(source) and is_fetched(source):
            return name
    return names[0]


def check_page_model(models: Mapping[str, str]) -> None:
    """Raise ValueError (one sentence) where $TOKENSWIFT_PAGE_MODEL names no entry of the menu (nor a built-in model
    in it); the server checks this before it starts."""
    from tokenswift.serve.models import entry_named

    wanted = os.environ.get(PAGE_MODEL_ENV, "")
    if wanted.strip() and entry_named(models, wanted) not in models:
        raise ValueError(f"{PAGE_MODEL_ENV}={wanted!r} is not in the model menu: choose one of {', '.join(models)}")


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
    """The controls checked by `tokenswift.validate`; raises InvalidRequest (a ValueError) with a message
    meant for the user. The prompt's length in tokens is checked later by whoever holds the tokenizer
    (`tokenswift.validate.validate_request`); here only a character cap keeps megabytes from being tokenized."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("Type a prompt (or pick an example) first.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest(f"The prompt is too long for this demo ({MAX_PROMPT_CHARS:,} characters at most).")
    if not isinstance(model, str):
        raise InvalidRequest(f"Model must be the name of a listed model; got {shown(model)}.")
    n = whole_number(max_new_tokens, "Max new tokens", 1, MAX_NEW_TOKENS)
    greedy = true_or_false(greedy, "Greedy")
    penalty_on = true_or_false(penalty_on, "Penalise")
    settings = validate_settings(dict(
        temperature=0.0 if greedy else temperature, top_p=top_p, min_p=min_p,
        penalty=theta if penalty_on else 1.0, penalty_window=window, ngram_reuse=reuse_on, ngram_topk=ngram_topk,
        tree=tree, kv_mode=kv_mode, kv_budget=kv_budget, draft=draft,
    ), labels=LABELS)
    if not greedy and settings.temperature == 0.0:
        raise InvalidRequest("Temperature 0 is greedy: tick 'Greedy' or choose a temperature above 0.")
    return RunControls(prompt, n, validate_seed(seed, "Seed"), model, settings)


TREE_CHOICES = [AUTO, *TREE_PRESETS]


def default_controls(prompt: str, model: str, **changes) -> RunControls:
    """The controls as the page starts, with optional changes (e.g. max_new=2000)."""
    values = {**UI_DEFAULTS, **changes}
    return parse_controls(prompt, *(values[k] for k in CONTROL_ORDER), model)


def parse_named(values: Mapping[str, Any]) -> RunControls:
    """The controls as the page sends them, by name (`CONTROL_NAMES`); raises InvalidRequest like parse_controls."""
    missing = [name for name in CONTROL_NAMES if name not in values]
    if missing:
        raise InvalidRequest(f"missing control(s): {', '.join(missing)}.")
    return parse_controls(*(values[name] for name in CONTROL_NAMES))


# ---- controls as the truth about what produced the views ---------------------------------------------------
# The controls' ranges (the layout's sliders): a replayed value outside them is clamped, and the page says so.
RANGES = {"temperature": (0.05, 2.0), "top_p": (0.05, 1.0), "min_p": (0.0, 0.5), "theta": (1.0, 2.0),
          "ngram_topk": (1, 40)}
SHOWN_SETTINGS = ("temperature", "top_p", "min_p", "penalty", "penalty_window", "ngram_reuse", "ngram_topk", "tree",
                  "kv_mode", "kv_budget", "draft")
STEP_TREE = "paper"  # what Step drafts with when the tree control says auto (auto may draft nothing at all)


def tree_choice(spec: str) -> str:
    """A tree setting as the menu names it: a preset's name where the spec is one ("1x3x3x3" -> "paper")."""
    if spec in TREE_CHOICES:
        return spec
    return next((name for name, widths in TREE_PRESETS.items() if widths == spec), spec)


def controls_for(settings: Mapping[str, Any], prompt: str, max_new: int, model: str,
                 seed: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """The control values that reproduce a run of `settings` (a Settings' fields), and notes on what the controls
    cannot show (values clamped to a slider's range, settings that have no control)."""
    s = {**Settings().to_dict(), **settings}
    greedy = float(s["temperature"]) == 0.0
    penalty_on = float(s["penalty"]) != 1.0
    values: dict[str, Any] = dict(
        prompt=prompt, max_new=max_new, model=model, greedy=greedy,
        temperature=UI_DEFAULTS["temperature"] if greedy else s["temperature"], top_p=s["top_p"], min_p=s["min_p"],
        penalty_on=penalty_on, theta=s["penalty"] if penalty_on else UI_DEFAULTS["theta"], window=s["penalty_window"],
        reuse_on=s["ngram_reuse"], ngram_topk=s["ngram_topk"], tree=tree_choice(str(s["tree"])), kv_mode=s["kv_mode"],
        kv_budget=s["kv_budget"], draft=s["draft"])
    if seed is not None:
        values["seed"] = seed
    notes = []
    for name, (low, high) in RANGES.items():
        value = values[name]
        if isinstance(value, (int, float)) and not low <= value <= high:
            values[name] = min(max(value, low), high)
            notes.append(f"{name} {value:g} (the control shows {values[name]:g})")
    defaults = Settings().to_dict()
    for name, value in s.items():
        if name not in SHOWN_SETTINGS and value != defaults[name]:
            notes.append(f"{name} {value} (no control here)")
    return values, notes


def ignored_controls(values: Mapping[str, Any]) -> dict[str, str]:
    """Controls whose value the current mode ignores -> why (the layout greys them out with that note)."""
    out: dict[str, str] = {}
    if values.get("greedy"):
        for name in ("temperature", "top_p", "min_p", "seed"):
            out[name] = "ignored: greedy decoding takes the most likely token"
    if not values.get("penalty_on"):
        for name in ("theta", "window"):
            out[name] = "ignored: the penalty is off"
    if not values.get("reuse_on"):
        out["ngram_topk"] = "ignored: token reuse is off"
    if values.get("tree") == AUTO:
        for name in ("draft", "kv_mode", "kv_budget"):
            out[name] = "decided by tree=auto: it drafts fused (the heads read the verification pass), no partial cache"
    elif values.get("draft") == "fused":
        for name in ("kv_mode", "kv_budget"):
            out[name] = "ignored: fused drafting reads no partial cache"
    elif values.get("kv_mode") == "full":
        out["kv_budget"] = "ignored: kv_mode=full drafts over the full cache"
    return out
