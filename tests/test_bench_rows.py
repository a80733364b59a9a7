"""`python -m tokenswift.bench rows`: the forward split into parts, on the shipped default model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenswift import lean
from tokenswift.bench import cli as bench
from tokenswift.bench.rows import rows

pytestmark = pytest.mark.slow  # a benchmark on the shipped default model

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "assets" / "default-model"
LINE = "It was a fine morning, and Emma walked to Hartfield with her father and Mr. Knightley."


@pytest.fixture
def text(tmp_path):
    """A plain-text file whose held-out part (its last 5% of lines) has more than 48 tokens."""
    path = tmp_path / "text.txt"
    path.write_text("\n".join(f"{LINE} ({i})" for i in range(200)), encoding="utf-8")
    return path


def test_rows_splits_each_forward_into_parts_and_restores_the_step(text, capsys):
    attend, matrix_call = lean.attend, lean.Matrix.__call__
    threads = torch.get_num_threads()
    result = rows(str(MODEL), str(text), context=48, row_counts=[1, 3], repeats=2)
    assert result["context"] == 48
    table = result["milliseconds"]
    assert set(table) == {"1", "3"}
    for part in table.values():
        assert part["total"] > 0 and part["attention"] > 0 and part["matrices"] > 0 and part["logits"] > 0
        assert part["rest"] >= 0  # the timed parts run inside the forward
        assert part["attention"] + part["matrices"] + part["rest"] + part["logits"] <= part["total"] * 1.01
    assert table["1"]["relative_to_first"] == 1.0
    assert lean.attend is attend and lean.Matrix.__call__ is matrix_call  # the timers are gone afterwards

    assert bench.main(["rows", "--model", str(MODEL), "--text", str(text), "--context", "32", "--rows", "1", "2",
                       "--repeats", "1"]) == 0
    assert '"benchmark": "rows"' in capsys.readouterr().out
    assert torch.get_num_threads() == threads  # the benchmark's one thread is not left to the caller
