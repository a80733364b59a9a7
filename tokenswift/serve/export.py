"""Trace files: a run exported as its Step event streams (plus the texts and a summary for people), and
loaded back for replay by folding the same events through `RunTrace.add`.

Export -> replay -> export gives the same bytes. Loading treats the file as hostile: its size is checked
before it is read, the JSON is parsed with bounds (no Infinity/NaN, no huge numbers, no duplicate keys,
no deep nesting), and every field is checked for type, range and consistency before anything is built;
each refusal is one sentence in a `TraceFileError`, and nothing partial is ever returned. The values are checked
by `tokenswift.checks`, the checkers `tokenswift.validate` uses too, with JSON's own types (`exact`).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

from tokenswift.checks import (InvalidRequest, a_list, a_pair, a_string, an_object, each_one_of, number_between,
                               numbers_between, one_of, refuse, same_length, shown, true_or_false, whole_number,
                               whole_numbers)
from tokenswift.events import TreeNode
from tokenswift.kinds import Method, PartialMode, Source
from tokenswift.settings import Settings

from .trace import CHANGE_COLUMNS, ITERATION_COLUMNS, TREES_KEPT, U32, U64, EventLog, RunTrace, estimate_bytes

FORMAT = "tokenswift-live-trace/2"
OLD_FORMATS = ("tokenswift-live-trace/1",)
EXPORT_DIR = Path(tempfile.gettempdir()) / "tokenswift-exports"
FILE_PREFIX = "tokenswift-run-"
KEEP_FILES = 64  # newest export files kept in the export folder
MAX_AGE_S = 3600.0  # export files older than this are removed
MAX_FILE_BYTES = 32 * 2**20  # a 100K-token run (both panes, 150K iterations) is about 11 MiB
MAX_TOKENS = 200_000  # prompt tokens, and new tokens per method
MAX_TREE_NODES = 4096  # nodes of one kept draft tree
MAX_TEXT = 1000  # characters of a model name, a setting or a plan
MAX_REAL = 1e9  # seconds, and the magnitude of a real-valued setting
# Timings no run of this engine produces: a method faster than this many tokens per second of compute, or
# TokenSwift this many times faster than AR (real runs: 0.3-5x on a CPU), is refused as implausible.
MAX_TOKENS_PER_S = 100_000.0
MAX_SPEEDUP = 50.0

TOKEN_SOURCES = tuple(s for s in Source if s != Source.ROOT)
NODE_SOURCES = tuple(s for s in Source if s not in (Source.BONUS, Source.AR))
PARTIAL_MODES = tuple(PartialMode)


class TraceFileError(ValueError):
    """A trace file that cannot be replayed; the message is one sentence that says why."""


# ---- export ------------------------------------------------------------------------------------------------
def trace_to_json(trace: RunTrace, decode: Callable[[list[int]], str], model: str,
                  seed: int | None = None) -> dict[str, Any]:
    """The file's content: the event streams (copied under the trace's lock) and, for people, the texts
    and a summary; replay reads only the former. `seed`: the run's seed, written when known (optional in the
    format: a replay restores it to the page's controls)."""
    snap = trace.snapshot()
    readable = snap["readable"]
    readable["prompt"] = decode(snap["prompt_ids"])
    for method, events in snap["methods"].items():
        readable["methods"][method]["text"] = decode(events["tokens"]["ids"])
    out = {"format": FORMAT, "model": model, "prompt_ids": snap["prompt_ids"], "settings": snap["settings"],
           "max_new_tokens": snap["max_new_tokens"], "methods": snap["methods"], "readable": readable}
    if seed is not None:
        out["seed"] = seed
    return out


def write_trace_file(trace: RunTrace, decode: Callable[[list[int]], str], model: str,
                     directory: str | Path | None = None, keep: int = KEEP_FILES, max_age_s: float = MAX_AGE_S,
                     seed: int | None = None) -> str:
    """Write the run to a new file in `directory` (default: EXPORT_DIR) and remove that folder's older
    export files beyond the newest `keep` or older than `max_age_s`. Returns the new file's path."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the file just written), not {keep}")
    folder = Path(directory) if directory is not None else EXPORT_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = json.dumps(trace_to_json(trace, decode, model, seed), separators=(",", ":"), allow_nan=False)
    fd, name = tempfile.mkstemp(prefix=FILE_PREFIX, suffix=".json", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    remove_old_exports(folder, keep, max_age_s, keep_path=Path(name))
    return name


def remove_old_exports(folder: Path, keep: int, max_age_s: float, keep_path: Path | None = None) -> list[Path]:
    """Remove export files beyond the newest `keep` or older than `max_age_s` (never `keep_path`)."""
    now, spared = time.time(), keep_path.resolve() if keep_path is not None else None
    dated = sorted(((mtime, path) for path in folder.glob(f"{FILE_PREFIX}*.json")
                    if (mtime := _mtime(path)) is not None), reverse=True)
    old = [path for rank, (mtime, path) in enumerate(dated)
           if (rank >= keep or now - mtime > max_age_s) and path.resolve() != spared]
    for path in old:
        path.unlink(missing_ok=True)
    return old


def _mtime(path: Path) -> float | None:
    """Modification time, or None for a file another export just removed."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


