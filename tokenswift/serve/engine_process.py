"""The engine process: the one executor of every torch call a server makes (Run, Step, /generate).

Why a process of its own:
- Safety: a request that exhausts memory or crashes a kernel ends this process, never the web server;
  the jobs it held end with a clear message and the next job starts a fresh process.
- Speed: a run's engine thread gives up Python's interpreter lock on every torch op and must win it back;
  in the server's process it would compete with Gradio's streaming threads (measured on 2 cores: AR at
  0.87 of its headless speed). Here the engine shares nothing with the server but the cores.

The server holds a tokenizer only; the engine loads the weights. Messages are in `commands.py`. The
engine runs one job at a time on its single torch thread; it reads Stop between iterations (and between
prefill chunks) by polling the command pipe, which costs a few microseconds.

Engine time is shared between clients (a client: a visitor's address). The server keeps the jobs waiting
and sends the engine one at a time: the next is the waiting job of the client that used the engine least
lately (engine-seconds, decaying with a half-life of `USAGE_HALF_LIFE_S`), in order within a client. A job
that has run `fair_share_s` while a client that has used the engine less waits is stopped
(`Finished.preempted`), so one client's long or costly runs cannot starve the others; alone, a job runs to
its own time limit.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing as mp
import threading
import time
from collections import OrderedDict, deque
from multiprocessing.connection import Connection

from .commands import Exit, Forget, Load, Start, StepOnce, Stop
from ..kinds import Method
from .runner import Finished, RunHandle, RunRequest, interleave

POLL_S = 0.5  # how often the server checks that an idle engine is still alive (and a running job's share)
NO_LIMIT_S = 365 * 86400.0
USAGE_HALF_LIFE_S = 300.0  # a client's engine-seconds count half after this long
USAGE_CLIENTS = 4096  # clients whose usage is remembered (the least active are forgotten first)


class ProcessRunner(RunHandle):
    """One job executed by the engine process: its Step events arrive on `events`, then one Finished."""

    def __init__(self, engine: "EngineProcess", make_command, request: RunRequest, client: str = "") -> None:
        super().__init__(request)
        self.engine = engine
        self.make_command = make_command  # run_id -> the command to send
        self.client = client  # whose engine time it spends (fair sharing)
        self.run_id = 0
        self.started_at: float | None = None  # when the engine was given the job
        self.preempted = False

    def start(self) -> "ProcessRunner":
        self.engine.submit(self)
        return self

    def stop(self) -> None:
        super().stop()
        if self.run_id and self.alive:
            self.engine.stop_run(self)

    @property
    def ahead(self) -> int:
        """Jobs submitted before this one that have not finished (0: this one is running or done)."""
        return self.engine.jobs_ahead(self.run_id)


BACKEND_EVENT = 0  # the run id of the engine's one message about its compute backend (real runs count from 1)


class EngineProcess:
    """The server's handle on the engine process (started on first use, restarted after a crash)."""

    def __init__(self, models: dict[str, str], warm: str | None = None, step_sessions: int = 4,
                 fair_share_s: float = NO_LIMIT_S) -> None:
        self._models = dict(models)
        self._warm = warm
        self._step_sessions = step_sessions
        self.fair_share_s = fair_share_s
        self._lock = threading.Lock()
        self._proc: mp.process.BaseProcess | None = None
        self._commands: Connection | None = None
        self._runs: dict[int, tuple[ProcessRunner, object]] = {}  # run_id -> (runner, the process holding it)
        self._waiting: list[ProcessRunner] = []  # submitted, not yet given to the engine
        self._usage: dict[str, tuple[float, float]] = {}  # client -> (engine-seconds, when last updated)
        self._ids = itertools.count(1)
        self.backend = ""  # the engine's compute backend, as it describes itself once started (tokenswift.backend)

    # ---- the server's side ------------------------------------------------------------------------------
    def start(self) -> "EngineProcess":
        """Start the process now (imports and the warm model load happen while the page is opened)."""
        with self._lock:
            self._ensure_started()
        return self

    def runner(self, model: str, request: RunRequest, time_limit_s: float = NO_LIMIT_S,
               client: str = "") -> ProcessRunner:
        """A run of `request` for `client` (not started: call .start())."""
        return ProcessRunner(self, lambda run_id: Start(run_id, model, request, time_limit_s), request, client)

    def stepper(self, session: str, model: str, request: RunRequest, time_limit_s: float = NO_LIMIT_S,
                client: str = "") -> ProcessRunner:
        """One classroom iteration of the run the engine holds for `session` (not started: call .start())."""
        return ProcessRunner(self, lambda run_id: StepOnce(run_id, session, model, request, time_limit_s), request,
                             client)

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
            return len(self._runs) + len(self._waiting)

    def pending_for(self, client: str) -> int:
        """Jobs of `client` submitted and not finished."""
        with self._lock:
            return sum(r.client == client for r in self._waiting) + sum(r.client == client for r, _ in self._runs.values())

    def jobs_ahead(self, run_id: int) -> int:
        """Jobs that run before this one as things stand (0: it is running or done)."""
        with self._lock:
            mine = next((r for r in self._waiting if r.run_id == run_id), None)
            if mine is None:
                return 0
            now = time.monotonic()
            key = self._priority(mine, now)
            return len(self._runs) + sum(1 for r in self._waiting if self._priority(r, now) < key)

    def usage(self, client: str) -> float:
        """The client's recent engine-seconds (decayed)."""
        with self._lock:
            return self._usage_now(client, time.monotonic())

    def submit(self, runner: ProcessRunner) -> None:
        with self._lock:
            runner.run_id = next(self._ids)
            if runner.stopped:
                runner._finish(Finished(None, True))
                return
            self._waiting.append(runner)
            self._next_job()

    def make_room(self, client: str) -> bool:
        """The queue is full and `client` asks for a place: give it the place of the newest waiting job of the
        client holding the most jobs, when that client holds at least two more than `client`. That job ends
        with a message. Returns whether a place was freed."""
        with self._lock:
            held: dict[str, int] = {}
            for r in [*self._waiting, *(r for r, _ in self._runs.values())]:
                held[r.client] = held.get(r.client, 0) + 1
            heavy = [r for r in self._waiting if held[r.client] >= held.get(client, 0) + 2]
            if not heavy:
                return False
            most = max(held[r.client] for r in heavy)
            victim = max((r for r in heavy if held[r.client] == most), key=lambda r: r.run_id)
            self._waiting.remove(victim)
        victim._finish(Finished("its place in the queue went to a visitor who had none; please try again in a "
                                "minute", True))
        return True

    def stop_run(self, runner: ProcessRunner) -> None:
        """Stop a job: a waiting one ends at once, a running one within an iteration."""
        with self._lock:
            if runner in self._waiting:
                self._waiting.remove(runner)
                runner._finish(Finished(None, True))
                return
        self.send(Stop(runner.run_id))

    # ---- fair sharing (called with the lock held) -------------------------------------------------------
    def _usage_now(self, client: str, now: float) -> float:
        used, at = self._usage.get(client, (0.0, now))
        return used * math.exp2(-(now - at) / USAGE_HALF_LIFE_S)

    def _charge(self, runner: ProcessRunner) -> None:
        if runner.started_at is None:
            return
        now = time.monotonic()
        self._usage[runner.client] = (self._usage_now(runner.client, now) + now - runner.started_at, now)
        if len(self._usage) > USAGE_CLIENTS:  # forget the least active half
            ranked = sorted(self._usage, key=lambda c: self._usage_now(c, now))
            for client in ranked[: len(ranked) // 2]:
                del self._usage[client]

    def _priority(self, runner: ProcessRunner, now: float) -> tuple[float, int]:
        return self._usage_now(runner.client, now), runner.run_id

    def _next_job(self) -> None:
        """Give the engine the next waiting job when it has none."""
        while self._waiting and not self._runs:
            now = time.monotonic()
            runner = min(self._waiting, key=lambda r: self._priority(r, now))
            self._waiting.remove(runner)
            try:
                self._ensure_started()
                self._runs[runner.run_id] = (runner, self._proc)
                runner.started_at = time.monotonic()
                self._commands.send(runner.make_command(runner.run_id))
            except OSError as exc:  # the process died between the check and the send
                self._runs.pop(runner.run_id, None)
                runner._finish(Finished(f"the engine process is not reachable ({exc}); try again", runner.stopped))

    def _share_check(self) -> None:
        """Stop the running job once it has had its fair share while a job of another client waits that
        has used the engine less (counting the running job's time so far)."""
        with self._lock:
            now = time.monotonic()
            for runner, _ in self._runs.values():
                if runner.preempted or runner.started_at is None:
                    continue
                running = now - runner.started_at
                if running < self.fair_share_s:
                    continue
                used = self._usage_now(runner.client, now) + running
                if any(w.client != runner.client and self._usage_now(w.client, now) < used for w in self._waiting):
                    runner.preempted = True
                    try:
                        self._commands.send(Stop(runner.run_id))
                    except (OSError, AttributeError):
                        pass  # the process is gone: its dispatcher ends its runs

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
            self._share_check()
            try:
                if not events.poll(POLL_S):
                    if proc.is_alive():
                        continue
                    raise EOFError
                run_id, event = events.recv()
            except (EOFError, OSError):
                break
            if run_id == BACKEND_EVENT:
                self.backend = event
                continue
            with self._lock:
                entry = self._runs.get(run_id)
                if entry is not None and isinstance(event, Finished):
                    del self._runs[run_id]
                    self._charge(entry[0])
                    self._next_job()
            if entry is None:
                continue
            runner = entry[0]
            if isinstance(event, Finished):
                if runner.preempted and not runner.stopped and event.error is None:
                    event = dataclasses.replace(event, preempted=True)
                runner._finish(event)
            else:
                runner.events.put(event)
        events.close()
        proc.join(timeout=2)
        with self._lock:
            orphans = [r for r, p in self._runs.values() if p is proc]
            for r in orphans:
                del self._runs[r.run_id]
                self._charge(r)
            if self._proc is proc:
                self._proc = self._commands = None
        for r in orphans:
            r._finish(Finished(f"the engine process ended unexpectedly (exit code {proc.exitcode}); "
                               "the next run starts a new one", r.stopped))
        with self._lock:
            if self._waiting and self._proc is None:
                self._next_job()  # a new engine for the jobs that were waiting


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

    from ..backend import current

    events.send((BACKEND_EVENT, current().describe()))  # builds or loads the kernels once, before the first job
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
