"""Event handlers of the app: run, stop, step, export, replay. One `LiveApp` per server.

Per-session objects (the running worker, the classroom step session) live in `sessions`, keyed by the
browser session; they are dropped when the tab closes. Handlers turn every user mistake into a
`gr.Error` message and never let an exception take the server down.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import gradio as gr

from . import render
from .controls import RunControls, parse_controls
from tokenswift.serve.export import load_trace_file, write_trace_file
from tokenswift.serve.models import ModelCache
from tokenswift.serve.engine_process import EngineProcess
from tokenswift.serve.runner import Finished, RunHandle, Runner, RunRequest
from tokenswift.serve.torch_thread import TORCH
from tokenswift.serve.trace import RunTrace

TEXT_PERIOD_S = 0.5  # text and stats refresh
# plots refresh (the browser, not the server, is the bottleneck); TOKENSWIFT_PLOT_PERIOD overrides it
PLOT_PERIOD_S = float(os.environ.get("TOKENSWIFT_PLOT_PERIOD", "1.5"))
POLL_S = 0.05
MAX_SESSIONS = 32  # sessions whose last run (trace, step state) the server keeps for export and replay
UI_SHARE = 0.04  # rendering may take at most this share of the time: updates slow down as the run grows


@dataclass
class Session:
    runner: RunHandle | None = None
    trace: RunTrace | None = None
    model: str = ""
    greedy: bool = True
    step_stream: Iterator | None = None
    step_key: tuple | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class LiveApp:
    """`engine`: the process that executes runs (see tokenswift/serve/engine_process.py); None runs them on this
    process's torch thread."""

    def __init__(self, models: ModelCache, engine: EngineProcess | None = None) -> None:
        self.models = models
        self.engine = engine
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    # ---- sessions ---------------------------------------------------------------------------------------
    def session(self, request: gr.Request | None) -> Session:
        key = getattr(request, "session_hash", None) or "anonymous"
        with self._lock:
            session = self.sessions.pop(key, None) or Session()
            self.sessions[key] = session  # most recently used last
            self._evict_idle()
            return session

    def _evict_idle(self) -> None:
        """Clients that never close their session (API scripts, crashed tabs) must not pile up traces: past
        MAX_SESSIONS, the least recently used sessions without a running run are dropped."""
        excess = len(self.sessions) - MAX_SESSIONS
        for key in list(self.sessions):
            if excess <= 0:
                break
            runner = self.sessions[key].runner
            if runner is None or not runner.alive:
                del self.sessions[key]
                excess -= 1

    def close_session(self, request: gr.Request) -> None:
        key = getattr(request, "session_hash", None) or "anonymous"
        with self._lock:
            session = self.sessions.pop(key, None)
        if session is not None and session.runner is not None:
            session.runner.stop()

    def _controls(self, values: tuple) -> RunControls:
        try:
            return parse_controls(*values)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None

    def _generator(self, name: str):
        try:
            return self.models.get(name)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None

    # ---- run -------------------------------------------------------------------------------------------------
    def run(self, *values, request: gr.Request = None) -> Iterator[dict]:
        """Streams both panes. Yields dicts keyed by output name (mapped to components by the layout)."""
        controls = self._controls(values)
        gen = self._generator(controls.model)
        try:
            prompt_ids = gen.encode(controls.prompt)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        session = self.session(request)
        if session.runner is not None:
            session.runner.stop()
        trace = RunTrace(prompt_ids, controls.settings.to_dict(), controls.max_new_tokens)
        request = RunRequest(prompt_ids, controls.settings, controls.max_new_tokens, controls.seed)
        if self.engine is not None:
            runner = self.engine.runner(controls.model, request)
        else:
            runner = Runner(gen, request, executor=TORCH)
        session.runner, session.trace, session.model = runner, trace, controls.model
        session.greedy = controls.settings.greedy
        runner.start()
        decode, decode_one = gen.decode, _one(gen)
        next_text = next_plot = 0.0
        try:
            yield {"status": "Prefilling the prompt…"}
            while True:
                finished = None
                for event in runner.drain():
                    if isinstance(event, Finished):
                        finished = event
                    else:
                        trace.add(event)
                now = time.monotonic()
                if finished is not None:
                    yield render.full_update(trace, decode, decode_one, session.greedy, _final_status(finished, trace))
                    return
                # Pace the updates by their own cost, so that rendering never takes more than UI_SHARE of the
                # time (with TOKENSWIFT_ENGINE_PROCESS=0 it shares the interpreter with the engine thread).
                if now >= next_plot:
                    update = render.full_update(trace, decode, decode_one, session.greedy, _running_status(trace))
                    cost = time.monotonic() - now
                    next_plot = now + max(PLOT_PERIOD_S, cost / UI_SHARE)
                    next_text = now + max(TEXT_PERIOD_S, cost / UI_SHARE / 3)
                    yield update
                elif now >= next_text:
                    update = render.text_update(trace, decode, session.greedy, _running_status(trace))
                    next_text = now + max(TEXT_PERIOD_S, (time.monotonic() - now) / UI_SHARE)
                    yield update
                time.sleep(POLL_S)
        finally:
            runner.stop()  # Stop button, closed tab or an error: the worker ends within one iteration

    def stop(self, request: gr.Request = None) -> str:
        session = self.session(request)
        if session.runner is not None and session.runner.alive:
            session.runner.stop()
            return "Stopping after the current iteration…"
        return "Nothing is running."

    # ---- classroom step mode ----------------------------------------------------------------------------------
    def step(self, *values, request: gr.Request = None) -> dict:
        controls = self._controls(values)
        gen = self._generator(controls.model)
        session = self.session(request)
        key = (controls.prompt, controls.model, controls.seed, tuple(sorted(controls.settings.to_dict().items())))
        with session.lock:
            if session.step_stream is None or session.step_key != key:
                try:
                    prompt_ids = gen.encode(controls.prompt)
                except ValueError as exc:
                    raise gr.Error(str(exc)) from None
                session.step_stream = gen.stream(prompt_ids, controls.settings, controls.max_new_tokens,
                                                 method="tokenswift", seed=controls.seed)
                session.step_key = key
                session.trace = RunTrace(prompt_ids, controls.settings.to_dict(), controls.max_new_tokens)
                session.model, session.greedy = controls.model, controls.settings.greedy
            step = TORCH.call(next, session.step_stream, None)
            if step is None:
                session.step_stream = None
                return {"step_caption": "The run reached its token limit: press Step again to start over.",
                        "status": "Step mode: finished."}
            trace = session.trace
            trace.add(step)
        return render.step_update(trace, gen.decode, _one(gen), session.greedy,
                                  f"Step mode: iteration {step.index} done ({trace.tokenswift.generated:,} tokens).")

    # ---- export and replay ----------------------------------------------------------------------------------
    def export(self, request: gr.Request = None) -> str:
        session = self.session(request)
        if session.trace is None:
            raise gr.Error("Nothing to export yet: run or step first.")
        gen = self._generator(session.model)
        return write_trace_file(session.trace, gen.decode, session.model)

    def replay(self, path: str | None, request: gr.Request = None) -> dict:
        if not path:
            raise gr.Error("Choose a trace file (.json) exported by this app.")
        try:
            trace, data = load_trace_file(path)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        model = data.get("model", "")
        gen = self.models.get(model) if model in self.models.models else self.models.get(self.models.names()[0])
        greedy = float(trace.settings.get("temperature", 0.0)) == 0.0
        session = self.session(request)
        session.trace, session.model, session.greedy = trace, model if model in self.models.models else self.models.names()[0], greedy
        return render.full_update(trace, gen.decode, _one(gen), greedy,
                                 f"Replaying a saved run ({trace.tokenswift.generated:,} + {trace.ar.generated:,} tokens).")

    def pick_tree(self, iteration: float | None, request: gr.Request = None) -> Any:
        session = self.session(request)
        if session.trace is None:
            raise gr.Error("No run yet.")
        gen = self._generator(session.model)
        pick = None if iteration is None or iteration < 0 else int(iteration)
        return render.tree_figure(session.trace.tokenswift, _one(gen), pick)


def _one(gen):
    def decode_one(token: int) -> str:
        return gen.decode([token])

    return decode_one


def _running_status(trace: RunTrace) -> str:
    return (f"Running… TokenSwift {trace.tokenswift.generated:,} and AR {trace.ar.generated:,} of "
            f"{trace.max_new_tokens:,} tokens")


def _final_status(finished: Finished, trace: RunTrace) -> str:
    if finished.error:
        return f"⚠️ The run ended with an error: {finished.error}"
    if finished.stopped:
        return f"Stopped at TokenSwift {trace.tokenswift.generated:,} / AR {trace.ar.generated:,} tokens."
    return f"Done: {trace.tokenswift.generated:,} tokens each."
