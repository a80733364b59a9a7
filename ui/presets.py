"""Control presets for case studies: each sets the named controls (names as in ui/layout.py) at once.

Penalty off vs on (the paper's case study of repetition in long generation): the same prompt, greedy
decoding and length, so the contextual penalty is the only difference. Run one, read the repetition heatmap,
Distinct-n and the first verbatim repeat, then run the other. Measured with the bundled model (AR, 1,500
tokens): penalty off repeats verbatim from token 17 (97% of the text inside repeated spans, Distinct-4 0.03);
theta 1.2 over 1,024 tokens from token 188 (54%, Distinct-4 0.36). At the paper's sampling (temperature 1,
min-p 0.1) neither repeated verbatim within 1,500 tokens; Distinct-4 rose from 0.87 to 0.95.
"""
from __future__ import annotations

from .controls import EXAMPLE_PROMPTS

_PENALTY_CASE = dict(prompt=EXAMPLE_PROMPTS["Repetition-prone"], max_new=1500, greedy=True, theta=1.2, window=1024)

PRESETS: dict[str, dict] = {
    "Repetition: penalty off": {**_PENALTY_CASE, "penalty_on": False},
    "Repetition: penalty on (θ 1.2, W 1024)": {**_PENALTY_CASE, "penalty_on": True},
    # The paper's own setting (its Table 1 runs sample this way); see PAPER_SAMPLING_NOTE for what it shows here.
    "The paper's sampling (T 1, min-p 0.1, θ 1.2)": dict(greedy=False, temperature=1.0, top_p=1.0, min_p=0.1,
                                                        penalty_on=True, theta=1.2, window=1024),
}
PAPER_SAMPLING_NOTE = (
    "**The paper's sampling** draws each token at temperature 1. A model this small is unsure of its next token "
    "(SmolLM2-135M's draw is its own most likely token about half the time, the bundled model's 45%), so drafts "
    "seldom match the draw and TokenSwift runs at about AR's speed on a CPU; greedy decoding with the penalty (the "
    "page's default) is where drafting pays here. On a GPU with a 7B+ model, as in the paper, it pays at temperature 1 too.")