# ---- replay ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayLimits:
    vocab_size: int | None = None  # token ids must be below it (None: below 2**32)
    max_tokens: int = MAX_TOKENS
    max_tree_nodes: int = MAX_TREE_NODES
    positions: int | None = None  # the model's positions: prompt + new tokens, cache lengths, held ends

    @property
    def top_position(self) -> int:
        return U32 if self.positions is None else self.positions

    @property
    def top_id(self) -> int:
        return U32 if self.vocab_size is None else self.vocab_size - 1


VocabSize = int | Callable[[str], int] | None  # a number, or one for the model the file names
Positions = int | Callable[[str], int] | None  # the same for the model's maximum positions


def load_trace_file(path: str | Path, max_bytes: int = MAX_FILE_BYTES, vocab_size: VocabSize = None,
                    max_tokens: int = MAX_TOKENS, max_tree_nodes: int = MAX_TREE_NODES, positions: Positions = None,
                    max_kept_bytes: int | None = None) -> tuple[RunTrace, dict[str, Any]]:
    """Check an exported run completely and rebuild its trace by folding its events. Returns the trace and
    the file's (checked) content, whose "model" names the model it came from. Token ids must be below
    `vocab_size`, and prompt plus new tokens, cache lengths and held positions within `positions`: each a
    number, or a function of that model name (called once the name is checked). A trace that would keep
    more than `max_kept_bytes` of memory once rebuilt is refused before it is built. Raises
    `TraceFileError` (one sentence) on anything the file does wrong; nothing is kept from a refused file."""
    data = parse_trace_json(_read(Path(path), max_bytes))
    logs = check_trace(data, vocab_size, max_tokens, max_tree_nodes, positions)
    if max_kept_bytes is not None:
        kept = kept_bytes(data["prompt_ids"], logs)
        if kept > max_kept_bytes:
            _fail(f"Replaying this trace would keep about {kept / 2**20:,.0f} MiB of the server's memory; at most "
                  f"{max_kept_bytes / 2**20:,.0f} MiB per visitor are allowed here.")
    return RunTrace.replay(data["prompt_ids"], data["settings"], data["max_new_tokens"], logs), data


