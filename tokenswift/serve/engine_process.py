"""The engine process: the one executor of every torch call a server makes (Run, Step, /generate).

Why a process of its own:
- Safety: a request that exhausts memory or crashes a kernel ends this process, never the web server;
  the jobs it held end with a clear message and the next job starts a fresh process.
- Speed: a run's engine thread gives up Python's interpreter lock on every torch op and must win it back;
  in the server's process it would compete with Gradio's streaming threads (measured on 2 cores: AR at
  0.87 of its headless speed). Here the engine shares nothing with the server but the cores.

The server holds a tokenizer only; the engine loads the weights. Messages are in `commands.py`. The
engine runs one job at a time, in order, on its single torch thread; it reads Stop between iterations (and
between prefill chunks) by polling the command pipe, which costs a few microseconds.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
import time
from collections import OrderedDict, deque
from multiprocessing.connection import Connection

from .commands import Exit, Forget, Load, Start, StepOnce, Stop
from ..kinds import Method
from .runner import Finished, RunHandle, RunRequest, interleave

POLL_S = 0.5  # how often the server checks that an idle engine is still alive
NO_LIMIT_S = 365 * 86400.0


class ProcessRunner(RunHandle):
    """One job executed by the engine process: its Step events arrive on `events`, then one Finished."""

    def __init__(self, engine: "EngineProcess", make_command, request: RunRequest) -> None:
        super().__init__(request)
        self.engine = engine
        self.make_command = make_command  # run_id -> the command to send
        self.run_id = 0

    def start(self) -> "ProcessRunner":
        self.engine.submit(self)
        return self

    def stop(self) -> None:
        super().stop()
        if self.run_id and self.alive:
            self.engine.send(Stop(self.run_id))

    @property
    def ahead(self) -> int:
        """Jobs submitted before this one that have not finished (0: this one is running or done)."""
        return self.engine.jobs_ahead(self.run_id)


class EngineProcess:
    """The server's handle on the engine process (started on first use, restarted after a crash)."""

    def __init__(self, models: dict[str, str], warm: str | None = None, step_sessions: int = 4) -> None:
        self._models = dict(models)
        self._warm = warm
        self._step_sessions = step_sessions
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

    def runner(self, model: str, request: RunRequest, time_limit_s: float = NO_LIMIT_S) -> ProcessRunner:
        """A run of `request` (not started: call .start())."""
        return ProcessRunner(self, lambda run_id: Start(run_id, model, request, time_limit_s), request)

    def stepper(self, session: str, model: str, request: RunRequest, time_limit_s: float = NO_LIMIT_S) -> ProcessRunner:
        """One classroom iteration of the run the engine holds for `session` (not started: call .start())."""
        return ProcessRunner(self, lambda run_id: StepOnce(run_id, session, model, request, time_limit_s), request)

    def forget(self, session: str) -> None:
        self.send(Forget(session))

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished (the running one included)."""
        with self._lock:
            return len(self._runs)

    def jobs_ahead(self, run_id: int) -> int:
        with self._lock:
            return sum(1 for other in self._runs if other < run_id)

    def submit(self, runner: ProcessRunner) -> None:
        with self._lock:
            try:
                self._ensure_started()
                runner.run_id = next(self._ids)
                self._runs[runner.run_id] = (runner, self._proc)
                self._commands.send(runner.make_command(runner.run_id))
                if runner.stopped:
                    self._commands.send(Stop(runner.run_id))
            except OSError as exc:  # the process died between the check and the send
                self._runs.pop(runner.run_id, None)
                runner._finish(Finished(f"the engine process is not reachable ({exc}); try again", runner.stopped))

    def send(self, command) -> None:
        """A command without a reply (Stop, Forget); dropped when no engine is running."""
        with self._lock:
            if self._commands is not None:
                try:
                    self._commands.send(command)
                except OSError:
                    pass  # the process is gone: its dispatcher ends its runs

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            proc, commands = self._proc, self._commands
            self._proc = self._commands = None
        if proc is None:
            return
        try:
            commands.send(Exit())
        except OSError:
            pass
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout)

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")  # never fork a process that already runs server threads
        command_out, command_in = ctx.Pipe(duplex=False)
        event_out, event_in = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=engine_main, args=(command_out, event_in, self._models, self._step_sessions),
                           name="tokenswift-engine", daemon=True)
        proc.start()
        command_out.close()  # the child's ends
        event_in.close()
        self._proc, self._commands = proc, command_in
        if self._warm is not None:
            command_in.send(Load(self._warm))
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
def engine_main(commands: Connection, events: Connection, models: dict[str, str], step_sessions: int) -> None:
    from .torch_thread import TORCH  # the child's own single torch thread (torch's threads set there)

    TORCH.call(_serve, commands, events, models, step_sessions)


class _Inbox:
    """The command pipe, read without blocking: queued jobs and the ids of stopped runs."""

    def __init__(self, commands: Connection) -> None:
        self.commands = commands
        self.jobs: deque = deque()
        self.stopped: set[int] = set()

    def pump(self) -> None:
        while self.commands.poll():
            message = self.commands.recv()
            if isinstance(message, Stop):
                self.stopped.add(message.run_id)
            else:
                self.jobs.append(message)

    def next_job(self, timeout: float):
        self.pump()
        if not self.jobs and self.commands.poll(timeout):
            self.pump()
        return self.jobs.popleft() if self.jobs else None


class _StopFlag:
    """Looks like a threading.Event to the engine: set once the server has asked this job to stop, or when
    its time limit has passed (`timed_out` then says so)."""

    def __init__(self, inbox: _Inbox, run_id: int, time_limit_s: float) -> None:
        self.inbox, self.run_id = inbox, run_id
        self.deadline = time.monotonic() + time_limit_s
        self.timed_out = False

    def is_set(self) -> bool:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return True
        self.inbox.pump()
        return self.run_id in self.inbox.stopped


class _CurrentStop:
    """The stop flag of whichever job is advancing a held classroom stream."""

    flag: _StopFlag | None = None

    def is_set(self) -> bool:
        return self.flag is not None and self.flag.is_set()


class _StepSessions:
    """The classroom runs the engine holds open: session -> (request, model, its step stream), at most
    `capacity` of them (the least recently stepped is closed first)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.runs: OrderedDict[str, tuple[RunRequest, str, object]] = OrderedDict()
        self.stop = _CurrentStop()  # every held stream reads the stop flag of the job that advances it

    def stream(self, job: StepOnce, cache, stop: _StopFlag):
        self.stop.flag = stop
        held = self.runs.pop(job.session, None)
        if held is None or held[0] != job.request or held[1] != job.model:
            r = job.request
            stream = cache.get(job.model).stream(r.prompt, r.settings, r.max_new_tokens, method=Method.TOKENSWIFT,
                                                 seed=r.seed, stop=self.stop)
            held = (r, job.model, stream)
        self.runs[job.session] = held
        while len(self.runs) > self.capacity:
            self.runs.popitem(last=False)
        return held[2]

    def forget(self, session: str) -> None:
        self.runs.pop(session, None)


