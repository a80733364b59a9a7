"""The app's public API endpoint `/generate` (gr.api): one method, streamed as JSON, run by the engine process."""
from __future__ import annotations

import json
import threading
import time
from typing import Callable, Iterator

import gradio as gr

from tokenswift import Settings
from tokenswift.memory import peak_mb, resident_mb
from tokenswift.kinds import Method
from tokenswift.tree import AUTO
from tokenswift.serve.detok import IncrementalText
from tokenswift.serve.models import entry_named
from tokenswift.serve.runner import RunRequest
from tokenswift.validate import InvalidRequest, shown, validate_seed, whole_number

from .live import POLL_S, LiveApp

API_DEFAULTS = {"tree": AUTO}  # settings the JSON leaves out that differ from the library's: as on the page and the CLI
UPDATE_PERIOD_S = 0.25  # at most this often a streamed update (each holds only the text that is new)
QUIET_S = 5.0  # while waiting (queue, prefill), an update at least this often: the client shows it still reads


def api_generate(app: LiveApp) -> Callable:
    def generate(prompt: str, max_new_tokens: int = 200, method: str = "tokenswift", settings_json: str = "{}",
                 seed: int = 0, model: str = "", request: gr.Request = None) -> Iterator[str]:
        """Stream a generation. `settings_json` holds tokenswift.Settings fields, e.g.
        {"temperature": 1.0, "min_p": 0.1, "penalty": 1.2}; a field left out takes the library's default, but the
        tree is "auto" as on the page. `model`: a menu entry or a built-in model's name (empty: the bundled
        model). Yields JSON strings: while waiting
        {"queued": runs ahead}; then {"delta": the new text, "new_tokens", "done", "stats"}; the last one
        has done = true and also the whole "text"."""
        settings, n, chosen, name, seed = _checked(app, prompt, max_new_tokens, method, settings_json, seed, model)
        codec = app.codec(name)
        ids = app.prompt_ids(codec, prompt, n, app.limits.max_new_tokens_api)
        settings = app.settings_for(codec, settings)
        session = app.session(request)
        if session.runner is not None and session.runner.alive:
            raise gr.Error("This session already has a generation running: wait for it to end (one at a time per client).")
        app.admit(cost=(codec, len(ids), n, settings, (chosen,)), client=app.client(request))
        runner = app.engine.runner(name, RunRequest(ids, settings, n, seed, methods=(chosen,)), app.limits.request_timeout_s,
                                   app.client(request))
        session.runner = runner.start()
        began = time.monotonic()
        text = IncrementalText(codec.decode)
        new: list[int] = []
        stats: dict = {}
        last_sent, last_ahead = time.monotonic(), -1
        try:
            while True:
                if not app.watched(request, began):
                    return  # nobody reads this stream: the engine's time goes to others (finally: stop)
                steps, finished = runner.poll()
                for step in steps:
                    new.extend(step.token_ids)
                if steps:
                    stats = _stats(chosen, steps[-1], len(new))
                if finished is not None:
                    if finished.error:
                        raise gr.Error(f"The generation failed: {finished.error}")
                    delta = text.add(new[len(text.ids):]) + text.finish()
                    yield json.dumps({"delta": delta, "new_tokens": len(new), "done": True, "stats": stats,
                                      "stopped": finished.stopped or finished.preempted,
                                      "timed_out": finished.timed_out, "preempted": finished.preempted,
                                      "text": codec.decode(new)})
                    return
                now = time.monotonic()
                if not new:
                    ahead = runner.ahead
                    if (ahead != last_ahead and ahead) or now - last_sent >= QUIET_S:
                        last_ahead, last_sent = ahead, now
                        yield json.dumps({"queued": ahead, "new_tokens": 0, "done": False})
                elif now - last_sent >= UPDATE_PERIOD_S and len(new) > len(text.ids):
                    last_sent = now
                    yield json.dumps({"delta": text.add(new[len(text.ids):]), "new_tokens": len(new), "done": False,
                                      "stats": stats})
                time.sleep(POLL_S)
        finally:
            runner.stop()  # a client that disconnects ends its job within one iteration
    return generate


