"""A run: AR and TokenSwift alternately in one job of the engine, reported as step events.

The two methods run on the same thread, one iteration at a time (TokenSwift one iteration, then AR until
it has caught up in tokens), so neither steals CPU from the other while it is being timed; each
method's speed is its own tokens over its own compute time (the engine's step timings). The server reads
a job's events from a queue at its own pace; `stop()` ends the job within one iteration.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator

from tokenswift import Generator, Settings, Step
from tokenswift.kinds import Method


@dataclass(frozen=True)
class RunRequest:
    prompt: str | list[int]
    settings: Settings
    max_new_tokens: int
    seed: int = 0
    methods: tuple[str, ...] = tuple(Method)


@dataclass(frozen=True)
class Finished:
    """A job's last event: why it ended (error None: completed or stopped) and whether it was stopped.
    timed_out: stopped by the request time limit; exhausted: a classroom Step found its run at its end;
    preempted: stopped after its fair share of the engine because another client was waiting."""

    error: str | None
    stopped: bool
    timed_out: bool = False
    exhausted: bool = False
    preempted: bool = False


class RunHandle:
    """What a server holds for one job: a queue of its events, stop, and whether it has ended (the engine
    process's `ProcessRunner` fills it)."""

    def __init__(self, request: RunRequest, max_queued: int = 0) -> None:
        self.request = request
        self.events: queue.Queue[Step | Finished] = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._done = threading.Event()

    def start(self) -> "RunHandle":
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def alive(self) -> bool:
        """True until the run has ended (a run queued behind another job counts as alive)."""
        return not self._done.is_set()

    def _finish(self, event: Finished) -> None:
        self.events.put(event)
        self._done.set()

    def drain(self, limit: int = 10_000) -> list[Step | Finished]:
        """Every event queued so far (without waiting)."""
        out: list[Step | Finished] = []
        while len(out) < limit:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                break
        return out

    def poll(self) -> tuple[list[Step], Finished | None]:
        """The steps queued so far, and the job's Finished event once it has arrived (without waiting)."""
        events = self.drain()
        if events and isinstance(events[-1], Finished):
            return events[:-1], events[-1]
        return events, None


def interleave(gen: Generator, req: RunRequest, stop: threading.Event, detail: bool = True) -> Iterator[Step]:
    """Advance the methods alternately: the leader one iteration, then each other method until it has
    produced at least as many tokens. Stops when all are done or `stop` is set. detail=False: steps without
    per-node trees (`Generator.stream`), for consumers that draw none."""
    streams = {m: gen.stream(req.prompt, req.settings, req.max_new_tokens, method=m, seed=req.seed, stop=stop,
                             detail=detail)
               for m in req.methods}
    produced = {m: 0 for m in req.methods}
    live = list(req.methods)
    leader = Method.TOKENSWIFT if Method.TOKENSWIFT in live else live[0]
    while live and not stop.is_set():
        order = [leader] + [m for m in live if m != leader] if leader in live else list(live)
        target = None
        for method in order:
            while not stop.is_set():
                step = next(streams[method], None)
                if step is None:
                    live.remove(method)
                    break
                produced[method] = step.generated
                yield step
                if step.done:
                    live.remove(method)
                    break
                if target is None or produced[method] >= target:
                    break
            if target is None:
                target = produced[method]
