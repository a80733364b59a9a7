"""The race display: both panes shown at one clock of compute seconds, so each method progresses at its own speed.

The engine alternates the two methods (one TokenSwift iteration, then AR until it catches up in tokens), so both
streams arrive at about the same token count and two panes filled as they arrive would grow in lockstep. Each
iteration's event carries its method's own compute time since the first iteration (`elapsed_s`). The display
shows, for one clock value c, what each method had produced after c seconds of its own compute: the faster
method's pane leads by exactly its measured advantage.

The clock can only show what is known: a method still running is known up to its latest event, a finished one
for ever. So the clock follows the laggard in compute seconds (the faster method, which needs fewer seconds
for the same tokens) while the run goes on, and once the engine is done it advances in real time, revealing
the slower pane at its measured pace until it too is complete.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from tokenswift.serve.trace import MethodTrace, RunTrace


@dataclass(frozen=True)
class Shown:
    """How much of one method a pane shows: tokens, iterations and the clock (compute seconds)."""

    tokens: int
    iterations: int
    seconds: float


def shown_at(m: MethodTrace, clock: float) -> Shown:
    """What `m` had produced after `clock` seconds of its own compute (iterations whose elapsed_s <= clock)."""
    elapsed = m.events.columns["elapsed_s"]
    k = bisect_right(elapsed, clock)
    if k >= m.iterations:
        return Shown(m.generated, m.iterations, min(clock, m.compute_s) if k else 0.0)
    return Shown(sum(m.per_iteration_accepted[:k]), k, clock)


def known_until(trace: RunTrace, ended: bool) -> float:
    """The furthest clock at which both panes are known: a running method up to its latest event; a finished one
    (or any, once the engine has `ended`) for ever. With both known for ever: the slower one's total."""
    panes = (trace.ar, trace.tokenswift)
    running = [m.compute_s for m in panes if not (ended or m.done)]
    return min(running) if running else max(m.compute_s for m in panes)


class RaceClock:
    """The display clock: never past what is known, and never faster than real time (the reveal at the end)."""

    def __init__(self) -> None:
        self.value = 0.0
        self._wall: float | None = None

    def advance(self, trace: RunTrace, now: float, ended: bool) -> float:
        """The clock at wall time `now` (seconds, monotonic)."""
        limit = known_until(trace, ended)
        step = math.inf if self._wall is None else max(0.0, now - self._wall)
        self.value = max(self.value, min(limit, self.value + step))
        self._wall = now
        return self.value

    def caught_up(self, trace: RunTrace) -> bool:
        """Whether both panes are shown whole (once the engine has ended)."""
        return self.value >= known_until(trace, ended=True)

    def finish(self, trace: RunTrace) -> None:
        """Show everything now (a stopped or failed run is not revealed at pace)."""
        self.value = max(self.value, known_until(trace, ended=True))


def everything(trace: RunTrace) -> dict[str, Shown]:
    """Each pane shown whole (a replay, a Step, the end of a run)."""
    return {m.method: Shown(m.generated, m.iterations, m.compute_s) for m in (trace.ar, trace.tokenswift)}


def shown_both(trace: RunTrace, clock: float) -> dict[str, Shown]:
    return {m.method: shown_at(m, clock) for m in (trace.ar, trace.tokenswift)}
