"""The speed benchmark's core on a tiny random Llama: structure of the results, no timing assertions."""
import copy
import json

import pytest
import torch

import tokenswift as ts
from tokenswift.bench import report
from tokenswift.bench import speed as bs

from conftest import random_heads, tiny_model


@pytest.mark.slow  # runs the benchmark
def test_speed_results_structure(tmp_path):
    model = tiny_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    hf = {"float32": bs.prepare_hf_model(model), "bfloat16": bs.prepare_hf_model(copy.deepcopy(model).to(torch.bfloat16))}
    prompt = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(3)).tolist()
    res = bs.run_speed(gen, hf, {48: prompt}, list(bs.ROWS), tokens=20, repeats=1, auto_tree="small",
                       progress=False)

    assert len(res["rows"]) == len(bs.ROWS)
    for row in res["rows"]:
        med = row["medians"]
        for m in bs.OURS:
            assert med[m]["tok_s"] > 0 and med[m]["wall_tok_s"] > 0 and med[m]["iterations"] >= 1
        for m in bs.HF_RUNS:
            assert med[m]["wall_tok_s"] > 0
        assert row["hf_peer"]["method"] in bs.HF_RUNS
        assert set(row["ratios"]) == set(bs.RATIO_KEYS)
        for key in ("ours-ar/hf-peer (wall)", "tokenswift-auto/ours-ar", "tokenswift-auto/ours-ar (paired)",
                    "tokenswift-paper/ours-ar"):
            assert row["ratios"][key] > 0
        assert med[bs.PAIRED]["identical"] is True and len(med[bs.PAIRED]["ratios"]) == 1  # one per repeat
        assert med["tokenswift-auto"]["tree"] == "small" and med["tokenswift-paper"]["tree"] == "1x3x3x3"
        if bs.ROWS[row["sampling"]].greedy:
            assert med[bs.PLD]["wall_tok_s"] > 0 and row["ratios"]["tokenswift-auto/hf-prompt-lookup (wall)"] > 0
            assert row["pld_dtype"] in hf
        else:
            assert "skipped" in med[bs.PLD]
        for m in ("tokenswift-auto", "tokenswift-paper"):
            # fp32 engine: lossless, so identical to AR (the flag is what the benchmark reports)
            assert row["lossless"][m]["identical"] is True
    runs = res["runs"]
    assert len(runs) == sum(len(bs.methods_for(r, set(hf))) + 1 for r in bs.ROWS)  # + the paired run
    assert all(r["new_tokens"] == 20 for r in runs)
    greedy = next(r for r in res["rows"] if r["sampling"] == "greedy")
    assert greedy["hf_vs_ours_ar_ids"]["hf-fp32"]["identical"]  # HF fp32 greedy == our fp32 AR

    # outputs: JSON round trip, markdown table with one line per row, a plotly figure
    results = {"conditions": {"new_tokens": 20, "threads": 1, "model": "tiny"}, **res}
    json.loads(json.dumps(results, default=str))
    table = report.markdown_table(results)
    assert table.count("\n| 48 |") == len(bs.ROWS)
    assert len(report.speed_figure(results).data) == 5


def test_divergence_report_gives_position_and_gap():
    model = tiny_model("llama-gqa")
    prompt = list(range(10, 40))
    ar = [5, 6, 7, 8]
    other = [5, 6, 9, 8]
    assert bs.first_divergence(ar, other) == 2 and bs.first_divergence(ar, ar) is None
    for row in ("greedy", "greedy+penalty"):
        out = bs.lossless_check(prompt, [ar], [other], bs.ROWS[row], [model])
        assert out["identical"] is False and out["first_diff"] == 2
        assert out["gaps"][0]["gap"] >= 0 and isinstance(out["near_tie"], bool)
    sampled = bs.lossless_check(prompt, [ar], [other], bs.ROWS["paper"], [model])
    assert sampled["first_diff"] == 2 and "gaps" not in sampled


@pytest.mark.slow  # runs the benchmark
def test_speed_without_hf_runs_our_methods_only():
    """--no-hf: AR, auto and the paper tree side by side, HF columns left empty."""
    model = tiny_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(4)).tolist()
    res = bs.run_speed(gen, {}, {48: prompt}, ["greedy+penalty"], tokens=12, repeats=1, auto_tree="auto",
                       progress=False)
    (row,) = res["rows"]
    assert {r["method"] for r in res["runs"]} == set(bs.OURS) | {bs.PAIRED}
    assert row["ratios"]["tokenswift-auto/ours-ar"] > 0 and row["lossless"]["tokenswift-auto"]["identical"]
    table = report.markdown_table({"conditions": {"new_tokens": 12, "threads": 1, "model": "tiny"}, **res})
    assert table.count("\n| 48 |") == 1


@pytest.mark.slow  # runs the benchmark
def test_paired_runs_advance_ar_and_auto_in_turn_and_the_paper_tree_can_be_left_out():
    """--no-paper: AR and auto (separately and paired) only; the paired run's streams give AR's tokens and a ratio."""
    model = tiny_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(5)).tolist()
    res = bs.run_speed(gen, {}, {48: prompt}, ["greedy", "paper"], tokens=16, repeats=2, progress=False, paper=False)
    assert {r["method"] for r in res["runs"]} == {"ours-ar", "tokenswift-auto", bs.PAIRED}
    for row in res["rows"]:
        paired = [r for r in res["runs"] if r["method"] == bs.PAIRED and r["sampling"] == row["sampling"]]
        assert len(paired) == 2 and all(r["identical"] and r["new_tokens"] == 16 and r["ratio"] > 0 for r in paired)
        assert row["ratios"]["tokenswift-auto/ours-ar (paired)"] == row["medians"][bs.PAIRED]["ratio"]
        assert row["ratios"]["tokenswift-paper/ours-ar"] is None and "tokenswift-paper" not in row["lossless"]
    table = report.markdown_table({"conditions": {"new_tokens": 16, "threads": 1, "model": "tiny"}, **res})
    assert table.count("\n| 48 |") == 2


def test_the_chart_is_written_without_a_browser_and_says_how_to_get_one(tmp_path, monkeypatch):
    """No browser path is assumed: without a Chromium on PATH (or a --browser that is not one), speed.html is
    written, speed.png is skipped, and the line says what to install or pass."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no chromium, chromium-browser or google-chrome
    found, why = report.find_browser()
    assert found is None and "--browser" in why and "apt-get install -y chromium" in why
    missing = tmp_path / "no-such-chromium"
    found, why = report.find_browser(str(missing))
    assert found is None and str(missing) in why
    fake = tmp_path / "chromium"  # an executable of that name on PATH is the one used
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert report.find_browser() == (str(fake), "")

    results = {"conditions": {"new_tokens": 4, "threads": 1, "model": "tiny"}, "rows": []}
    line = report.write_png(report.speed_figure(results), tmp_path, browser=str(missing))
    assert line.startswith("speed.png skipped:") and (tmp_path / "speed.html").exists()
    assert not (tmp_path / "speed.png").exists()
