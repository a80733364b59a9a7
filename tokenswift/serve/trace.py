"""What a run leaves behind: a fold over the engine's Step events, with bounded memory.

A `RunTrace` holds one `MethodTrace` per pane (AR and TokenSwift). Each `MethodTrace.add(step)` does two
things: it appends the step to the method's `EventLog` (the compact event stream: the tokens with their
sources and depths, and per iteration a few tens of bytes: accepted length, drafted nodes, timings, cache
state; draft trees, plans and held positions only for recent iterations), and it updates what the panes
and plots read (totals, histograms, and `Series` that halve their resolution past a cap, so a 100K-token
run keeps at most a few thousand points per series). Export writes the event streams; replay rebuilds
the Step events from them (`EventLog.steps`) and folds them through the same `add`.
"""
from __future__ import annotations

import threading
from array import array
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from tokenswift.events import AcceptedToken, CacheState, Step, Timings, TreeNode
from tokenswift.kinds import DRAFTED, Method, Source, PartialMode

SERIES_CAP = 2048
TREES_KEPT = 32  # draft trees (and auto's plans) kept for the most recent iterations
U32, U64 = 2**32 - 1, 2**64 - 1  # the largest values of the "I" and "Q" columns
SOURCES = {str(s): s for s in Source}

# What a trace keeps in the server's memory, measured with tracemalloc on replayed traces (CPython 3.11),
# rounded up: per token (id, source and depth in the log, histograms), per iteration (the columns, the
# Series before they halve), per kept draft-tree node (a TreeNode in the log and in the pane), per held run
# (a pair in the log and in the pane), and a trace's fixed part (its Series at their cap, dicts).
BYTES_PER_TOKEN = 80
BYTES_PER_ITERATION = 120
BYTES_PER_TREE_NODE = 1_200
BYTES_PER_HELD_RUN = 320
BYTES_PER_TRACE = 4 * 2**20


def estimate_bytes(tokens: int, iterations: int, tree_nodes: int, held_runs: int) -> int:
    """The server memory a trace of these counts (both panes together) keeps, from the constants above."""
    return (BYTES_PER_TRACE + tokens * BYTES_PER_TOKEN + iterations * BYTES_PER_ITERATION
            + tree_nodes * BYTES_PER_TREE_NODE + held_runs * BYTES_PER_HELD_RUN)

# One value per iteration: name -> array type code. The timings are whole microseconds, so that what
# export writes is exactly what replay records again.
ITERATION_COLUMNS = {
    "accepted": "I", "draft_nodes": "I", "draft_us": "I", "verify_us": "I", "bookkeeping_us": "I",
    "elapsed_s": "d", "cache_length": "I", "cache_bytes": "Q",
    "partial_sink": "I", "partial_selected": "I", "partial_recent": "I",
}
# Values that rarely change within a run, kept as [iteration, value] where they change.
CHANGE_COLUMNS = ("prefill_s", "cache_capacity", "partial_mode", "partial_budget", "refreshes")


class Series:
    """(x, y) points appended in x order; past `cap` points, neighbours are merged (y averaged, or the
    max for event-like series) so memory stays bounded while the whole history stays visible."""

    def __init__(self, cap: int = SERIES_CAP, reduce: str = "mean") -> None:
        self.cap, self.reduce = cap, reduce
        self.x: list[float] = []
        self.y: list[float] = []
        self._stride = 1
        self._pending: list[tuple[float, float]] = []

    def append(self, x: float, y: float) -> None:
        self._pending.append((x, y))
        if len(self._pending) < self._stride:
            return
        xs, ys = zip(*self._pending)
        self._pending = []
        self.x.append(xs[-1])
        self.y.append(max(ys) if self.reduce == "max" else sum(ys) / len(ys))
        if len(self.x) > self.cap:
            self._halve()

    def _halve(self) -> None:
        pairs = range(0, len(self.x) - 1, 2)
        merge = (lambda a, b: max(a, b)) if self.reduce == "max" else (lambda a, b: (a + b) / 2)
        self.y = [merge(self.y[i], self.y[i + 1]) for i in pairs]
        self.x = [self.x[i + 1] for i in pairs]
        self._stride *= 2

    def points(self) -> tuple[list[float], list[float]]:
        if not self._pending:
            return list(self.x), list(self.y)
        xs, ys = zip(*self._pending)
        tail = max(ys) if self.reduce == "max" else sum(ys) / len(ys)
        return self.x + [xs[-1]], self.y + [tail]

    def to_dict(self) -> dict[str, Any]:
        x, y = self.points()
        return {"x": x, "y": y}


