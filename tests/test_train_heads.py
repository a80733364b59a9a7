"""`python -m tokenswift train-heads` on a tiny random model: loss falls, checkpoint resumes, outputs load."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tokenswift as ts

from conftest import ROOT, SAMPLE_TEXT, save_tiny_checkpoint


def run(*args):
    return subprocess.run([sys.executable, "-m", "tokenswift", "train-heads", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two training runs in subprocesses
def test_train_heads_learns_resumes_and_saves_official_layout(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m", with_heads=False)
    text = tmp_path / "book.txt"
    text.write_text((SAMPLE_TEXT.replace(". ", ".\n")) * 10, encoding="utf-8")
    common = ["--model", str(model_dir), "--text-file", str(text), "--out", str(tmp_path / "run"),
              "--context", "32", "--batch-size", "4", "--eval-every", "20", "--val-windows", "4", "--warmup", "5",
              "--lr", "1e-2", "--bf16", "false", "--distill", "0.5"]
    first = run(*common, "--steps", "20")
    assert first.returncode == 0, first.stderr
    second = run(*common, "--steps", "60", "--save-model", str(tmp_path / "with-heads"))
    assert second.returncode == 0, second.stderr
    assert "resumed" in second.stdout and "at step 20" in second.stdout
    log = [json.loads(line) for line in (tmp_path / "run" / "heads_log.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in log if r["kind"] == "train"]
    assert [r["step"] for r in log if r["kind"] == "train"] == list(range(1, 61))
    assert sum(train[-10:]) / 10 < sum(train[:10]) / 10 - 0.5  # it learns the repetitive text
    val = [r for r in log if r["kind"] == "val"]
    assert val and len(val[-1]["accuracy"]) == 3
    gen = ts.Generator.from_pretrained(tmp_path / "with-heads")
    assert gen.heads is not None and gen.heads.num_heads == 3
    out = gen.generate("It is a truth", ts.Settings(), 40)
    assert out.token_ids == gen.generate("It is a truth", ts.Settings(), 40, method="ar").token_ids


@pytest.mark.slow  # a training run in a subprocess
def test_train_heads_stops_at_its_time_budget_after_a_final_validation(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m", with_heads=False)
    text = tmp_path / "book.txt"
    text.write_text((SAMPLE_TEXT.replace(". ", ".\n")) * 10, encoding="utf-8")
    proc = run("--model", str(model_dir), "--text-file", str(text), "--out", str(tmp_path / "run"), "--context", "32",
               "--batch-size", "2", "--steps", "100000", "--minutes", "0.1", "--eval-every", "1000", "--val-windows", "2",
               "--warmup", "1", "--bf16", "false")
    assert proc.returncode == 0, proc.stderr
    assert "time budget reached" in proc.stdout
    log = [json.loads(line) for line in (tmp_path / "run" / "heads_log.jsonl").read_text().splitlines()]
    assert log[-1]["kind"] == "val" and log[-2]["kind"] == "train"
    train = [r for r in log if r["kind"] == "train"]
    assert len(train) > 3 and train[-1]["lr"] < 0.5 * train[1]["lr"]  # the schedule follows the time budget down
    assert (tmp_path / "run" / "heads.safetensors").exists()


class _RunsCodeWhenUnpickled:
    """What a hostile checkpoint holds: unpickling it calls Path.write_text."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_resume_state_refuses_pickled_code_and_never_runs_it(tmp_path):
    from tokenswift.train.checkpoint import load_state

    marker = tmp_path / "marker.txt"
    path = tmp_path / "heads_checkpoint.pt"
    torch.save({"step": 3, "payload": _RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(ValueError, match="not loaded"):
        load_state(path)
    assert not marker.exists()


def test_lm_checkpoint_loads_with_weights_only_and_restores_every_rng(tmp_path):
    import random

    import numpy as np

    from tokenswift.train.lm import RunState, TrainSettings, WindowSampler, load_checkpoint, save_checkpoint

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    streams = {"austen": torch.arange(100), "kjv": torch.arange(100, 200)}
    sampler = WindowSampler(streams, context=8, austen_weight=0.5, seed=0)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, opt, sampler, RunState(step=7), TrainSettings())
    torch.load(path, weights_only=True)  # plain tensors and values only
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)), sampler.sample(2))
    restored = WindowSampler(streams, context=8, austen_weight=0.5, seed=1)
    state = load_checkpoint(path, model, opt, restored, TrainSettings())
    assert state.step == 7
    got = (random.random(), float(np.random.rand()), float(torch.rand(1)), restored.sample(2))
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])
