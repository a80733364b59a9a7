"""Limits for serving the app to the public (a Hugging Face Space, a classroom), read from the environment.

The defaults are safe for a 2-vCPU machine with 16 GB: one engine process runs one job at a time, so a
long queue only means long waits, and every bound below keeps one request from taking the machine.
`LIMITS` lists each limit with its variable, default, meaning and the largest value it accepts; the
README's table is written from it. Budgets are in bytes and in engine-seconds, not in counts.
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
    top: float  # the largest value accepted (beyond it a typo or a joke, e.g. 1e300 seconds, would overflow)


DAY_S = 86_400.0

LIMITS = (
    Limit("max_new_tokens_ui", "TOKENSWIFT_MAX_NEW_TOKENS", "new tokens per run in the page (each pane)", 200_000),
    Limit("max_new_tokens_api", "TOKENSWIFT_API_MAX_NEW_TOKENS", "new tokens per call of the /generate API", 200_000),
    Limit("max_prompt_tokens", "TOKENSWIFT_MAX_PROMPT_TOKENS",
          "prompt tokens (also bounded by the model: prompt + new tokens <= its maximum positions)", 200_000),
    Limit("queue_size", "TOKENSWIFT_QUEUE_SIZE",
          "runs admitted at once, the running one included (the engine runs one at a time); beyond it a request "
          "is refused with a 'busy' message", 1_000),
    Limit("request_timeout_s", "TOKENSWIFT_REQUEST_TIMEOUT_S",
          "seconds a run or API call may take in the engine, prefill included; then it stops", DAY_S),
    Limit("max_request_engine_s", "TOKENSWIFT_MAX_REQUEST_ENGINE_S",
          "estimated engine-seconds a request may cost to finish (prompt, new tokens, rows verified per "
          "iteration); a costlier one is refused at admission", 30 * DAY_S),
    Limit("fair_share_s", "TOKENSWIFT_FAIR_SHARE_S",
          "engine-seconds a job may run while another client's job waits; then it is stopped and the engine "
          "goes to the client that used it least lately", DAY_S),
    Limit("unwatched_s", "TOKENSWIFT_UNWATCHED_S",
          "seconds a run or API call goes on while its client reads none of its stream; then it stops", DAY_S),
    Limit("max_upload_mb", "TOKENSWIFT_MAX_UPLOAD_MB", "size of a trace file uploaded for replay (MB)", 1_024),
    Limit("upload_dir_mb", "TOKENSWIFT_UPLOAD_DIR_MB",
          "disk the upload folder may use (MB); uploads are deleted once replayed, the oldest first beyond it",
          100_000),
    Limit("max_sessions", "TOKENSWIFT_MAX_SESSIONS",
          "browser or API sessions whose last run the server keeps for export and replay", 1_000_000),
    Limit("session_mb", "TOKENSWIFT_SESSION_MB",
          "server memory one session's run may keep (MB); a larger replay is refused", 100_000),
    Limit("sessions_mb", "TOKENSWIFT_SESSIONS_MB",
          "server memory all sessions' runs may keep (MB); beyond it the least recently used are dropped", 1_000_000),
    Limit("step_sessions", "TOKENSWIFT_STEP_SESSIONS",
          "classroom Step runs the engine keeps open at once (each holds a KV cache; the least recently "
          "stepped is closed first)", 1_000),
)

# Display settings (not limits): variable -> (default, smallest, largest).
PLOT_PERIOD = ("TOKENSWIFT_PLOT_PERIOD", 1.5, 0.1, 3600.0)


@dataclass(frozen=True)
class Limits:
    max_new_tokens_ui: int = 20_000
    max_new_tokens_api: int = 2_000
    max_prompt_tokens: int = 8_192
    queue_size: int = 4
    request_timeout_s: float = 900.0
    max_request_engine_s: float = 7_200.0
    fair_share_s: float = 30.0
    unwatched_s: float = 30.0
    max_upload_mb: float = 5.0
    upload_dir_mb: float = 100.0
    max_sessions: int = 256
    session_mb: float = 24.0
    sessions_mb: float = 512.0
    step_sessions: int = 4

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Limits":
        """The defaults, overridden by each variable that is set. A malformed or out-of-range value stops the
        server at start with a message that names the variable (a typo must not silently lift a limit)."""
        env = os.environ if env is None else env
        values = {}
        types = {f.name: f.type for f in fields(cls)}
        for limit in LIMITS:
            raw = env.get(limit.variable, "").strip()
            if raw:
                values[limit.field] = _parse(raw, limit.variable, types[limit.field] in (float, "float"), limit.top)
        limits = cls(**values)
        if limits.max_upload_bytes < 1024:
            raise ValueError(f"TOKENSWIFT_MAX_UPLOAD_MB must allow at least 1 KiB (0.001 MB); got "
                             f"{env.get('TOKENSWIFT_MAX_UPLOAD_MB')!r}")
        if limits.upload_dir_mb < limits.max_upload_mb:
            raise ValueError(f"TOKENSWIFT_UPLOAD_DIR_MB ({limits.upload_dir_mb:g}) must be at least "
                             f"TOKENSWIFT_MAX_UPLOAD_MB ({limits.max_upload_mb:g})")
        return limits

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)

    @property
    def upload_dir_bytes(self) -> int:
        return int(self.upload_dir_mb * 2**20)

    @property
    def session_bytes(self) -> int:
        return int(self.session_mb * 2**20)

    @property
    def sessions_bytes(self) -> int:
        return int(self.sessions_mb * 2**20)


def _parse(raw: str, variable: str, fractional: bool, top: float) -> int | float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > top or (not fractional and value != int(value)):
        kind = "a positive number" if fractional else "a positive whole number"
        raise ValueError(f"{variable} must be {kind} of at most {top:,g}; got {raw[:40]!r}")
    return value if fractional else int(value)


def env_number(spec: tuple[str, float, float, float], env: Mapping[str, str] | None = None) -> float:
    """A display setting from the environment: (variable, default, smallest, largest); a malformed value is a
    ValueError naming the variable (the server stops at start with it)."""
    variable, default, low, high = spec
    raw = (os.environ if env is None else env).get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{variable} must be a number of seconds from {low:g} to {high:g}; got {raw[:40]!r}")
    return value


def table() -> str:
    """The limits as a markdown table (for the README): variable, default, meaning."""
    defaults = Limits()
    rows = ["| variable | default | what it bounds |", "|---|---|---|"]
    for limit in LIMITS:
        value = getattr(defaults, limit.field)
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        rows.append(f"| `{limit.variable}` | {shown} | {limit.meaning} |")
    return "\n".join(rows)
