"""`python -m tokenswift generate` on a tiny random model saved by the test."""
import json
import subprocess
import sys

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
    assert "top_p must be in (0, 1]" in proc.stderr
    assert "Traceback" not in proc.stderr
