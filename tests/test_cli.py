"""`python -m tokenswift generate` on a tiny random model saved by the test."""
import dataclasses
import json
import subprocess
import sys

import pytest

import tokenswift as ts

from conftest import ROOT, save_tiny_checkpoint


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tokenswift", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_generate_json_tokenswift_matches_ar(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m")
    outs = {}
    for method in ("ar", "tokenswift"):
        proc = run_cli("generate", "--model", str(model_dir), "--prompt", "It is a truth", "--max-new-tokens", "60",
                       "--method", method, "--json")
        assert proc.returncode == 0, proc.stderr
        outs[method] = json.loads(proc.stdout)
    assert len(outs["ar"]["token_ids"]) == 60
    assert outs["tokenswift"]["token_ids"] == outs["ar"]["token_ids"]
    assert outs["tokenswift"]["stats"]["iterations"] <= 60


def test_generate_plain_text_with_prompt_file_and_sampling(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("In the beginning", encoding="utf-8")
    proc = run_cli("generate", "--model", str(model_dir), "--prompt-file", str(prompt), "--max-new-tokens", "30",
                   "--temperature", "1.0", "--min-p", "0.1", "--penalty", "1.2", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr


def test_bad_settings_give_a_clear_message(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m", with_heads=False)
    proc = run_cli("generate", "--model", str(model_dir), "--prompt", "x", "--top-p", "1.5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: top_p must be a number greater than 0 and at most 1 (1 turns it off); got 1.5."


def test_a_model_that_is_not_here_is_one_sentence_without_the_network(tmp_path, monkeypatch):
    """A mistyped folder or an id not in the Hub cache: one sentence, nothing downloaded (the Hub client is offline
    here, so any attempt would fail with its own message instead). A cached id resolves to its snapshot."""
    from huggingface_hub import constants

    from tokenswift.builtin import local_model

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for name in ("nonexistent-dir", "./typo-model", str(tmp_path / "missing"), "someone/not-cached"):
        with pytest.raises(ValueError) as info:
            local_model(name)
        assert str(info.value).startswith(f"no model folder at {name!r}, and no Hugging Face model of that name")
        assert "downloads only built-in models" in str(info.value)
    snapshot = tmp_path / "hub" / "models--someone--cached"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("0" * 40)
    save_tiny_checkpoint(snapshot / "snapshots" / ("0" * 40), with_heads=False)
    assert local_model("someone/cached") == str(snapshot / "snapshots" / ("0" * 40))
    assert local_model(str(tmp_path / "hub")) == str(tmp_path / "hub")  # a folder is itself


def test_the_command_line_names_a_missing_model_in_one_line():
    proc = run_cli("generate", "--model", "./typo-model", "--prompt", "x")
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("error: no model folder at './typo-model'") and "\n" not in err


def test_every_setting_is_a_flag_with_the_dataclass_default():
    from tokenswift.__main__ import CLI_DEFAULTS, build_parser

    args = build_parser().parse_args(["generate", "--model", "m", "--prompt", "x"])
    for f in dataclasses.fields(ts.Settings):
        assert getattr(args, f.name) == CLI_DEFAULTS.get(f.name, f.default), f.name


@pytest.mark.slow  # two more CLI processes (the flags themselves: test_every_setting_is_a_flag_...)
def test_new_flags_reach_the_engine_and_old_spellings_still_work(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m")
    common = ["generate", "--model", str(model_dir), "--prompt", "It is a truth", "--max-new-tokens", "40", "--json"]
    ar = run_cli(*common, "--method", "ar")
    fused = run_cli(*common, "--tree", "1x3x3", "--draft", "fused", "--kv-sink", "4", "--kv-recent", "8",
                    "--kv-budget", "64", "--acceptance", "exact", "--no-ngram-reuse", "--no-stop-at-eos")
    assert ar.returncode == 0 and fused.returncode == 0, ar.stderr + fused.stderr
    settings = json.loads(fused.stdout)["settings"]
    assert (settings["draft"], settings["kv_sink"], settings["kv_recent"], settings["ngram_reuse"]) == ("fused", 4, 8, False)
    assert json.loads(fused.stdout)["token_ids"] == json.loads(ar.stdout)["token_ids"]
