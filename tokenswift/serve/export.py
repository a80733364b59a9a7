"""Export a run (both texts and the per-iteration trace) as JSON, and load one back for replay."""
from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from tokenswift.events import TreeNode

from .trace import MethodTrace, RunTrace, Series

FORMAT = "tokenswift-live-trace/1"


def _series_dict(series: Series) -> dict[str, list[float]]:
    return series.to_dict()


def _method_dict(m: MethodTrace, decode: Callable[[list[int]], str]) -> dict[str, Any]:
    return {
        "method": m.method, "text": decode(m.token_ids), "token_ids": m.token_ids, "sources": m.sources,
        "iterations": m.iterations, "compute_s": m.compute_s, "prefill_s": m.prefill_s,
        "tokens_per_s": m.tokens_per_s, "mean_accepted": m.mean_accepted, "source_totals": m.source_totals,
        "length_hist": {str(k): v for k, v in m.length_hist.items()},
        "per_iteration": {"accepted": list(m.per_iteration_accepted), "draft_nodes": list(m.per_iteration_nodes),
                          "ms_draft_verify_bookkeeping": [round(x, 4) for x in m.per_iteration_ms]},
        "series": {name: _series_dict(getattr(m, name)) for name in
                   ("accepted", "cache_len", "cache_mb", "partial_sink", "partial_selected", "partial_recent")},
        "refresh_at": m.refresh_at, "held_runs": m.held_runs, "partial_budget": m.partial_budget,
        "partial_mode": m.partial_mode, "cache_length": m.cache_length, "done": m.done,
        "trees": [{"iteration": it, "nodes": [asdict(n) for n in nodes], "accepted_tokens": acc}
                  for it, nodes, acc in m.trees],
    }


def trace_to_json(trace: RunTrace, decode: Callable[[list[int]], str], model: str) -> dict[str, Any]:
    return {"format": FORMAT, "model": model, "prompt_ids": trace.prompt_ids, "prompt": decode(trace.prompt_ids),
            "settings": trace.settings, "max_new_tokens": trace.max_new_tokens, "speedup": trace.speedup,
            "identical_prefix": trace.identical_prefix(),
            "ar": _method_dict(trace.ar, decode), "tokenswift": _method_dict(trace.tokenswift, decode)}


def write_trace_file(trace: RunTrace, decode: Callable[[list[int]], str], model: str) -> str:
    data = trace_to_json(trace, decode, model)
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="tokenswift-run-", delete=False, encoding="utf-8")
    with handle:
        json.dump(data, handle)
    return handle.name


def _series_from(data: dict[str, list[float]]) -> Series:
    s = Series()
    for x, y in zip(data["x"], data["y"]):
        s.append(x, y)
    return s


def _method_from(d: dict[str, Any]) -> MethodTrace:
    m = MethodTrace(d["method"])
    m.token_ids, m.sources = list(d["token_ids"]), list(d["sources"])
    if len(m.token_ids) != len(m.sources):
        raise ValueError("token_ids and sources have different lengths")
    m.iterations, m.compute_s, m.prefill_s = int(d["iterations"]), float(d["compute_s"]), float(d["prefill_s"])
    m.source_totals = dict(d["source_totals"])
    m.length_hist = {int(k): dict(v) for k, v in d["length_hist"].items()}
    per = d.get("per_iteration", {})
    m.per_iteration_accepted.extend(per.get("accepted", []))
    m.per_iteration_nodes.extend(per.get("draft_nodes", []))
    m.per_iteration_ms.extend(per.get("ms_draft_verify_bookkeeping", []))
    for name, series in d["series"].items():
        setattr(m, name, _series_from(series))
    m.refresh_at, m.held_runs = list(d["refresh_at"]), [tuple(r) for r in d["held_runs"]]
    m.partial_budget, m.partial_mode = int(d["partial_budget"]), d["partial_mode"]
    m.cache_length, m.done = int(d["cache_length"]), bool(d["done"])
    for t in d["trees"]:
        m.trees.append((int(t["iteration"]), [TreeNode(**n) for n in t["nodes"]], list(t["accepted_tokens"])))
    return m


def load_trace_file(path: str | Path) -> tuple[RunTrace, dict[str, Any]]:
    """Parse an exported run. Raises ValueError with a readable message on anything malformed."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"could not read the trace file: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a TokenSwift Live trace (expected format {FORMAT!r})")
    try:
        trace = RunTrace(list(data["prompt_ids"]), dict(data["settings"]), int(data["max_new_tokens"]))
        trace.ar = _method_from(data["ar"])
        trace.tokenswift = _method_from(data["tokenswift"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the trace file is incomplete or damaged ({type(exc).__name__}: {exc})") from None
    return trace, data
