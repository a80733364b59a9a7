"""One execution path: the page's Run and Step, and the API, are all jobs of the engine process. The web
server never loads weights, survives the engine's death during each kind of job, and starts every Step
after a Run or a replay from a fresh classroom run. Handlers are driven here as Gradio calls them."""
import os
import signal
import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest

import tokenswift as ts
from tokenswift.memory import resident_mb
from tokenswift.serve.engine_process import EngineProcess
from tokenswift.serve.limits import Limits
from tokenswift.serve.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME, Codecs
from tokenswift.serve.runner import RunRequest
from ui.app_server import AppServer
from ui.controls import UI_DEFAULTS
from ui.live import LiveApp

pytestmark = [pytest.mark.slow,  # a live server or engine process: the full suite only
              pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").exists(), reason="the default model is not built")]

MODELS = {DEFAULT_MODEL_NAME: str(DEFAULT_MODEL_DIR)}
PROMPT = "It is a truth universally acknowledged, that"


@pytest.fixture(scope="module")
def app():
    engine = EngineProcess(MODELS, warm=DEFAULT_MODEL_NAME).start()
    live = LiveApp(Codecs(MODELS), engine, Limits(request_timeout_s=120))
    yield live
    engine.close()


def values(prompt=PROMPT, **changes):
    """The controls as the page sends them: by name."""
    return {**UI_DEFAULTS, "greedy": True, **changes, "prompt": prompt, "model": DEFAULT_MODEL_NAME}


def who(name):
    return SimpleNamespace(session_hash=name)


def run_until(app, request, stop_after=None, **changes):
    """Drive the Run handler as Gradio does; with stop_after, press Stop once that many tokens are shown."""
    last = None
    for update in app.run(values(**changes), request=request):
        last = {**(last or {}), **update}
        session = app.sessions[request.session_hash]
        if stop_after is not None and session.trace.tokenswift.generated >= stop_after:
            app.stop(request=request)
            stop_after = None
    return last


def test_step_after_a_run_starts_a_new_classroom_run(app):
    me = who("step-after-run")
    run_until(app, me, max_new=40)
    ran = app.sessions["step-after-run"].trace
    assert ran.ar.generated == 40 and ran.tokenswift.generated == 40
    app.step(values(max_new=40), request=me)
    trace = app.sessions["step-after-run"].trace
    assert trace is not ran and trace.ar.generated == 0  # not appended to the Run's panes
    assert trace.tokenswift.iterations == 1
    app.step(values(max_new=40), request=me)
    assert trace.tokenswift.iterations == 2  # the same classroom run goes on


def test_a_bad_replay_file_leaves_the_session_as_it_was(app, tmp_path):
    me = who("bad-replay")
    run_until(app, me, max_new=20)
    before = app.sessions["bad-replay"].trace
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "tokenswift-live-trace/2", "methods": {"ar": {"tokens": {"ids": [-1]}}}}')
    with pytest.raises(gr.Error):
        app.replay(str(bad), request=me)
    assert app.sessions["bad-replay"].trace is before


def test_the_engine_dies_during_a_run_and_the_next_run_works(app):
    me = who("kill-run")
    killed = []

    def kill_when_running():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            session = app.sessions.get("kill-run")
            if session is not None and session.trace is not None and session.trace.tokenswift.generated > 20:
                killed.append(app.engine.pid)
                os.kill(app.engine.pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    threading.Thread(target=kill_when_running, daemon=True).start()
    last = run_until(app, me, max_new=5000)
    assert killed and "ended unexpectedly" in last["status"]
    last = run_until(app, me, max_new=20)
    assert last["status"].startswith("Done") and app.engine.pid not in (None, killed[0])


def test_the_engine_dies_during_a_step_and_the_next_step_works(app):
    me = who("kill-step")
    long_prompt = "Emma was very happy, and Mr. Knightley was not. " * 150  # a prefill of about a second
    killer = threading.Timer(0.3, lambda: os.kill(app.engine.pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(gr.Error, match="ended unexpectedly"):
        app.step(values(long_prompt, max_new=40), request=me)
    out = app.step(values(max_new=40), request=me)
    assert "iteration 0" in out["status"]


def test_twenty_stopped_runs_leave_no_thread_process_or_memory_behind(app):
    me = who("stops")
    run_until(app, me, max_new=30)  # warm
    threads, memory, engine = threading.active_count(), resident_mb(), app.engine.pid
    engine_memory = resident_mb(engine)
    for i in range(20):
        last = run_until(app, me, stop_after=10 + i, max_new=5000)
        assert last["status"].startswith("Stopped")
    assert app.engine.pending == 0 and app.engine.pid == engine
    report = (f"20 stopped runs: server threads {threads} -> {threading.active_count()}, server "
              f"{memory:.0f} -> {resident_mb():.0f} MiB, engine {engine_memory:.0f} -> {resident_mb(engine):.0f} MiB")
    print("\n" + report)
    assert threading.active_count() <= threads
    assert resident_mb() <= 1.10 * memory and resident_mb(engine) <= 1.10 * engine_memory


def test_the_time_limit_and_stop_both_end_a_long_prefill(app):
    long_ids = [(i * 7) % 200 + 10 for i in range(6000)]
    request = RunRequest(long_ids, ts.Settings(), 100)
    timed = app.engine.runner(DEFAULT_MODEL_NAME, request, time_limit_s=0.2).start()
    assert timed.join(60)
    events = timed.drain()
    assert events[-1].timed_out and len(events) == 1  # ended inside the prefill: no step at all
    stopped = app.engine.runner(DEFAULT_MODEL_NAME, request).start()
    time.sleep(0.2)
    stopped.stop()
    assert stopped.join(60)
    events = stopped.drain()
    assert events[-1].stopped and not events[-1].timed_out and len(events) == 1


def test_the_web_server_never_loads_weights():
    srv = AppServer()
    srv.wait_ready()
    try:
        from gradio_client import Client
        import json

        client = Client(srv.url, verbose=False)
        assert json.loads(client.predict("Emma", 10, "tokenswift", "{}", 0, "", api_name="/generate"))["new_tokens"] == 10
        engine = json.loads(client.predict(api_name="/health"))["engine_pid"]

        def mapped(pid):
            with open(f"/proc/{pid}/maps") as f:
                return ".safetensors" in f.read()

        assert mapped(engine)  # the engine memory-maps the weights...
        assert not mapped(srv.proc.pid)  # ...the server never opened them
    finally:
        srv.close()
