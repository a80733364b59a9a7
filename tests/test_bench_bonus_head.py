"""`python -m tokenswift.bench bonus-head`: the probe head and its coverage count, on the shipped default model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenswift import Generator
from tokenswift.bench.bonus_head import BonusHead, coverage, hidden_states, train_head

pytestmark = pytest.mark.slow  # a benchmark on the shipped default model

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "assets" / "default-model"


@pytest.fixture(scope="module")
def gen():
    return Generator.from_pretrained(MODEL)


def test_an_untrained_probe_is_the_models_own_head(gen):
    """Its blocks start as the identity, so every depth's logits are the model's logits at h."""
    lean = gen.adapter.lean
    ids = gen.encode("It was a fine morning, and Emma walked to Hartfield with her father.")
    hidden, picks = hidden_states(gen, ids, window=8)  # two windows: each starts from an empty cache
    assert hidden.shape == (len(ids), lean.embed.shape[1]) and picks.shape == (len(ids),)
    head = BonusHead(lean.embed.float(), lean.norm.float(), lean.shape.eps)
    follow = torch.tensor(ids[1:] + ids[:1])[:, None].repeat(1, 2)
    with torch.no_grad():
        for logits in head(hidden, follow):
            torch.testing.assert_close(logits, lean.logits(hidden), rtol=1e-4, atol=1e-3)
            assert torch.equal(logits.argmax(-1), picks)


def test_coverage_counts_add_up_after_a_short_training(gen):
    text = "\n".join(f"Emma walked to Hartfield with her father and Mr. Knightley ({i})." for i in range(150))
    ids = gen.encode(text)[:1500]
    head, training = train_head(gen, ids, epochs=1, seed=0, log=lambda _: None)
    assert training["steps"] >= 1 and training["train_tokens"] == len(ids)
    prompt = ids[:40]
    out = gen.generate(prompt, None, 24, method="ar").token_ids
    result = coverage(gen, head, prompt, out)
    top = result["top1"]
    assert result["positions"] == len(out) - 2  # x_{t+2} after each known bonus
    assert all(0.0 <= v <= 1.0 for v in top.values())
    assert top["head_two_deep"] <= top["head"] and top["head_only"] <= top["head"]
    assert max(top["suffix"], top["datastore"]) <= top["suffix_or_datastore"] <= top["any"]
    assert top["any"] == pytest.approx(top["suffix_or_datastore"] + top["head_only"], abs=2e-3)
