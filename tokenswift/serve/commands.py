"""What the server tells the engine process, and what the engine sends back: typed, picklable messages.

    server -> engine: Load | Start | StepOnce | Forget | Stop | Exit
    engine -> server: (run_id, Step) ... then (run_id, Finished)

Every job (Start, StepOnce) ends with exactly one Finished for its run id, whatever happens.
"""
from __future__ import annotations

from dataclasses import dataclass

from .runner import RunRequest


@dataclass(frozen=True)
class Load:
    """Load a model now (at server start, so the first run does not wait for it)."""

    model: str


@dataclass(frozen=True)
class Start:
    """Run `request` to its end (its methods interleaved), streaming every Step."""

    run_id: int
    model: str
    request: RunRequest
    time_limit_s: float


@dataclass(frozen=True)
class StepOnce:
    """One more TokenSwift iteration of the classroom run held for `session` (a new run when the session
    has none or asks for a different request)."""

    run_id: int
    session: str
    model: str
    request: RunRequest
    time_limit_s: float


@dataclass(frozen=True)
class Forget:
    """Close the classroom run held for `session` (a new Run or a replay replaces what the page shows)."""

    session: str


@dataclass(frozen=True)
class Stop:
    run_id: int


@dataclass(frozen=True)
class Exit:
    pass