def _checked(app: LiveApp, prompt, max_new_tokens, method, settings_json, seed, model):
    """Every argument checked before anything runs; each refusal is one sentence."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise gr.Error("prompt must be a non-empty string")
    if not isinstance(method, str) or method not in tuple(Method):
        raise gr.Error(f"method must be 'ar' or 'tokenswift'; got {shown(method)}")
    limit = app.limits.max_new_tokens_api
    if isinstance(max_new_tokens, str):  # raw HTTP may send "NaN" or "inf" as text: a number is required
        raise gr.Error(f"max_new_tokens must be a whole number from 1 to {limit:,}; got {shown(max_new_tokens)}")
    try:  # NaN and infinities (raw HTTP carries them as JSON constants) are refused here too
        max_new_tokens = whole_number(max_new_tokens, "max_new_tokens", 1, limit)
        seed = validate_seed(seed)
    except InvalidRequest as exc:
        raise gr.Error(str(exc)) from None
    if not isinstance(settings_json, str) or len(settings_json) > 10_000:
        raise gr.Error("settings_json must be a JSON object of tokenswift.Settings fields (at most 10,000 characters)")
    try:
        data = json.loads(settings_json or "{}")
        if not isinstance(data, dict):
            raise ValueError("settings_json must be a JSON object such as {\"temperature\": 1.0}")
        settings = Settings.from_dict({**API_DEFAULTS, **data})
    except (ValueError, TypeError, RecursionError) as exc:
        raise gr.Error(f"invalid settings: {exc}") from None
    if not isinstance(model, str):
        raise gr.Error(f"model must be a string (empty: the default model); got {shown(model)}")
    name = entry_named(app.codecs.models, model) if model else app.codecs.names()[0]
    return settings, int(max_new_tokens), Method(method), name, int(seed)


def _stats(method: str, step, new_tokens: int) -> dict:
    iterations, compute = step.index + 1, step.elapsed_s
    return {"method": method, "iterations": iterations, "new_tokens": new_tokens,
            "mean_accepted": new_tokens / iterations, "compute_s": compute,
            "tokens_per_s": new_tokens / compute if compute > 0 else 0.0}


def api_health(app: LiveApp) -> Callable:
    def health() -> str:
        """The server's state as JSON: jobs queued or running in the engine (and the limit), the engine's
        process id and compute backend (its CPU kind, kernel variant and what does not serve), resident and peak
        memory of the server and of the engine (MiB), the server's threads."""
        engine_pid = app.engine.pid if app.engine is not None else None
        return json.dumps({
            "pending": app.engine.pending if app.engine is not None else 0, "queue_size": app.limits.queue_size,
            "engine_pid": engine_pid, "server_threads": threading.active_count(),
            "engine_backend": app.engine.backend if app.engine is not None else None,
            "server_rss_mb": _mb(resident_mb, "self"), "server_peak_mb": _mb(peak_mb, "self"),
            "engine_rss_mb": _mb(resident_mb, engine_pid), "engine_peak_mb": _mb(peak_mb, engine_pid),
            "engine_threads": sum(t.name.startswith("tokenswift-engine") for t in threading.enumerate()),
            "sessions": len(app.sessions), "sessions_kept_mb": round(app.kept_bytes() / 2**20, 1),
            "upload_dir_mb": round(app.uploads.used() / 2**20, 1) if app.uploads is not None else None})
    return health


def _mb(measure: Callable[[int | str], float], pid: int | str | None) -> float | None:
    """A memory figure (MiB) of a process, rounded; None when there is no such process (anymore)."""
    try:
        return round(measure(pid), 1) if pid else None
    except OSError:
        return None
