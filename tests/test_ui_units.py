"""UI pieces without a browser: control validation, export/replay round trip, step captions, text."""
import json

import pytest

import tokenswift as ts
from ui.controls import UI_DEFAULTS, default_controls, parse_controls, CONTROL_ORDER
from tokenswift.serve.export import load_trace_file, trace_to_json, write_trace_file
from ui.render import summary
from ui.step_view import step_explanation
from tokenswift.serve.runner import RunRequest, interleave
from ui.text import segments
from tokenswift.serve.trace import RunTrace

from conftest import random_heads, tiny_model


def controls(**changes):
    values = {**UI_DEFAULTS, **changes}
    return ["a prompt", *(values[k] for k in CONTROL_ORDER), "model"]


@pytest.mark.parametrize("changes,message", [
    (dict(max_new=0), "Max new tokens"), (dict(max_new=1.5), "whole number"), (dict(top_p=0.0), "top_p"),
    (dict(kv_budget=8), "kv_budget"), (dict(tree="7x"), "tree"), (dict(greedy=False, temperature=0.0), "Temperature 0 is greedy"),
    (dict(window="lots"), "Penalty window must be a number"),
])
def test_bad_controls_give_readable_messages(changes, message):
    with pytest.raises(ValueError, match=message):
        parse_controls(*controls(**changes))


def test_empty_prompt_is_refused():
    args = controls()
    args[0] = "   "
    with pytest.raises(ValueError, match="prompt"):
        parse_controls(*args)


def test_defaults_parse():
    c = default_controls("Hello", "m", max_new=42)
    assert c.max_new_tokens == 42 and c.settings.min_p == UI_DEFAULTS["min_p"]


def finished_trace(tokens=60):
    model = tiny_model("llama-gqa", seed=3)
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = list(range(5, 40))
    trace = RunTrace(prompt, ts.Settings().to_dict(), tokens)
    import threading

    for step in interleave(gen, RunRequest(prompt, ts.Settings(kv_budget=32, kv_sink=4), tokens), threading.Event()):
        trace.add(step)
    return gen, trace


def test_export_and_replay_round_trip(tmp_path):
    gen, trace = finished_trace()
    path = write_trace_file(trace, gen.decode, "tiny", directory=tmp_path)
    loaded, data = load_trace_file(path, vocab_size=256)
    assert data["model"] == "tiny" and data["readable"]["identical_prefix"] == 60
    assert loaded.tokenswift.token_ids == trace.tokenswift.token_ids and loaded.ar.token_ids == trace.ar.token_ids
    assert loaded.tokenswift.length_hist == trace.tokenswift.length_hist
    assert len(data["methods"]["tokenswift"]["per_iteration"]["accepted"]) == trace.tokenswift.iterations
    assert sum(data["methods"]["tokenswift"]["per_iteration"]["accepted"]) == 60
    assert [n.token for n in loaded.tokenswift.trees[-1][1]] == [n.token for n in trace.tokenswift.trees[-1][1]]
    assert json.loads(json.dumps(trace_to_json(loaded, gen.decode, "tiny")))["readable"]["methods"]["ar"]["text"] == \
        gen.decode(trace.ar.token_ids)


@pytest.mark.parametrize("content,message", [("not json", "not valid JSON"), ('{"format": "other"}', "not a TokenSwift"),
                                             ('{"format": "tokenswift-live-trace/1"}', "old format")])