@dataclass
class Changes:
    """A per-iteration value that rarely changes, kept as (iteration, value) at each change."""

    points: list[tuple[int, Any]] = field(default_factory=list)

    def note(self, iteration: int, value: Any) -> None:
        if not self.points or self.points[-1][1] != value:
            self.points.append((iteration, value))

    def expand(self, iterations: int) -> Iterator[Any]:
        """The value at each of the first `iterations` iterations (points start at iteration 0)."""
        for k, (start, value) in enumerate(self.points):
            end = self.points[k + 1][0] if k + 1 < len(self.points) else iterations
            for _ in range(start, end):
                yield value


def _us(seconds: float) -> int:
    return min(max(round(seconds * 1e6), 0), U32)


@dataclass
class EventLog:
    """One method's Step events, compacted: everything replay needs to rebuild them. Per token: the id,
    its source and its depth; per iteration: `ITERATION_COLUMNS` (about 50 bytes), `CHANGE_COLUMNS` where
    they change, and the iterations that refreshed the partial cache; draft trees and plans for the last
    `TREES_KEPT` iterations that had one; the latest held positions; whether the last step ended the run."""

    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    depths: array = field(default_factory=lambda: array("H"))
    columns: dict[str, array] = field(default_factory=lambda: {k: array(t) for k, t in ITERATION_COLUMNS.items()})
    changes: dict[str, Changes] = field(default_factory=lambda: {k: Changes() for k in CHANGE_COLUMNS})
    refreshed_at: array = field(default_factory=lambda: array("I"))  # iterations whose step refreshed the cache
    trees: deque = field(default_factory=lambda: deque(maxlen=TREES_KEPT))  # (iteration, [TreeNode])
    plans: deque = field(default_factory=lambda: deque(maxlen=TREES_KEPT))  # (iteration, plan)
    held: tuple[int, list[tuple[int, int]]] | None = None  # (iteration, [start, end) runs) of the latest report
    done: bool = False

    @property
    def iterations(self) -> int:
        return len(self.columns["accepted"])

    def record(self, step: Step) -> None:
        i = self.iterations
        for tok in step.tokens:
            self.token_ids.append(tok.token)
            self.sources.append(tok.source)
            self.depths.append(tok.depth)
        t, c = step.timings, step.cache
        row = {"accepted": len(step.tokens), "draft_nodes": step.draft_nodes, "draft_us": _us(t.draft_s),
               "verify_us": _us(t.verify_s), "bookkeeping_us": _us(t.bookkeeping_s), "elapsed_s": step.elapsed_s,
               "cache_length": c.length, "cache_bytes": c.bytes, "partial_sink": c.partial_sink,
               "partial_selected": c.partial_selected, "partial_recent": c.partial_recent}
        for name, value in row.items():
            self.columns[name].append(value)
        changed = {"prefill_s": step.prefill_s, "cache_capacity": c.capacity, "partial_mode": str(c.partial_mode),
                   "partial_budget": c.partial_budget, "refreshes": c.refreshes}
        for name, value in changed.items():
            self.changes[name].note(i, value)
        if c.refreshed:
            self.refreshed_at.append(i)
        if step.tree:
            self.trees.append((i, step.tree))
        if step.plan:
            self.plans.append((i, step.plan))
        if c.held_positions is not None:
            self.held = (i, list(c.held_positions))
        self.done = step.done

    def steps(self, method: str) -> Iterator[Step]:
        """The Step events again (trees, plans and held positions only where kept; timings to the µs)."""
        cols, n = self.columns, self.iterations
        trees, plans, refreshed = dict(self.trees), dict(self.plans), set(self.refreshed_at)
        held_at, held = self.held if self.held is not None else (-1, None)
        changing = {name: self.changes[name].expand(n) for name in CHANGE_COLUMNS}
        start = 0
        for i in range(n):
            end = start + cols["accepted"][i]
            tokens = [AcceptedToken(self.token_ids[j], self.sources[j], self.depths[j]) for j in range(start, end)]
            now = {name: next(values) for name, values in changing.items()}
            cache = CacheState(cols["cache_length"][i], now["cache_capacity"], cols["cache_bytes"][i], now["partial_mode"],
                               now["partial_budget"], cols["partial_sink"][i], cols["partial_selected"][i],
                               cols["partial_recent"][i], i in refreshed, now["refreshes"],
                               list(held) if i == held_at else None)
            timings = Timings(cols["draft_us"][i] / 1e6, cols["verify_us"][i] / 1e6, cols["bookkeeping_us"][i] / 1e6)
            yield Step(i, method, tokens, cache, timings, end, cols["elapsed_s"][i], now["prefill_s"],
                       list(trees.get(i, [])), self.done and i == n - 1, cols["draft_nodes"][i], plans.get(i, ""))
            start = end

    def to_json(self) -> dict[str, Any]:
        """JSON-ready copies (the file format's per-method part; `from_json` reads it back)."""
        return {
            "tokens": {"ids": list(self.token_ids), "sources": [str(s) for s in self.sources], "depths": list(self.depths)},
            "per_iteration": {name: list(column) for name, column in self.columns.items()},
            "changes": {name: [list(p) for p in self.changes[name].points] for name in CHANGE_COLUMNS},
            "refreshed_at": list(self.refreshed_at),
            "trees": [[i, [asdict(node) for node in nodes]] for i, nodes in self.trees],
            "plans": [[i, plan] for i, plan in self.plans],
            "held": None if self.held is None else [self.held[0], [list(r) for r in self.held[1]]],
            "done": self.done,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EventLog:
        """The inverse of `to_json`, for data already checked (see `tokenswift.serve.export`)."""
        log = cls()
        tokens = data["tokens"]
        log.token_ids, log.sources = list(tokens["ids"]), [SOURCES[s] for s in tokens["sources"]]
        log.depths.extend(tokens["depths"])
        for name, values in data["per_iteration"].items():
            log.columns[name].extend(values)
        for name, points in data["changes"].items():
            log.changes[name].points = [(i, value) for i, value in points]
        log.refreshed_at.extend(data["refreshed_at"])
        log.trees.extend((i, [_node(n) for n in nodes]) for i, nodes in data["trees"])
        log.plans.extend((i, plan) for i, plan in data["plans"])
        if data["held"] is not None:
            log.held = (data["held"][0], [(s, e) for s, e in data["held"][1]])
        log.done = data["done"]
        return log


def _node(data: dict[str, Any]) -> TreeNode:
    return TreeNode(**{**data, "source": SOURCES[data["source"]]})


@dataclass
class MethodTrace:
    """Everything the panes and plots need about one method's run, and its event stream (`events`)."""

    method: str  # a Method
    events: EventLog = field(default_factory=EventLog)
    compute_s: float = 0.0  # the method's own compute time (prefill excluded)
    prefill_s: float = 0.0
    source_totals: dict[str, int] = field(default_factory=dict)
    length_hist: dict[int, dict[str, int]] = field(default_factory=dict)  # accepted length -> source -> iterations
    accepted: Series = field(default_factory=Series)  # accepted tokens per iteration, by iteration
    cache_len: Series = field(default_factory=Series)  # full cache length, by generated tokens
    cache_mb: Series = field(default_factory=Series)
    partial_sink: Series = field(default_factory=Series)
    partial_selected: Series = field(default_factory=Series)
    partial_recent: Series = field(default_factory=Series)
    refresh_at: list[int] = field(default_factory=list)  # generated-token counts where the partial cache refreshed
    held_runs: list[tuple[int, int]] = field(default_factory=list)  # sink + selected runs at the last refresh
    partial_budget: int = 0
    partial_mode: str = PartialMode.NONE
    cache_length: int = 0
    trees: deque = field(default_factory=lambda: deque(maxlen=TREES_KEPT))  # (iteration, [TreeNode], [accepted])
    done: bool = False
    plan: str = ""  # tree="auto": the latest iteration's chosen tree and why

    @property
    def token_ids(self) -> list[int]:
        return self.events.token_ids

    @property
    def sources(self) -> list[str]:  # per token: a Source (head / ngram / bonus / ar)
        return self.events.sources

    @property
    def iterations(self) -> int:
        return self.events.iterations

    @property
    def per_iteration_accepted(self) -> array:
        return self.events.columns["accepted"]

    @property
    def per_iteration_nodes(self) -> array:
        return self.events.columns["draft_nodes"]

    @property
    def per_iteration_ms(self) -> array:
        """Draft, verify and bookkeeping milliseconds of each iteration, one after the other."""
        cols = self.events.columns
        out = array("f")
        for times in zip(cols["draft_us"], cols["verify_us"], cols["bookkeeping_us"]):
            out.extend(t / 1e3 for t in times)
        return out

    @property
    def generated(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.compute_s if self.compute_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.generated / self.iterations if self.iterations else 0.0

    def add(self, step: Step) -> None:
        self.events.record(step)
        for tok in step.tokens:
            self.source_totals[tok.source] = self.source_totals.get(tok.source, 0) + 1
        self.compute_s = step.elapsed_s
        self.prefill_s = step.prefill_s
        n = step.accepted_length
        main = _main_source(step)
        hist = self.length_hist.setdefault(n, {})
        hist[main] = hist.get(main, 0) + 1
        self.accepted.append(step.index, n)
        if step.plan:
            self.plan = step.plan
        c = step.cache
        self.cache_length = c.length
        self.cache_len.append(step.generated, c.length)
        self.cache_mb.append(step.generated, c.bytes / 2**20)
        self.partial_mode, self.partial_budget = c.partial_mode, c.partial_budget
        if c.partial_budget:
            self.partial_sink.append(step.generated, c.partial_sink)
            self.partial_selected.append(step.generated, c.partial_selected)
            self.partial_recent.append(step.generated, c.partial_recent)
        if c.refreshed and step.index > 0:
            self.refresh_at.append(step.generated)
            if len(self.refresh_at) > SERIES_CAP:
                self.refresh_at = self.refresh_at[::2]
        if c.held_positions is not None:
            self.held_runs = list(c.held_positions)
        if step.tree:
            self.trees.append((step.index, step.tree, [t.token for t in step.tokens]))
        self.done = step.done

    def partial_recent_now(self) -> int:
        _, ys = self.partial_recent.points()
        return int(ys[-1]) if ys else 0


def _main_source(step: Step) -> str:
    """The source that produced most of an iteration's drafted tokens (bonus-only: "bonus")."""
    drafted = [t.source for t in step.tokens if t.source in DRAFTED]
    if not drafted:
        return step.tokens[-1].source if step.tokens else Source.AR
    return max(set(drafted), key=drafted.count)


@dataclass
class RunTrace:
    """Both panes of one run, plus what produced it. `add` and `snapshot` hold one lock, so a snapshot
    (export) taken while the run is still adding events sees whole steps only."""

    prompt_ids: list[int]
    settings: dict[str, Any]
    max_new_tokens: int
    ar: MethodTrace = field(default_factory=lambda: MethodTrace(Method.AR))
    tokenswift: MethodTrace = field(default_factory=lambda: MethodTrace(Method.TOKENSWIFT))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def pane(self, method: str) -> MethodTrace:
        return self.ar if method == Method.AR else self.tokenswift

    def add(self, step: Step) -> None:
        with self._lock:
            self.pane(step.method).add(step)

    @classmethod
    def replay(cls, prompt_ids: list[int], settings: dict[str, Any], max_new_tokens: int,
               logs: dict[Method, EventLog]) -> RunTrace:
        """A trace rebuilt by folding each method's logged events through `add`."""
        trace = cls(prompt_ids, settings, max_new_tokens)
        for method, log in logs.items():
            for step in log.steps(method):
                trace.add(step)
        return trace

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready copies taken under the lock: what produced the run, each method's event stream, and
        a summary derived from them for people reading the file ("readable"; replay ignores it)."""
        with self._lock:
            return {"prompt_ids": list(self.prompt_ids), "settings": dict(self.settings),
                    "max_new_tokens": self.max_new_tokens,
                    "methods": {m: self.pane(m).events.to_json() for m in Method},
                    "readable": self._readable()}

    def _readable(self) -> dict[str, Any]:
        per_method = {m: {"generated": p.generated, "iterations": p.iterations, "tokens_per_s": p.tokens_per_s,
                          "mean_accepted": p.mean_accepted, "compute_s": p.compute_s, "prefill_s": p.prefill_s}
                      for m, p in ((m, self.pane(m)) for m in Method)}
        return {"speedup": self.speedup, "identical_prefix": self.identical_prefix(), "methods": per_method}

    @property
    def speedup(self) -> float:
        a, t = self.ar.tokens_per_s, self.tokenswift.tokens_per_s
        return t / a if a > 0 and t > 0 else 0.0

    def approx_bytes(self) -> int:
        """The server memory this trace keeps (an estimate from its counts; cheap enough to call per update)."""
        tokens = iterations = nodes = held = 0
        with self._lock:  # a run may be adding steps meanwhile
            for pane in (self.ar, self.tokenswift):
                log = pane.events
                tokens += len(log.token_ids) + len(self.prompt_ids) // 2
                iterations += log.iterations
                nodes += sum(len(t) for _, t in log.trees)
                held += len(pane.held_runs)
        return estimate_bytes(tokens, iterations, nodes, held)

    def identical_prefix(self) -> int:
        """How many leading tokens the two panes share (the greedy losslessness check)."""
        n = 0
        for x, y in zip(self.ar.token_ids, self.tokenswift.token_ids):
            if x != y:
                break
            n += 1
        return n