def kept_bytes(prompt_ids: list[int], logs: dict[Method, EventLog]) -> int:
    """The memory a trace rebuilt from these logs keeps (`RunTrace.approx_bytes`, before building it)."""
    tokens = sum(len(log.token_ids) + len(prompt_ids) // 2 for log in logs.values())
    iterations = sum(log.iterations for log in logs.values())
    nodes = sum(len(tree) for log in logs.values() for _, tree in log.trees)
    held = sum(len(log.held[1]) if log.held is not None else 0 for log in logs.values())
    return estimate_bytes(tokens, iterations, nodes, held)


def _read(path: Path, max_bytes: int) -> str:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            _fail(f"The trace file is {size / 2**20:.1f} MiB; at most {max_bytes / 2**20:.1f} MiB can be replayed.")
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        _fail(f"The trace file could not be read ({exc.strerror or type(exc).__name__}).")
    if len(raw) > max_bytes:
        _fail(f"The trace file is larger than {max_bytes / 2**20:.1f} MiB, the most that can be replayed.")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        _fail("The trace file is not UTF-8 text, so it is not a trace exported by this app.")


def parse_trace_json(text: str) -> Any:
    """JSON with bounds: no Infinity/NaN, finite numbers, whole numbers of at most Python's 4,300 digits
    (ranges are checked field by field afterwards), no duplicate keys, no deep nesting."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys)
    except TraceFileError:
        raise
    except RecursionError:
        _fail("The trace file nests lists or objects too deeply to be a trace exported by this app.")
    except json.JSONDecodeError as exc:
        _fail(f"The trace file is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).")
    except ValueError:  # Python's limit on the digits of a whole number
        _fail("The trace file contains a whole number with thousands of digits, more than a trace can hold.")


def _no_constant(name: str) -> NoReturn:
    _fail(f"The trace file contains {name}, which is not a number a trace can hold.")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or len(text) > 40:
        _fail(f"The trace file contains the number {text[:30]}, which is out of range.")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        _fail(f"The trace file has the key {shown(twice)} twice in one object.")
    return out


def check_trace(data: Any, vocab_size: VocabSize = None, max_tokens: int = MAX_TOKENS,
                max_tree_nodes: int = MAX_TREE_NODES, positions: Positions = None) -> dict[Method, EventLog]:
    """Check a parsed trace file completely; returns each method's event log, ready to fold."""
    if type(data) is not dict:
        _fail("The file is not a TokenSwift Live trace (its top level is not a JSON object).")
    fmt = data.get("format")
    if fmt in OLD_FORMATS:
        _fail(f"This trace has the old format {fmt!r}, which replay no longer reads; export the run again "
              f"with this version of the app.")
    if fmt != FORMAT:
        _fail(f"The file is not a TokenSwift Live trace (expected format {FORMAT!r}, found {shown(fmt)}).")
    with _in_the_file():
        an_object(data, "the file", ("format", "model", "prompt_ids", "settings", "max_new_tokens", "methods",
                                     "readable"), ("seed",))
        if "seed" in data:
            whole_number(data["seed"], "seed", 0, U32, exact=True)
        model = a_string(data["model"], "model", MAX_TEXT)
    limits = ReplayLimits(vocab_size(model) if callable(vocab_size) else vocab_size, max_tokens, max_tree_nodes,
                          positions(model) if callable(positions) else positions)
    with _in_the_file():
        prompt = _ids(data["prompt_ids"], "prompt_ids", limits)
        _settings(data["settings"])
        room = min(limits.max_tokens, limits.top_position - len(prompt))
        if room < 1:
            refuse(f"the prompt has {len(prompt):,} tokens; the model holds {limits.top_position:,} positions in "
                   f"all, so no run of it could have produced this trace.")
        max_new = whole_number(data["max_new_tokens"], "max_new_tokens", 1, room, exact=True)
        methods = an_object(data["methods"], "methods", tuple(Method))
        logs = {m: _check_log(methods[m], f"methods.{m}", limits, max_new) for m in Method}
        _plausible(logs)
        _readable(data["readable"])
    return logs


def _plausible(logs: dict[Method, EventLog]) -> None:
    """Timings a real run could have: compute time grows, is not zero once tokens exist, and gives neither a
    method faster than MAX_TOKENS_PER_S nor a speedup beyond MAX_SPEEDUP."""
    speeds = {}
    for method, log in logs.items():
        elapsed = log.columns["elapsed_s"]
        if any(b < a for a, b in zip(elapsed, elapsed[1:])):
            refuse(f"methods.{method}.per_iteration.elapsed_s decreases, which no run's compute time does.")
        if log.token_ids:
            seconds = elapsed[-1] if elapsed else 0.0
            if seconds <= 0 or len(log.token_ids) / seconds > MAX_TOKENS_PER_S:
                refuse(f"{method} made {len(log.token_ids):,} tokens in {seconds:g} s of compute, "
                       f"faster than {MAX_TOKENS_PER_S:,.0f} tokens/s: its timings are not plausible.")
            speeds[method] = len(log.token_ids) / seconds
    if len(speeds) == 2 and speeds[Method.TOKENSWIFT] / speeds[Method.AR] > MAX_SPEEDUP:
        refuse(f"TokenSwift is {speeds[Method.TOKENSWIFT] / speeds[Method.AR]:,.0f} times as fast as AR, beyond the "
               f"{MAX_SPEEDUP:g}x any run of this engine reaches: its timings are not plausible.")


def _settings(value: Any) -> None:
    defaults = {f.name: f.default for f in fields(Settings)}
    settings = an_object(value, "settings", (), tuple(defaults))
    for name, setting in settings.items():
        _setting(setting, f"settings.{name}", defaults[name])


def _setting(value: Any, where: str, default: Any) -> None:
    """A setting of the default's kind (a number for numbers, true/false for flags, text for names)."""
    if isinstance(default, bool):
        true_or_false(value, where)
    elif isinstance(default, str):
        a_string(value, where, MAX_TEXT)
    elif isinstance(default, int) or (default is None and value is not None):
        whole_number(value, where, 0, U32, exact=True)
    elif isinstance(default, float):
        number_between(value, where, -MAX_REAL, MAX_REAL)


def _check_log(value: Any, where: str, limits: ReplayLimits, max_new: int) -> EventLog:
    log = an_object(value, where, ("tokens", "per_iteration", "changes", "refreshed_at", "trees", "plans", "held",
                                   "done"))
    tokens = an_object(log["tokens"], f"{where}.tokens", ("ids", "sources", "depths"))
    ids = _ids(tokens["ids"], f"{where}.tokens.ids", limits)
    if len(ids) > max_new:
        refuse(f"{where} has {len(ids):,} tokens but max_new_tokens is {max_new:,}.")
    same_length(tokens["sources"], ids, f"{where}.tokens.sources", "tokens")
    each_one_of(tokens["sources"], f"{where}.tokens.sources", TOKEN_SOURCES)
    same_length(tokens["depths"], ids, f"{where}.tokens.depths", "tokens")
    whole_numbers(tokens["depths"], f"{where}.tokens.depths", 0, limits.max_tree_nodes)
    per = an_object(log["per_iteration"], f"{where}.per_iteration", tuple(ITERATION_COLUMNS))
    accepted = a_list(per["accepted"], f"{where}.per_iteration.accepted", limits.max_tokens)
    whole_numbers(accepted, f"{where}.per_iteration.accepted", 0, limits.max_tree_nodes + 1)
    if sum(accepted) != len(ids):
        refuse(f"the accepted lengths of {where}.per_iteration add up to {sum(accepted):,} but there are "
               f"{len(ids):,} tokens.")
    n = len(accepted)
    if n > len(ids) + 1:  # every iteration accepts a token, but a last one cut by the token limit
        refuse(f"{where} has {n:,} iterations for {len(ids):,} tokens; a run accepts at least one token per "
               f"iteration.")
    for name, code in ITERATION_COLUMNS.items():
        column, at = per[name], f"{where}.per_iteration.{name}"
        same_length(column, accepted, at, "iterations")
        if code == "d":
            numbers_between(column, at, 0.0, MAX_REAL)
        else:
            whole_numbers(column, at, 0, _column_top(name, code, limits))
    changes = an_object(log["changes"], f"{where}.changes", CHANGE_COLUMNS)
    for name in CHANGE_COLUMNS:
        _changes(changes[name], f"{where}.changes.{name}", n, _CHANGE_CHECKS[name])
    _iterations(log["refreshed_at"], f"{where}.refreshed_at", n)
    trees = _pairs(log["trees"], f"{where}.trees", n, TREES_KEPT)
    for k, (_, nodes) in enumerate(trees):
        _tree(nodes, f"{where}.trees[{k}]", limits)
    plans = _pairs(log["plans"], f"{where}.plans", n, TREES_KEPT)
    for k, (_, plan) in enumerate(plans):
        a_string(plan, f"{where}.plans[{k}]", MAX_TEXT, empty=False)
    if log["held"] is not None:
        _held(log["held"], f"{where}.held", n, limits)
    true_or_false(log["done"], f"{where}.done")
    return EventLog.from_json(log)


def _column_top(name: str, code: str, limits: ReplayLimits) -> int:
    if name == "accepted":
        return limits.max_tree_nodes + 1
    if name == "draft_nodes":
        return limits.max_tree_nodes
    if name in ("cache_length", "partial_sink", "partial_selected", "partial_recent"):
        return limits.top_position
    return U64 if code == "Q" else U32


def _changes(value: Any, where: str, iterations: int, check: Callable[[Any, str], Any]) -> None:
    """[iteration, value] where the value changes: from iteration 0 when there are iterations."""
    points = _pairs(value, where, iterations, iterations)
    if iterations and (not points or points[0][0] != 0):
        refuse(f"{where} must start at iteration 0.")
    for k, (_, v) in enumerate(points):
        check(v, f"{where}[{k}]")
        if k and v == points[k - 1][1]:
            refuse(f"{where}[{k}] repeats the value before it.")


_CHANGE_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "prefill_s": lambda v, where: number_between(v, where, 0.0, MAX_REAL),
    "cache_capacity": lambda v, where: whole_number(v, where, 0, U32, exact=True),
    "partial_mode": lambda v, where: one_of(v, where, PARTIAL_MODES),
    "partial_budget": lambda v, where: whole_number(v, where, 0, U32, exact=True),
    "refreshes": lambda v, where: whole_number(v, where, 0, U32, exact=True),
}