def test_bad_trace_files_are_refused_clearly(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_trace_file(path)


def test_step_explanation_names_each_verdict():
    gen, trace = finished_trace(20)
    caption, rows = step_explanation(trace.tokenswift, lambda t: gen.decode([t]))
    assert "Draft" in caption and "Verify" in caption and "KV update" in caption
    verdicts = [r[7] for r in rows]
    assert verdicts[0] == "start"
    assert any(v in ("✓ accepted", "✗ rejected") for v in verdicts[1:])
    assert "identical to AR: 20 of 20" in summary(trace, greedy=True)


def test_live_text_window_hides_old_tokens_with_a_note():
    segs = segments(list(range(100)), [None] * 100, lambda ids: "x" * len(ids), window=10)
    assert segs[0][0].startswith("[… 90 earlier tokens") and segs[1] == ("x" * 10, None)


def test_pane_stats_before_any_token():
    from ui.render import pane_stats
    from tokenswift.serve.trace import MethodTrace

    assert pane_stats(MethodTrace("ar"), 500) == "**AR** · 0 / 500 tokens · no tokens yet"


def test_sessions_that_never_close_do_not_pile_up():
    from types import SimpleNamespace

    from tokenswift.serve.limits import Limits
    from tokenswift.serve.models import Codecs
    from ui.live import LiveApp

    cap = 8
    app = LiveApp(Codecs({}), None, Limits(max_sessions=cap))
    first = app.session(SimpleNamespace(session_hash="s0"))
    for i in range(1, cap + 10):
        app.session(SimpleNamespace(session_hash=f"s{i}"))
    assert len(app.sessions) == cap and "s0" not in app.sessions
    assert app.session(SimpleNamespace(session_hash="s0")) is not first  # a fresh one
    busy = app.session(SimpleNamespace(session_hash="busy"))
    busy.runner = SimpleNamespace(alive=True)
    for i in range(100, 100 + 2 * cap):
        app.session(SimpleNamespace(session_hash=f"s{i}"))
    assert app.sessions["busy"] is busy  # a running session is never dropped


def test_iteration_breakdown_splits_plain_and_drafted_iterations():
    from types import SimpleNamespace as NS

    from tokenswift.events import Timings
    from ui.measure import iteration_breakdown

    def step(nodes, tokens, draft, verify, book):
        return NS(draft_nodes=nodes, tokens=[0] * tokens, timings=Timings(draft, verify, book))

    steps = [step(0, 1, 0.0, 0.004, 0.0)] * 3 + [step(2, 2, 0.001, 0.004, 0.001), step(4, 1, 0.001, 0.006, 0.001)]
    out = iteration_breakdown(steps, ar_step_s=0.004)
    assert out["plain"] == {"share": 0.6, "nodes": 0.0, "tokens": 1.0, "draft_steps": 0.0, "verify_steps": 1.0,
                            "bookkeeping_steps": 0.0, "total_steps": 1.0, "tokens_per_step": 1.0}
    drafted = out["drafted"]
    assert drafted["share"] == 0.4 and drafted["nodes"] == 3.0 and drafted["tokens"] == 1.5
    assert drafted["draft_steps"] == 0.25 and drafted["verify_steps"] == 1.25 and drafted["total_steps"] == 1.75
    assert drafted["tokens_per_step"] == round(1.5 / 1.75, 3)
    assert iteration_breakdown(steps[:3], 0.004).keys() == {"plain"}


def test_the_page_opens_on_a_fetched_real_model_else_on_the_bundled_one(monkeypatch):
    import tokenswift.builtin as builtin
    from ui.controls import PAGE_MODEL_ENV, page_model

    models = {"bundled": "/models/bundled", "SmolLM2": "smollm2-135m", "mine": "/models/mine"}
    monkeypatch.delenv(PAGE_MODEL_ENV, raising=False)
    monkeypatch.setattr(builtin, "is_fetched", lambda name: False)
    assert page_model(models) == "bundled"  # nothing to fetch before the page can run: it works offline
    monkeypatch.setattr(builtin, "is_fetched", lambda name: name == "smollm2-135m")
    assert page_model(models) == "SmolLM2"
    monkeypatch.setenv(PAGE_MODEL_ENV, "mine")
    assert page_model(models) == "mine"
    monkeypatch.setenv(PAGE_MODEL_ENV, "not in the menu")
    assert page_model(models) == "SmolLM2"
    monkeypatch.setattr(builtin, "is_fetched", lambda name: False)
    monkeypatch.setenv(PAGE_MODEL_ENV, "smollm2-135m")  # a built-in model's name means its menu entry
    assert page_model(models) == "SmolLM2"


def test_the_api_drafts_as_the_page_does_and_takes_built_in_names():
    """/generate's settings JSON leaves the tree to "auto" (the page's and the CLI's, not the library's paper tree),
    and its model may be a menu entry or a built-in model's name; an empty one is the bundled model."""
    from types import SimpleNamespace

    from tokenswift.tree import AUTO
    from ui.api import _checked

    models = {"bundled": "/models/bundled", "SmolLM2 (fetched on first use)": "smollm2-135m"}
    app = SimpleNamespace(limits=SimpleNamespace(max_new_tokens_api=100),
                          codecs=SimpleNamespace(models=models, names=lambda: list(models)))
    settings, n, method, name, seed = _checked(app, "Hello", 10, "tokenswift", "{}", 0, "")
    assert settings.tree == AUTO and name == "bundled" and n == 10
    settings, *_, name, _ = _checked(app, "Hello", 10, "tokenswift", '{"tree": "1x3x3x3"}', 0, "smollm2-135m")
    assert settings.tree == "1x3x3x3" and name == "SmolLM2 (fetched on first use)"
    # a path, even an entry's, is no entry's name: it passes unchanged, and loading it is refused
    from tokenswift.serve.models import _check_name

    for path in ("/models/bundled", "/models/mine"):
        assert _checked(app, "Hello", 10, "ar", "{}", 0, path)[3] == path
        with pytest.raises(ValueError, match="unknown model"):
            _check_name(models, path)
