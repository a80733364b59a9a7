"""The session runner: AR and TokenSwift alternately in one background worker, fed by step events.

The two methods run in the same thread, one iteration at a time (TokenSwift one iteration, then AR until
it has caught up in tokens), so neither steals CPU from the other while it is being timed; each
method's speed is its own tokens over its own compute time (the engine's step timings). The UI reads
events from a queue at its own pace; `stop()` ends the worker within one iteration.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator

from tokenswift import Generator, Settings, Step


@dataclass(frozen=True)
class RunRequest:
    prompt: str | list[int]
    settings: Settings
    max_new_tokens: int
    seed: int = 0
    methods: tuple[str, ...] = ("ar", "tokenswift")


@dataclass(frozen=True)
class Finished:
    """The worker's last event: why it ended (None: completed or stopped) and whether it was stopped."""

    error: str | None
    stopped: bool


class Runner:
    def __init__(self, generator: Generator, request: RunRequest, max_queued: int = 0) -> None:
        self.generator = generator
        self.request = request
        self.events: queue.Queue[Step | Finished] = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="tokenswift-runner", daemon=True)

    def start(self) -> "Runner":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _work(self) -> None:
        error = None
        try:
            for step in interleave(self.generator, self.request, self._stop):
                self.events.put(step)
        except Exception as exc:  # reported to the UI as a message; the server keeps running
            error = f"{type(exc).__name__}: {exc}"
        self.events.put(Finished(error, self._stop.is_set()))

    def drain(self, limit: int = 10_000) -> list[Step | Finished]:
        """Every event queued so far (without waiting)."""
        out: list[Step | Finished] = []
        while len(out) < limit:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                break
        return out


def interleave(gen: Generator, req: RunRequest, stop: threading.Event) -> Iterator[Step]:
    """Advance the methods alternately: the leader one iteration, then each other method until it has
    produced at least as many tokens. Stops when all are done or `stop` is set."""
    streams = {m: gen.stream(req.prompt, req.settings, req.max_new_tokens, method=m, seed=req.seed, stop=stop)
               for m in req.methods}
    produced = {m: 0 for m in req.methods}
    live = list(req.methods)
    leader = "tokenswift" if "tokenswift" in live else live[0]
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