def _serve(commands: Connection, events: Connection, models: dict[str, str], step_sessions: int) -> None:
    from .models import ModelCache

    cache = ModelCache(models)
    inbox = _Inbox(commands)
    steppers = _StepSessions(step_sessions)
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
        if isinstance(job, Exit):
            return
        if isinstance(job, Load):
            try:
                cache.get(job.model)
            except Exception:  # reported when a job asks for it
                pass
            continue
        if isinstance(job, Forget):
            steppers.forget(job.session)
            continue
        stop = _StopFlag(inbox, job.run_id, job.time_limit_s)
        error, exhausted = None, False
        try:
            if isinstance(job, StepOnce):
                step = next(steppers.stream(job, cache, stop), None)
                if step is None or step.done:
                    steppers.forget(job.session)  # the next Step starts over
                    exhausted = step is None and not stop.is_set()
                if step is not None:
                    events.send((job.run_id, step))
            elif not stop.is_set():
                generator = cache.get(job.model)
                for step in interleave(generator, job.request, stop):
                    events.send((job.run_id, step))
        except (BrokenPipeError, EOFError):
            return
        except MemoryError:
            steppers.forget(getattr(job, "session", ""))
            error = "the engine ran out of memory for this request; try fewer tokens or a shorter prompt"
        except Exception as exc:  # reported as a message; the engine keeps serving
            steppers.forget(getattr(job, "session", ""))
            error = f"{type(exc).__name__}: {exc}"
        try:
            events.send((job.run_id, Finished(error, stop.is_set(), stop.timed_out, exhausted)))
        except OSError:
            return
        inbox.stopped.discard(job.run_id)