def _pairs(value: Any, where: str, iterations: int, max_len: int) -> list[list[Any]]:
    """[[iteration, value], ...] with iterations increasing and below `iterations`."""
    items = a_list(value, where, max_len)
    for k, item in enumerate(items):
        iteration, _ = a_pair(item, f"{where}[{k}]")
        _iteration(iteration, f"{where}[{k}] iteration", iterations, items[k - 1][0] if k else -1)
    return items


def _iterations(value: Any, where: str, iterations: int) -> None:
    """Iterations in increasing order, each below `iterations`."""
    items = a_list(value, where, iterations)
    for k, iteration in enumerate(items):
        _iteration(iteration, f"{where}[{k}]", iterations, items[k - 1] if k else -1)


def _iteration(value: Any, where: str, iterations: int, after: int) -> None:
    if not iterations:
        refuse(f"{where} names an iteration, but there are no iterations.")
    whole_number(value, where, 0, iterations - 1, exact=True)
    if value <= after:
        refuse(f"{where} is {value}, but iterations must increase (the one before is {after}).")


NODE_KEYS = tuple(f.name for f in fields(TreeNode))


def _tree(nodes: Any, where: str, limits: ReplayLimits) -> None:
    items = a_list(nodes, f"{where} nodes", limits.max_tree_nodes)
    if not items:
        refuse(f"{where} is an empty draft tree.")
    for k, node in enumerate(items):
        at = f"{where} node {k}"
        an_object(node, at, NODE_KEYS)
        whole_number(node["token"], f"{at} token", 0, limits.top_id, exact=True)
        whole_number(node["parent"], f"{at} parent", -1, k - 1, exact=True)
        whole_number(node["depth"], f"{at} depth", 0, limits.max_tree_nodes, exact=True)
        one_of(node["source"], f"{at} source", NODE_SOURCES)
        number_between(node["draft_prob"], f"{at} draft_prob", 0.0, 1.0 + 1e-6, "from 0 to 1")
        true_or_false(node["accepted"], f"{at} accepted")
        if node["target_prob"] is not None:
            number_between(node["target_prob"], f"{at} target_prob", 0.0, 1.0 + 1e-6, "from 0 to 1")
        if node["target_sample"] is not None:
            whole_number(node["target_sample"], f"{at} target_sample", 0, limits.top_id, exact=True)


