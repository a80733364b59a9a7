"""`python -m tokenswift.bench parts`: AR steps and auto iterations split into parts, on the shipped default model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenswift import verifier
from tokenswift.auto import AutoDrafter
from tokenswift.adapter import ModelAdapter
from tokenswift.bench import cli as bench
from tokenswift.bench.parts import PARTS, parts
from tokenswift.native import decide

pytestmark = pytest.mark.slow  # a benchmark on the shipped default model

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "assets" / "default-model")
LINE = "It was a fine morning, and Emma walked to Hartfield with her father and Mr. Knightley."


@pytest.fixture
def text(tmp_path):
    """A plain-text file whose held-out part (its last 5% of lines) has more than 64 tokens (no corpus needed)."""
    path = tmp_path / "text.txt"
    path.write_text("\n".join(f"{LINE} ({i})" for i in range(300)), encoding="utf-8")
    return str(path)


def test_parts_times_each_kind_of_iteration_and_restores_the_engine(text, capsys):
    originals = (ModelAdapter.forward, AutoDrafter.propose, verifier.verification_inputs, decide.walk_tree)
    threads = torch.get_num_threads()
    result = parts(MODEL, "greedy", context=64, tokens=60, repeats=1, text_path=text)
    assert result["context"] == 64
    kinds = result["iterations"]
    ar = kinds["ar"]
    assert ar["iterations"] == 59  # the first step (which carries the prefill) is left out
    for label in ("forward", "logits", "decide", "cache_state"):
        assert ar[label]["share"] == 1.0 and ar[label]["ms"] > 0
    assert ar["total"]["ar_steps"] == 1.0
    assert ar["forward"]["ms"] < ar["total"]["ms"]
    assert "draft" not in ar and "walk" not in ar  # AR neither drafts nor walks a tree
    auto = [kinds[k] for k in ("plain", "drafted") if k in kinds]
    assert auto and all(k["draft"]["share"] == 1.0 for k in auto)  # every auto iteration asks the planner
    if "drafted" in kinds:  # a drafted iteration verifies a tree: its inputs and the native walk (or the decision)
        d = kinds["drafted"]
        assert d["inputs"]["share"] == 1.0
        assert d.get("walk", {"share": 0})["share"] + d.get("decide", {"share": 0})["share"] >= 1.0
    assert 1.0 <= result["auto_tokens_per_iteration"] <= 1 + 12
    assert result["settings"]["tree"] == "auto"
    assert (ModelAdapter.forward, AutoDrafter.propose, verifier.verification_inputs, decide.walk_tree) == originals
    assert set(PARTS) >= {"forward", "logits", "draft", "inputs", "walk", "decide"}
    assert torch.get_num_threads() == threads

    assert bench.main(["parts", "--model", MODEL, "--context", "32", "--tokens", "12", "--repeats", "1",
                       "--text", text]) == 0
    assert '"benchmark": "parts"' in capsys.readouterr().out
