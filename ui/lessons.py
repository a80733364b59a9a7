"""Lesson mode: a short guided path, one button per point. Each lesson sets the controls for its point, says what
to look at, and starts what it needs (a Run or a Step) in the same click.

Control names are the layout's (ui/controls.py CONTROL_NAMES); a lesson sets every control that matters for its
point, so that what the page shows never depends on what an earlier lesson or visitor left in the controls.
"""
from __future__ import annotations

from dataclasses import dataclass

from .controls import EXAMPLE_PROMPTS, STORY, UI_DEFAULTS

RUN, STEP = "run", "step"

# What every lesson starts from: the page's defaults, so a lesson is the same whatever came before it.
_BASE = {k: UI_DEFAULTS[k] for k in ("greedy", "temperature", "top_p", "min_p", "seed", "penalty_on", "theta", "window",
                                     "reuse_on", "ngram_topk", "tree", "kv_mode", "kv_budget", "draft")}


@dataclass(frozen=True)
class Lesson:
    title: str  # the button
    action: str  # RUN or STEP, started by the same click
    controls: dict  # control name -> value
    text: str  # what to look at (Markdown), shown above the panes

    def values(self) -> dict:
        return {**_BASE, **self.controls}


LESSONS: dict[str, Lesson] = {lesson.title: lesson for lesson in (
    Lesson("1 · Watch a race", RUN, dict(prompt=STORY, max_new=800), (
        "**Lesson 1 — watch a race.** Both panes continue the same story with the same model, greedy, with the "
        "paper's penalty. Each pane shows what its method had written after the **same seconds of its own "
        "compute**, so the faster one pulls ahead and, at the end, the slower one finishes at its own measured "
        "pace. Look at: the speedup headline (shown once it is measured, with its uncertainty); the tints in the "
        "TokenSwift pane (who drafted each token that was kept); and **identical to AR**, which stays ✅: drafting "
        "changes the speed, never the text.")),
    Lesson("2 · One iteration, step by step", STEP,
           dict(prompt=EXAMPLE_PROMPTS["Classroom: how drafting works"], max_new=200, tree="paper", ngram_topk=3), (
        "**Lesson 2 — one iteration, step by step.** Step runs exactly one TokenSwift iteration with the paper's "
        "tree (1x3x3x3: the LM head's top token, then each extra head's top 3) and 3 reused 4-grams per "
        "candidate. Read the caption's four phases, then the table from the top: each row is one drafted token, "
        "what the target drew at the token before it, and the verdict that draw implies. Press **Step** again for "
        "the next iteration; the tree plot beside the table always shows the same iteration.")),
    Lesson("3 · Why the penalty matters", RUN,
           dict(prompt=EXAMPLE_PROMPTS["Repetition-prone"], max_new=600, penalty_on=False), (
        "**Lesson 3 — why the penalty matters.** The contextual penalty is **off**: greedy decoding soon starts "
        "copying itself. Look at the wavy underlines (verbatim repeats), the bright blocks off the diagonal of the "
        "repetition heatmap, and the distinct-n line under it. Then press the case study **Repetition: penalty on** "
        "and **Run**: same prompt, same decoding, only θ 1.2 over the last 1,024 tokens differs.")),
    Lesson("4 · Why temperature 1 drafts little on a CPU", RUN,
           dict(prompt=STORY, max_new=600, greedy=False, temperature=1.0, top_p=1.0, min_p=0.1), (
        "**Lesson 4 — why temperature 1 drafts little here.** This is the paper's sampling (temperature 1, "
        "min-p 0.1, θ 1.2). A model this small is unsure of its next token: its draw is its own most likely token "
        "only about half the time, so a drafted token rarely matches the draw. Compare **tokens per iteration** "
        "in the TokenSwift header and the accepted-tokens plot with lesson 1's greedy race: near 1 here, so "
        "TokenSwift runs at about AR's speed. On a GPU with a 7B+ model, as in the paper, it pays at temperature "
        "1 too.")),
)}
