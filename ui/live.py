"""Event handlers of the app: run, stop, step, export, replay. One `LiveApp` per server.

The server holds tokenizers only: every torch call (Run, Step and the API) is a job of the engine process
(tokenswift/serve/engine_process.py). Per-session state (the running job, the trace shown) lives in
`sessions`, keyed by the browser session, and is dropped when the tab closes. Handlers turn every user
mistake into a `gr.Error` message and never let an exception take the server down.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import gradio as gr

from tokenswift import Settings
from tokenswift.builtin import FetchError
from tokenswift.kinds import Method
from tokenswift.serve.client_address import client_address
from tokenswift.serve.cost import engine_seconds
from tokenswift.serve.engine_process import EngineProcess, ProcessRunner
from tokenswift.serve.export import load_trace_file, write_trace_file
from tokenswift.serve.http_guard import StreamWatch, UploadFolder
from tokenswift.serve.limits import PLOT_PERIOD, Limits
from tokenswift.serve.models import Codec, Codecs
from tokenswift.serve.runner import Finished, RunRequest
from tokenswift.serve.trace import RunTrace
from tokenswift.tree import AUTO
from tokenswift.validate import validate_request, validate_settings

from . import render
from .controls import STEP_TREE, RunControls, controls_for, parse_named
from .race import RaceClock, shown_both

TEXT_PERIOD_S = 0.5  # text and stats refresh
# plots refresh (the browser, not the server, is the bottleneck); TOKENSWIFT_PLOT_PERIOD overrides it (app.py)
PLOT_PERIOD_S = PLOT_PERIOD[1]
POLL_S = 0.05
UI_SHARE = 0.04  # rendering may take at most this share of the time: updates slow down as the run grows
STEP_WAIT_S = 5.0  # beyond the request time limit, how long a Step waits for the engine's answer
FETCH_STATUS_S = 1.0  # how often the status says how long a built-in model's fetch has run
CHARS_PER_TOKEN = 20  # a prompt longer than this many characters per allowed token is refused untokenized
SESSION_KEY_CHARS = 64  # longer session ids are kept as a digest (an id is client-chosen text)


@dataclass
class Session:
    runner: ProcessRunner | None = None
    trace: RunTrace | None = None
    model: str = ""
    greedy: bool = True
    step_key: RunRequest | None = None  # the classroom run the engine holds for this session
    seed: int | None = None  # the seed of the run shown (None: a replay of a file that names none)
    hurry: bool = False  # Stop pressed while the race display reveals a finished run: show the rest at once
    revealing: bool = False  # the engine is done and the page still reveals the slower pane at its pace
    lock: threading.Lock = field(default_factory=threading.Lock)

    def kept_bytes(self) -> int:
        return self.trace.approx_bytes() if self.trace is not None else 0


class Unwatched(Exception):
    """The client has read none of its stream for `Limits.unwatched_s`: its job was stopped."""


class NeedsFetch(Exception):
    """A replayed trace names a built-in model this server has not fetched yet (raised before anything waits)."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class Pacer:
    """When the next update of one kind is due: every `period` seconds, stretched so that rendering takes at most
    `share` of the time. The cost is a running mean that leaves out the first render (one-off costs such as
    plotly's first figure), so one slow render never freezes the page for long."""

    def __init__(self, period: float, share: float) -> None:
        self.period, self.share = period, share
        self.cost: float | None = None
        self.renders = 0
        self.next = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next

    def interval(self) -> float:
        return max(self.period, (self.cost or 0.0) / self.share)

    def done(self, now: float, cost: float | None) -> None:
        """An update was sent at `now`; `cost`: the seconds this kind of update took to render (None: it was sent
        as part of a larger one, whose cost is not this kind's)."""
        if cost is not None:
            self.renders += 1
            if self.renders > 1:
                self.cost = cost if self.cost is None else 0.7 * self.cost + 0.3 * cost
        self.next = now + self.interval()


