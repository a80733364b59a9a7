"""The operator's model and thread settings: where they cannot serve, the server stops before it starts, in one line
naming the variable (as it does for its limits)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenswift.serve.models import DEFAULT_MODEL_NAME, allowlist, check_allowlist
from tokenswift.serve.torch_thread import engine_threads
from ui.controls import check_page_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env,message", [
    ({"TOKENSWIFT_DEFAULT_MODEL": "/nonexistent"}, "TOKENSWIFT_DEFAULT_MODEL: no model folder"),
    ({"TOKENSWIFT_MODELS": "mine=/nonexistent"}, "TOKENSWIFT_MODELS: no model folder (one with a config.json) at"),
    ({"TOKENSWIFT_MODELS": "a=smollm2-135m;bad"}, "TOKENSWIFT_MODELS: 'bad' is not name=folder"),
    ({"TOKENSWIFT_MODELS": "=assets/default-model"}, "is not name=folder"),
])
def test_model_settings_that_cannot_serve_are_refused_by_name(env, message, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as refused:
        check_allowlist()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_model_settings_that_serve_pass(monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_MODELS", f"again={ROOT / 'assets' / 'default-model'};;s=smollm2-135m; ")
    check_allowlist()  # a built-in name needs no folder yet (fetched on first use); an empty item is skipped
    assert allowlist()["again"].endswith("default-model")


def test_an_unknown_page_model_is_refused_and_a_built_in_name_is_taken(monkeypatch):
    models = allowlist()
    monkeypatch.setenv("TOKENSWIFT_PAGE_MODEL", "no such entry")
    with pytest.raises(ValueError, match=r"TOKENSWIFT_PAGE_MODEL='no such entry' is not in the model menu"):
        check_page_model(models)
    for good in ("smollm2-135m", DEFAULT_MODEL_NAME, "", " "):
        monkeypatch.setenv("TOKENSWIFT_PAGE_MODEL", good)
        check_page_model(models)


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_malformed_thread_count_is_refused_when_checked(value, monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_TORCH_THREADS", value)
    with pytest.raises(ValueError, match="TOKENSWIFT_TORCH_THREADS must be a whole number"):
        engine_threads(strict=True)
    assert engine_threads() >= 1  # unchecked (the module's own thread at import): the default
    monkeypatch.setenv("TOKENSWIFT_TORCH_THREADS", "3")
    assert engine_threads(strict=True) == 3


def test_a_missing_default_model_stops_the_app_at_start_with_one_line():
    env = {**os.environ, "TOKENSWIFT_DEFAULT_MODEL": "/nonexistent", "GRADIO_SERVER_PORT": "1"}
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: TOKENSWIFT_DEFAULT_MODEL: no model folder (one with a config.json) at "
                                   "/nonexistent")
