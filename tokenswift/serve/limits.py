"""Limits for serving the app to the public (a Hugging Face Space, a classroom), read from the environment.

The defaults are safe for a 2-vCPU machine with 16 GB: one engine process runs one job at a time, so a
long queue only means long waits, and every bound below keeps one request from taking the machine.
`LIMITS` lists each limit with its variable, default and meaning; the README's table is written from it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Mapping


@dataclass(frozen=True)
class Limit:
    field: str
    variable: str
    meaning: str


LIMITS = (
    Limit("max_new_tokens_ui", "TOKENSWIFT_MAX_NEW_TOKENS", "new tokens per run in the page (each pane)"),
    Limit("max_new_tokens_api", "TOKENSWIFT_API_MAX_NEW_TOKENS", "new tokens per call of the /generate API"),
    Limit("max_prompt_tokens", "TOKENSWIFT_MAX_PROMPT_TOKENS",
          "prompt tokens (also bounded by the model: prompt + new tokens <= its maximum positions)"),
    Limit("queue_size", "TOKENSWIFT_QUEUE_SIZE",
          "runs admitted at once, the running one included (the engine runs one at a time, in order); "
          "beyond it a request is refused with a 'busy' message"),
    Limit("request_timeout_s", "TOKENSWIFT_REQUEST_TIMEOUT_S",
          "seconds a run or API call may take in the engine, prefill included; then it stops"),
    Limit("max_upload_mb", "TOKENSWIFT_MAX_UPLOAD_MB", "size of a trace file uploaded for replay (MB)"),
    Limit("max_sessions", "TOKENSWIFT_MAX_SESSIONS",
          "browser or API sessions whose last run the server keeps for export and replay"),
    Limit("step_sessions", "TOKENSWIFT_STEP_SESSIONS",
          "classroom Step runs the engine keeps open at once (each holds a KV cache; the least recently "
          "stepped is closed first)"),
)


@dataclass(frozen=True)
class Limits:
    max_new_tokens_ui: int = 20_000
    max_new_tokens_api: int = 2_000
    max_prompt_tokens: int = 8_192
    queue_size: int = 4
    request_timeout_s: float = 900.0
    max_upload_mb: float = 5.0
    max_sessions: int = 256
    step_sessions: int = 4

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Limits":
        """The defaults, overridden by each variable that is set. A malformed value stops the server at start
        with a message that names the variable (a typo must not silently lift a limit)."""
        env = os.environ if env is None else env
        values = {}
        types = {f.name: f.type for f in fields(cls)}
        for limit in LIMITS:
            raw = env.get(limit.variable, "").strip()
            if raw:
                values[limit.field] = _parse(raw, limit.variable, types[limit.field] in (float, "float"))
        return cls(**values)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)


def _parse(raw: str, variable: str, fractional: bool) -> int | float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or (not fractional and value != int(value)):
        kind = "a positive number" if fractional else "a positive whole number"
        raise ValueError(f"{variable} must be {kind}; got {raw!r}")
    return value if fractional else int(value)


def table() -> str:
    """The limits as a markdown table (for the README): variable, default, meaning."""
    defaults = Limits()
    rows = ["| variable | default | what it bounds |", "|---|---|---|"]
    for limit in LIMITS:
        value = getattr(defaults, limit.field)
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        rows.append(f"| `{limit.variable}` | {shown} | {limit.meaning} |")
    return "\n".join(rows)
