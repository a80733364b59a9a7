"""The engine in a process of its own: the app's runs execute there, the web server stays here.

Why a process: a run's engine thread gives up Python's interpreter lock on every torch op and must win
it back; in the server's process it competes for that lock with Gradio's streaming threads. Measured on
2 cores before this module (2,000 tokens, 1 engine thread, headless Chromium on the same machine), AR
ran at 0.87 of its headless speed with the UI streaming. In its own process the engine shares nothing
with the server but the cores.

Protocol (two one-way pipes):
    commands, server -> engine: ("load", model) | ("run", run_id, model, RunRequest) | ("stop", run_id) | ("exit",)
    events,   engine -> server: (run_id, Step) ... then (run_id, Finished)

The engine runs one job at a time, in order, on its single torch thread. A stop reaches it between
iterations (it polls the command pipe, a few microseconds). If the engine process dies, every run it
held ends with a clear error and the next run starts a fresh process: the server never goes down with it.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
from collections import deque
from multiprocessing.connection import Connection

from .runner import Finished, RunHandle, RunRequest, interleave

POLL_S = 0.5  # how often the server checks that an idle engine is still alive


class ProcessRunner(RunHandle):
    """A run executed by the engine process; the same interface as `Runner`."""

    def __init__(self, engine: "EngineProcess", model: str, request: RunRequest) -> None:
        super().__init__(request)
        self.engine = engine
        self.model = model
        self.run_id = 0

    def start(self) -> "ProcessRunner":
        self.engine.submit(self)
        return self

    def stop(self) -> None:
        super().stop()
        if self.run_id and self.alive:
            self.engine.send_stop(self.run_id)


class EngineProcess:
    """The server's handle on the engine process (started on first use, restarted after a crash)."""

    def __init__(self, models: dict[str, str], warm: str | None = None) -> None:
        self._models = dict(models)
        self._warm = warm
        self._lock = threading.Lock()
        self._proc: mp.process.BaseProcess | None = None
        self._commands: Connection | None = None
        self._runs: dict[int, tuple[ProcessRunner, object]] = {}  # run_id -> (runner, the process holding it)
        self._ids = itertools.count(1)

    # ---- the server's side ------------------------------------------------------------------------------
    def start(self) -> "EngineProcess":
        """Start the process now (imports and the warm model load happen while the page is opened)."""
        with self._lock:
            self._ensure_started()
        return self

    def runner(self, model: str, request: RunRequest) -> ProcessRunner:
        return ProcessRunner(self, model, request)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    def submit(self, runner: ProcessRunner) -> None:
        with self._lock:
            try:
                self._ensure_started()
                runner.run_id = next(self._ids)
                self._runs[runner.run_id] = (runner, self._proc)
                self._commands.send(("run", runner.run_id, runner.model, runner.request))
                if runner.stopped:
                    self._commands.send(("stop", runner.run_id))
            except OSError as exc:  # the process died between the check and the send
                self._runs.pop(runner.run_id, None)
                runner._finish(Finished(f"the engine process is not reachable ({exc}); try again", runner.stopped))

    def send_stop(self, run_id: int) -> None:
        with self._lock:
            if self._commands is not None and run_id in self._runs:
                try:
                    self._commands.send(("stop", run_id))
                except OSError:
                    pass  # the process is gone: its dispatcher ends the run

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            proc, commands = self._proc, self._commands
            self._proc = self._commands = None
        if proc is None:
            return
        try:
            commands.send(("exit",))
        except OSError:
            pass
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout)

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")  # never fork a process that already runs torch and server threads
        command_out, command_in = ctx.Pipe(duplex=False)
        event_out, event_in = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=engine_main, args=(command_out, event_in, self._models), name="tokenswift-engine",
                           daemon=True)
        proc.start()
        command_out.close()  # the child's ends
        event_in.close()
        self._proc, self._commands = proc, command_in
        if self._warm is not None:
            command_in.send(("load", self._warm))
        threading.Thread(target=self._dispatch, args=(proc, event_out), name="tokenswift-engine-events",
                         daemon=True).start()

    def _dispatch(self, proc, events: Connection) -> None:
        """Route the process's events to their runners until it ends."""
        while True:
            try:
                if not events.poll(POLL_S):
                    if proc.is_alive():
                        continue
                    raise EOFError
                run_id, event = events.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                entry = self._runs.get(run_id)
                if entry is not None and isinstance(event, Finished):
                    del self._runs[run_id]
            if entry is None:
                continue
            runner = entry[0]
            if isinstance(event, Finished):
                runner._finish(event)
            else:
                runner.events.put(event)
        events.close()
        proc.join(timeout=2)
        with self._lock:
            orphans = [r for r, p in self._runs.values() if p is proc]
            for r in orphans:
                del self._runs[r.run_id]
            if self._proc is proc:
                self._proc = self._commands = None
        for r in orphans:
            r._finish(Finished(f"the engine process ended unexpectedly (exit code {proc.exitcode}); "
                               "the next run starts a new one", r.stopped))


# ---- the engine's side (runs in the child process) --------------------------------------------------------
def engine_main(commands: Connection, events: Connection, models: dict[str, str]) -> None:
    from .torch_thread import TORCH  # the child's own single torch thread (torch's threads set there)

    TORCH.call(_serve, commands, events, models)


class _Inbox:
    """The command pipe, read without blocking: queued jobs and the ids of stopped runs."""

    def __init__(self, commands: Connection) -> None:
        self.commands = commands
        self.jobs: deque[tuple] = deque()
        self.stopped: set[int] = set()

    def pump(self) -> None:
        while self.commands.poll():
            message = self.commands.recv()
            if message[0] == "stop":
                self.stopped.add(message[1])
            else:
                self.jobs.append(message)

    def next_job(self, timeout: float) -> tuple | None:
        self.pump()
        if not self.jobs and self.commands.poll(timeout):
            self.pump()
        return self.jobs.popleft() if self.jobs else None


class _StopFlag:
    """Looks like a threading.Event to the engine: set once the server has asked this run to stop."""

    def __init__(self, inbox: _Inbox, run_id: int) -> None:
        self.inbox, self.run_id = inbox, run_id

    def is_set(self) -> bool:
        self.inbox.pump()
        return self.run_id in self.inbox.stopped


def _serve(commands: Connection, events: Connection, models: dict[str, str]) -> None:
    from .models import ModelCache

    cache = ModelCache(models)
    inbox = _Inbox(commands)
    parent = mp.parent_process()
    while True:
        try:
            job = inbox.next_job(POLL_S)
        except (EOFError, OSError):
            return  # the server is gone
        if job is None:
            if parent is not None and not parent.is_alive():
                return
            continue
        kind = job[0]
        if kind == "exit":
            return
        if kind == "load":
            try:
                cache.get(job[1])
            except Exception:  # reported when a run asks for it
                pass
            continue
        _, run_id, model, request = job
        stop = _StopFlag(inbox, run_id)
        error = None
        try:
            if not stop.is_set():
                generator = cache.get(model)
                for step in interleave(generator, request, stop):
                    events.send((run_id, step))
        except (BrokenPipeError, EOFError):
            return
        except Exception as exc:  # reported to the UI as a message; the engine keeps serving
            error = f"{type(exc).__name__}: {exc}"
        try:
            events.send((run_id, Finished(error, stop.is_set())))
        except OSError:
            return
        inbox.stopped.discard(run_id)