class LiveApp:
    def __init__(self, codecs: Codecs, engine: EngineProcess | None, limits: Limits | None = None,
                 watch: StreamWatch | None = None, uploads: UploadFolder | None = None,
                 plot_period_s: float = PLOT_PERIOD_S, proxies: int = 0) -> None:
        self.codecs = codecs
        self.proxies = proxies  # proxies in front of the server (TOKENSWIFT_TRUSTED_PROXIES)
        self.engine = engine
        self.limits = limits or Limits()
        self.watch = watch  # None: every client counts as watching (no HTTP layer, e.g. in tests)
        self.uploads = uploads
        self.plot_period_s = plot_period_s
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @property
    def handler_slots(self) -> int:
        """Handlers of engine jobs that may run at once: the queue, plus room for the ones that refuse."""
        return self.limits.queue_size + 2

    # ---- sessions ---------------------------------------------------------------------------------------
    @staticmethod
    def key(request: gr.Request | None) -> str:
        """The session's key: its id, or a digest of an id longer than SESSION_KEY_CHARS."""
        key = getattr(request, "session_hash", None) or "anonymous"
        if not isinstance(key, str):
            key = str(key)[:SESSION_KEY_CHARS]
        if len(key) > SESSION_KEY_CHARS:
            key = "long:" + hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()
        return key

    def client(self, request: gr.Request | None) -> str:
        """Whose engine time a job spends: the visitor's address (tokenswift/serve/client_address.py: behind
        `self.proxies` proxies the X-Forwarded-For entry the outermost one appended, else the socket's peer)."""
        headers = getattr(request, "headers", None) or {}
        if hasattr(headers, "getlist"):  # every X-Forwarded-For line, as the join limit reads them
            forwarded = ",".join(headers.getlist("x-forwarded-for"))
        else:
            forwarded = str(headers.get("x-forwarded-for", "")) if hasattr(headers, "get") else ""
        peer = getattr(request, "client", None)
        return client_address(forwarded, str(getattr(peer, "host", "") or ""), self.proxies)

    def session(self, request: gr.Request | None) -> Session:
        key = self.key(request)
        with self._lock:
            session = self.sessions.pop(key, None) or Session()
            self.sessions[key] = session  # most recently used last
            self._evict_idle()
            return session

    def _evict_idle(self) -> None:
        """Clients that never close their session (API scripts, crashed tabs) must not pile up traces: past
        `max_sessions`, or past `sessions_mb` of kept runs, the least recently used sessions without a
        running job are dropped (the newest one, in use now, is kept)."""
        excess = len(self.sessions) - self.limits.max_sessions
        kept = {key: s.kept_bytes() for key, s in self.sessions.items()}
        over = sum(kept.values()) - self.limits.sessions_bytes
        for key in list(self.sessions)[:-1]:
            if excess <= 0 and over <= 0:
                break
            runner = self.sessions[key].runner
            if runner is None or not runner.alive:
                del self.sessions[key]
                excess -= 1
                over -= kept[key]

    def kept_bytes(self) -> int:
        """The server memory the sessions' runs keep (estimated)."""
        with self._lock:
            return sum(s.kept_bytes() for s in self.sessions.values())

    def watched(self, request: gr.Request | None, since: float) -> bool:
        """Whether the client has read its stream lately (within `unwatched_s`, counted from `since`)."""
        if self.watch is None:
            return True
        return self.watch.idle_s(getattr(request, "session_hash", "") or "", since) < self.limits.unwatched_s

    def close_session(self, request: gr.Request) -> None:
        key = self.key(request)
        with self._lock:
            session = self.sessions.pop(key, None)
        if session is not None and session.runner is not None:
            session.runner.stop()
        if self.engine is not None:
            self.engine.forget(key)

    # ---- shared checks ----------------------------------------------------------------------------------
    def _controls(self, values: Mapping[str, Any]) -> RunControls:
        try:
            controls = parse_named(values)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        return controls

    def _checked(self, values: Mapping[str, Any]) -> tuple[RunControls, Codec, list[int]]:
        """The page's controls, checked against this server's limits and the chosen model, and the prompt's ids."""
        controls = self._controls(values)
        codec = self.codec(controls.model)
        prompt_ids = self.prompt_ids(codec, controls.prompt, controls.max_new_tokens, self.limits.max_new_tokens_ui)
        self.settings_for(codec, controls.settings)
        return controls, codec, prompt_ids

    def codec(self, name: str) -> Codec:
        try:
            return self.codecs.get(name)
        except FetchError as exc:
            raise gr.Error(f"The model could not be fetched: {exc}") from None
        except (ValueError, OSError) as exc:  # an unknown model, missing files: its one sentence
            raise gr.Error(str(exc)) from None

    def wait_for_fetch(self, name: str) -> Iterator[dict]:
        """While a built-in model is fetched and converted (first use on this server), status updates saying so.
        Other visitors' runs on other models go on meanwhile: the fetch runs in a process of its own."""
        job = self.codecs.fetching(name)
        if job is None:
            return
        yield {"status": job.message}
        while not job.done.wait(FETCH_STATUS_S):
            yield {"status": job.message}
        if job.error is not None:
            raise gr.Error(f"The model could not be fetched: {job.error}")

    def prompt_ids(self, codec: Codec, prompt: str, max_new_tokens: int, max_new_limit: int) -> list[int]:
        """The prompt's ids, refused with a message when it (with the new tokens) does not fit the limits.
        A character cap comes first, so that megabytes are never tokenized."""
        max_tokens = self.limits.max_prompt_tokens
        if len(prompt) > max_tokens * CHARS_PER_TOKEN:
            raise gr.Error(f"The prompt is {len(prompt):,} characters long; at most {max_tokens * CHARS_PER_TOKEN:,} "
                           f"characters ({max_tokens:,} tokens) are allowed here.")
        try:
            ids = codec.encode(prompt)
            validate_request(len(ids), max_new_tokens, codec.limits, max_new_limit, max_tokens)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        return ids

    def settings_for(self, codec: Codec, settings: Settings) -> Settings:
        """`settings` checked against the model (top_k against its vocabulary, KV sizes against its positions)."""
        try:
            return validate_settings(settings, codec.limits)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None

    def admit(self, session: Session | None = None, cost: tuple[Codec, int, int, Settings, tuple] | None = None,
              client: str = "") -> None:
        """Refuse a job with a clear message when its expected engine time is over the budget, or when the
        engine's queue is full (the session's own running job does not count: a new Run replaces it) and no
        client holds two places more than this one (else the newest waiting job of the client holding most
        gives its place up). cost: (codec, prompt tokens, new tokens, settings, methods) of the request."""
        if self.engine is None:
            raise gr.Error("This server has no engine process.")
        if cost is not None:
            codec, prompt_tokens, new_tokens, settings, methods = cost
            seconds = engine_seconds(prompt_tokens, new_tokens, settings, methods, codec.parameters or 1)
            if seconds > self.limits.max_request_engine_s:
                raise gr.Error(f"This request would take about {seconds / 60:,.0f} minutes of the engine (prompt "
                               f"{prompt_tokens:,} tokens, {new_tokens:,} new, its tree and n-gram rows); at most "
                               f"{self.limits.max_request_engine_s / 60:,.0f} are allowed here: ask for fewer tokens, "
                               f"a narrower tree or fewer n-grams.")
        own = 1 if session is not None and session.runner is not None and session.runner.alive else 0
        if self.engine.pending - own >= self.limits.queue_size and not self.engine.make_room(client):
            raise gr.Error(f"The server is busy: {self.engine.pending} runs are queued or running (at most "
                           f"{self.limits.queue_size}); please try again in a minute.")

    # ---- run -------------------------------------------------------------------------------------------------
    def run(self, values: Mapping[str, Any], request: gr.Request = None) -> Iterator[dict]:
        """Streams both panes as a race (ui/race.py): each shows what its method had made after the same seconds of
        its own compute. The first update clears every view, so nothing from before this Run stays on the page.
        Yields dicts keyed by output name (mapped to components by the layout)."""
        yield from self.wait_for_fetch(self._controls(values).model)
        controls, codec, prompt_ids = self._checked(values)
        session = self.session(request)
        self.admit(session, (codec, len(prompt_ids), controls.max_new_tokens, controls.settings, tuple(Method)),
                   self.client(request))
        if session.runner is not None:
            session.runner.stop()
        self.engine.forget(self.key(request))  # a Step after this Run starts a new classroom run
        trace = RunTrace(prompt_ids, controls.settings.to_dict(), controls.max_new_tokens)
        run_request = RunRequest(prompt_ids, controls.settings, controls.max_new_tokens, controls.seed)
        runner = self.engine.runner(controls.model, run_request, self.limits.request_timeout_s, self.client(request))
        session.runner, session.trace, session.model = runner, trace, controls.model
        session.greedy, session.step_key, session.seed = controls.settings.greedy, None, controls.seed
        session.hurry = False
        runner.start()
        decode, decode_one, greedy = codec.decode, codec.decode_one, session.greedy
        provenance = ("**What you see**: a Run started by this page · "
                      + render.describe_run(trace.settings, trace.max_new_tokens, controls.model))
        clock = RaceClock()
        text, plot = Pacer(TEXT_PERIOD_S, UI_SHARE / 3), Pacer(self.plot_period_s, UI_SHARE)
        started, finished = False, None
        began = time.monotonic()
        try:
            yield {**render.full_update(trace, decode, decode_one, greedy, "Prefilling the prompt…"),
                   **render.cleared_step(), "provenance": provenance}
            while True:
                if session.trace is not trace:
                    return  # a newer Run, Step or replay of this session owns the page now (finally: stop)
                if not self.watched(request, began):
                    return  # nobody reads this stream: the engine's time goes to others (finally: stop)
                if finished is None:
                    steps, finished = runner.poll()
                    for step in steps:
                        trace.add(step)
                    started = started or bool(steps)
                now = time.monotonic()
                session.revealing = finished is not None
                if finished is not None and (session.hurry or not _completed(finished)):
                    clock.finish(trace)  # stopped or failed: show what there is at once
                if finished is not None and clock.caught_up(trace):
                    yield render.full_update(trace, decode, decode_one, greedy, final_status(finished, trace))
                    return
                if not started:
                    ahead = runner.ahead
                    if ahead and text.due(now):
                        text.done(now, None)
                        yield {"status": f"Queued: {ahead} run{'s' if ahead > 1 else ''} ahead of yours (the engine "
                                         "runs one at a time)…"}
                elif plot.due(now) or text.due(now):
                    shown = shown_both(trace, clock.advance(trace, now, ended=finished is not None))
                    status = running_status(trace, shown) if finished is None else reveal_status(trace, shown)
                    if plot.due(now):  # the plots and the speed panel go with the text they describe
                        update = render.full_update(trace, decode, decode_one, greedy, status, shown)
                        plot.done(now, time.monotonic() - now)
                        text.done(now, None)
                    else:
                        update = render.text_update(trace, decode, greedy, status, shown)
                        text.done(now, time.monotonic() - now)
                    yield update
                time.sleep(POLL_S)
        finally:
            session.revealing = False
            runner.stop()  # Stop button, closed tab or an error: the engine ends the job within one iteration

    def stop(self, request: gr.Request = None) -> str:
        session = self.session(request)
        if session.runner is not None and session.runner.alive:
            session.runner.stop()
            return "Stopping after the current iteration…"
        if session.revealing:
            session.hurry = True  # a finished run still being revealed at pace: show the rest now
            return "Showing the rest of the race at once…"
        return "Nothing is running."

    # ---- classroom step mode ----------------------------------------------------------------------------------
    def step_stream(self, values: Mapping[str, Any], request: gr.Request = None) -> Iterator[dict]:
        """The page's Step: the status says it is stepping at once, then the step's views (see `step`)."""
        yield {"status": "Step: running one TokenSwift iteration…"}
        yield self.step(values, request)

    def step(self, values: Mapping[str, Any], request: gr.Request = None) -> dict:
        """One TokenSwift iteration of this session's classroom run, explained. Under tree=auto Step drafts with the
        paper's tree instead (auto may draft nothing in an iteration, which shows nothing) and sets the tree control
        to it, so the controls say what produced the view."""
        changed = {"tree": STEP_TREE} if values.get("tree") == AUTO else {}
        values = {**values, **changed}
        controls, codec, prompt_ids = self._checked(values)
        session = self.session(request)
        step_request = RunRequest(prompt_ids, controls.settings, controls.max_new_tokens, controls.seed)
        with session.lock:
            self.admit(session, client=self.client(request))
            if session.runner is not None:
                session.runner.stop()  # a Step during a Run ends the Run: the page now shows the classroom run
            if session.step_key != step_request or session.trace is None:
                session.trace = RunTrace(prompt_ids, controls.settings.to_dict(), controls.max_new_tokens)
                session.model, session.greedy = controls.model, controls.settings.greedy
                session.step_key, session.seed = step_request, controls.seed
            runner = self.engine.stepper(self.key(request), controls.model, step_request, self.limits.request_timeout_s,
                                         self.client(request))
            session.runner = runner.start()
            began = time.monotonic()
            while not runner.join(min(1.0, self.limits.request_timeout_s)):
                if time.monotonic() - began > self.limits.request_timeout_s + STEP_WAIT_S:
                    runner.stop()
                    raise gr.Error("The engine did not answer in time; try again.")
                if not self.watched(request, began):
                    runner.stop()
                    raise gr.Error("Stopped: this page stopped reading the server's answers.")
            trace = session.trace
            steps, finished = runner.poll()  # the job has ended: its Finished is there
            for step in steps:
                trace.add(step)
            if finished.error:
                session.step_key = None
                raise gr.Error(f"The step failed: {finished.error}")
            if finished.preempted:
                session.step_key = None
                raise gr.Error("The step was stopped because other visitors were waiting for the engine; please try again.")
            if not steps:
                session.step_key = None
                return {"step_caption": "The run reached its token limit: press Step again to start over.",
                        "status": "Step mode: finished.", **changed}
            if steps[-1].done:
                session.step_key = None  # the next Step starts over
        status = f"Step mode: iteration {steps[-1].index} done ({trace.tokenswift.generated:,} tokens)."
        if changed:
            status += (" Step drafts with the paper's tree (1x3x3x3) rather than auto, which may draft nothing in an "
                       "iteration; the tree control now says so.")
        provenance = (f"**What you see**: step mode, iteration {steps[-1].index} of a classroom run (TokenSwift only) · "
                      + render.describe_run(trace.settings, trace.max_new_tokens, controls.model))
        return {**render.step_update(trace, codec.decode, codec.decode_one, status), **changed,
                "provenance": provenance}

    # ---- export and replay ----------------------------------------------------------------------------------
    def export(self, request: gr.Request = None) -> str:
        session = self.session(request)
        if session.trace is None:
            raise gr.Error("Nothing to export yet: run or step first (or the server no longer holds your last run).")
        return write_trace_file(session.trace, self.codec(session.model).decode, session.model, seed=session.seed)

    def replay(self, path: str | None, request: gr.Request = None) -> dict:
        """A saved run, shown as it ran; raises gr.Error (one sentence) on a file that cannot be replayed. A built-in
        model the file names is fetched first if needed, without a word: the page uses `replay_stream`."""
        out: dict = {}
        for update in self.replay_stream(path, request):
            out.update(update)
        return out

    def replay_stream(self, path: str | None, request: gr.Request = None) -> Iterator[dict]:
        """Replay a trace file: every view, and every control set to the settings that produced it, with a status
        that says it is a replay. While a built-in model the file names is fetched (first use on this server), the
        status says so, with the seconds so far."""
        if not path:
            raise gr.Error("Choose a trace file (.json) exported by this app.")
        names = self.codecs.names()

        def shown_model(model: str) -> str:
            return model if model in names else names[0]

        def limits(model: str):
            name = shown_model(model)
            if self.codecs.fetching(name) is not None:
                raise NeedsFetch(name)  # out of load_trace_file, before it waits: the page says what happens
            return self.codec(name).limits

        try:  # size, schema and ranges checked before anything is built; the session is replaced only after
            for _ in range(2):  # at most one fetch
                try:
                    trace, data = load_trace_file(path, max_bytes=self.limits.max_upload_bytes,
                                                  vocab_size=lambda m: limits(m).vocab_size,
                                                  positions=lambda m: limits(m).max_positions,
                                                  max_kept_bytes=self.limits.session_bytes)
                    break
                except NeedsFetch as need:
                    yield from self.wait_for_fetch(need.model)
            else:
                raise gr.Error("The model this trace names could not be made ready; try again in a minute.")
        except gr.Error:
            raise  # already one sentence (gr.Error is a ValueError too)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        finally:  # the upload has served its purpose (it is read once)
            if self.uploads is not None:
                self.uploads.discard(path)
        model = shown_model(data.get("model", ""))
        codec = self.codec(model)
        greedy = float(trace.settings.get("temperature", 0.0)) == 0.0
        seed = data.get("seed")
        controls, notes = controls_for(trace.settings, codec.decode(trace.prompt_ids), trace.max_new_tokens, model, seed)
        status = (f"Replay of a saved run ({trace.tokenswift.generated:,} + {trace.ar.generated:,} tokens): nothing was "
                  "computed now; the speeds are those measured when it ran, and the controls show its settings.")
        if data.get("model", "") != model:
            status += f" The file names a model this server does not list; shown with {model}."
        if notes:
            status += " Not shown by the controls: " + "; ".join(notes) + "."
        if seed is None and not greedy:
            status += " The file does not record its seed."
        update = {**render.full_update(trace, codec.decode, codec.decode_one, greedy, status), **render.cleared_step(),
                  **controls, "provenance": "**What you see**: a replay of a saved run · "
                  + render.describe_run(trace.settings, trace.max_new_tokens, model)}
        session = self.session(request)  # replaced only once the file has loaded and rendered
        if session.runner is not None:
            session.runner.stop()
        self.engine.forget(self.key(request))
        session.trace, session.model, session.greedy, session.step_key = trace, model, greedy, None
        session.seed = seed
        yield update

    def prepare(self, values: Mapping[str, Any], message: str, request: gr.Request = None) -> dict:
        """A lesson's or a case study's first half: set the controls to `values`, stop this session's job and empty
        every view, so that nothing on the page comes from before; `message` goes to the status line."""
        session = self.session(request)
        if session.runner is not None:
            session.runner.stop()
        session.trace, session.step_key = None, None
        if self.engine is not None:
            self.engine.forget(self.key(request))
        return {**render.empty_update(), **values, "status": message,
                "provenance": "**What you see**: nothing yet for these controls."}

    def pick_tree(self, iteration: float | None, request: gr.Request = None) -> Any:
        session = self.session(request)
        if session.trace is None:
            raise gr.Error("No run yet.")
        pick = None if iteration is None or iteration < 0 else int(iteration)
        return render.tree_figure(session.trace.tokenswift, self.codec(session.model).decode_one, pick)


