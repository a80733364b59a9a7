"""A process's memory as Linux reports it in /proc: resident, peak and proportional set sizes, and its children.

Read by the app's `/health` (ui/api.py), by `python -m ui.measure` and by `python -m tokenswift.bench memory`.
Kept apart from the benchmarks: serving code reads memory without importing them.
"""
from __future__ import annotations

import os


def _proc_mb(path: str, field: str) -> float:
    """A "Field:  N kB" line of a /proc file, in MiB (nan when absent)."""
    with open(path) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


def resident_mb(pid: int | str = "self") -> float:
    """Resident memory of a process (this one by default), in MiB, from /proc."""
    return _proc_mb(f"/proc/{pid}/status", "VmRSS:")


def peak_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process (this one by default), in MiB, from /proc."""
    return _proc_mb(f"/proc/{pid}/status", "VmHWM:")


def proportional_mb(pid: int | str = "self") -> float:
    """A process's proportional set size (shared pages split among their users), in MiB."""
    return _proc_mb(f"/proc/{pid}/smaps_rollup", "Pss:")


def child_pids(pid: int) -> list[int]:
    """The direct children of a process, from /proc (Linux)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out