def _held(value: Any, where: str, iterations: int, limits: ReplayLimits) -> None:
    """[iteration, [[start, end], ...]]: the held positions the latest report gave."""
    iteration, runs = a_pair(value, where)
    _iteration(iteration, f"{where} iteration", iterations, -1)
    top = limits.top_position
    for k, run in enumerate(a_list(runs, f"{where} runs", min(limits.max_tokens, top // 2 + 1))):
        start, end = a_pair(run, f"{where} run {k}")
        after = runs[k - 1][1] if k else 0  # runs in order, not overlapping
        whole_number(start, f"{where} run {k} start", after, top - 1, exact=True)
        whole_number(end, f"{where} run {k} end", start + 1, top, exact=True)


def _ids(value: Any, where: str, limits: ReplayLimits) -> list[int]:
    items = a_list(value, where, limits.max_tokens)
    whole_numbers(items, where, 0, limits.top_id)
    return items


def _readable(value: Any) -> None:
    """The part for people: checked for shape only (replay derives it again from the events)."""
    readable = an_object(value, "readable", ("speedup", "identical_prefix", "methods", "prompt"))
    number_between(readable["speedup"], "readable.speedup", 0.0, math.inf)
    whole_number(readable["identical_prefix"], "readable.identical_prefix", 0, U32, exact=True)
    a_string(readable["prompt"], "readable.prompt", math.inf)
    methods = an_object(readable["methods"], "readable.methods", tuple(Method))
    for m in Method:
        where = f"readable.methods.{m}"
        summary = an_object(methods[m], where, ("generated", "iterations", "tokens_per_s", "mean_accepted",
                                                "compute_s", "prefill_s", "text"))
        for key in ("generated", "iterations"):
            whole_number(summary[key], f"{where}.{key}", 0, U32, exact=True)
        for key in ("tokens_per_s", "mean_accepted", "compute_s", "prefill_s"):
            number_between(summary[key], f"{where}.{key}", 0.0, math.inf)
        a_string(summary["text"], f"{where}.text", math.inf)


# ---- refusals ---------------------------------------------------------------------------------------------
def _fail(message: str) -> NoReturn:
    raise TraceFileError(message)


@contextlib.contextmanager
def _in_the_file() -> Iterator[None]:
    """A checker's refusal ("<where> must be ...; got ...") as a TraceFileError that says it is about the file."""
    try:
        yield
    except InvalidRequest as exc:
        raise TraceFileError(f"In the trace file, {exc}") from None
