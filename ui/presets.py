"""Control presets for case studies: each sets the named controls (names as in ui/layout.py) at once.

Penalty off vs on: the paper's case study of repetition in long generation. Both use the same prompt,
seed and sampling (the paper's temperature 1.0 and min-p 0.1), so the only difference is the contextual
penalty; run one, look at the repetition heatmap and the first verbatim repeat, then run the other.
"""
from __future__ import annotations

from .controls import EXAMPLE_PROMPTS

_PENALTY_CASE = dict(prompt=EXAMPLE_PROMPTS["Repetition-prone"], max_new=2000, greedy=False, temperature=1.0,
                     top_p=1.0, min_p=0.1, seed=0, theta=1.2, window=1024)

PRESETS: dict[str, dict] = {
    "Repetition: penalty off": {**_PENALTY_CASE, "penalty_on": False},
    "Repetition: penalty on (θ 1.2, W 1024)": {**_PENALTY_CASE, "penalty_on": True},
}