def running_status(trace: RunTrace, shown: dict | None = None) -> str:
    text = (f"Running… TokenSwift {trace.tokenswift.generated:,} and AR {trace.ar.generated:,} of "
            f"{trace.max_new_tokens:,} tokens computed")
    if shown:
        clock = max(s.seconds for s in shown.values())
        text += f"; the panes show each method after {clock:.1f} s of its own compute"
    return text


def reveal_status(trace: RunTrace, shown: dict) -> str:
    """After the engine is done, while the slower pane is revealed at its measured pace."""
    done = [m for m in (trace.tokenswift, trace.ar) if shown[m.method].tokens >= m.generated]
    first = render._name(done[0]) if done else "One method"
    clock = max(s.seconds for s in shown.values())
    return (f"{first} finished first; the other pane follows at its own measured pace ({clock:.1f} s of its "
            "compute so far)…")


def _completed(finished: Finished) -> bool:
    """A run that ended by itself (not stopped, failed, timed out or preempted): its end is revealed at pace."""
    return not (finished.error or finished.preempted or finished.timed_out or finished.stopped)


def final_status(finished: Finished, trace: RunTrace) -> str:
    if finished.error:
        return f"⚠️ The run ended with an error: {finished.error}"
    if finished.preempted:
        return (f"⏱️ Stopped after this visitor's fair share of the engine, as others were waiting, at TokenSwift "
                f"{trace.tokenswift.generated:,} / AR {trace.ar.generated:,} tokens.")
    if finished.timed_out:
        return (f"⏱️ Stopped at the time limit of this server at TokenSwift {trace.tokenswift.generated:,} / AR "
                f"{trace.ar.generated:,} tokens.")
    if finished.stopped:
        return f"Stopped at TokenSwift {trace.tokenswift.generated:,} / AR {trace.ar.generated:,} tokens."
    return f"Done: {trace.tokenswift.generated:,} tokens each."
