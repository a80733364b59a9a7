"""Where a TokenSwift iteration's time goes, from the run's own per-iteration records (pure functions).

`MethodTrace.per_iteration_ms` holds [draft, verify, bookkeeping] ms per iteration (flattened) and
`per_iteration_nodes` the drafted nodes each iteration verified (the root not counted).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from tokenswift.serve.trace import MethodTrace

# Drafted-node buckets [lo, hi] of the verification cost table: doublings, as the cost grows ~linearly in q.
NODE_BUCKETS = ((0, 0), (1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 65535))


@dataclass(frozen=True)
class Split:
    """Mean milliseconds per iteration."""

    draft: float
    verify: float
    bookkeeping: float

    @property
    def total(self) -> float:
        return self.draft + self.verify + self.bookkeeping


@dataclass(frozen=True)
class CostBucket:
    label: str  # "3-4" drafted nodes
    iterations: int
    verify_ms: float  # median over the bucket's iterations


def triples(m: MethodTrace) -> list[tuple[float, float, float]]:
    """(draft, verify, bookkeeping) ms per iteration."""
    ms = m.per_iteration_ms
    return list(zip(ms[0::3], ms[1::3], ms[2::3]))


def mean_split(m: MethodTrace) -> Split | None:
    """Mean per-iteration split (None before any iteration)."""
    rows = triples(m)
    if not rows:
        return None
    n = len(rows)
    return Split(*(sum(r[k] for r in rows) / n for k in range(3)))


def step_ms(m: MethodTrace) -> float:
    """Mean milliseconds of one iteration (for AR: one step) from the method's compute time."""
    return 1e3 * m.compute_s / m.iterations if m.iterations else 0.0


def median_step_ms(m: MethodTrace) -> float:
    """Median milliseconds of one iteration's draft + verify + bookkeeping (0.0 before any)."""
    rows = triples(m)
    return median(sum(row) for row in rows) if rows else 0.0


def verify_cost(m: MethodTrace) -> list[CostBucket]:
    """Median verification ms by drafted-node bucket, over this run's iterations (empty buckets left out)."""
    rows = triples(m)
    out = []
    for lo, hi in NODE_BUCKETS:
        ms = [row[1] for nodes, row in zip(m.per_iteration_nodes, rows) if lo <= nodes <= hi]
        if ms:
            label = str(lo) if lo == hi else f"{lo}+" if hi >= 65535 else f"{lo}-{hi}"
            out.append(CostBucket(label, len(ms), median(ms)))
    return out


# Below this share of iterations that verified drafts, the speed panel says why auto drafted so little.
LOW_DRAFTING = 0.25


@dataclass(frozen=True)
class Drafting:
    """How often a run verified drafts, and what its drafted iterations cost and yielded."""

    iterations: int
    drafted: int  # iterations that verified at least one drafted node
    tokens: float  # mean tokens of a drafted iteration: its accepted drafts and the bonus (0.0 when none)
    verify_ms: float  # median verification ms of a drafted iteration (0.0 when none)

    @property
    def share(self) -> float:
        return self.drafted / self.iterations if self.iterations else 0.0


def drafting(m: MethodTrace) -> Drafting:
    rows = triples(m)
    drafted = [(tokens, row[1]) for nodes, tokens, row in zip(m.per_iteration_nodes, m.per_iteration_accepted, rows)
               if nodes > 0]
    if not drafted:
        return Drafting(len(rows), 0, 0.0, 0.0)
    return Drafting(len(rows), len(drafted), sum(t for t, _ in drafted) / len(drafted),
                    median(ms for _, ms in drafted))


def mean_nodes(m: MethodTrace) -> float:
    nodes = m.per_iteration_nodes
    return sum(nodes) / len(nodes) if nodes else 0.0


# The headline ratio is shown once each method has this many iterations: before that it is mostly noise
# (the first iterations of a run include one-off costs), and the page says it is still measuring.
MIN_RATIO_ITERATIONS = 10


def rate_error(m: MethodTrace) -> float:
    """The relative standard error of m's tokens per second (tokens over compute time), treating its iterations
    as a sample of (tokens, seconds) pairs: the ratio estimator's variance, sum((t_i - r s_i)^2) / (n (n-1)) /
    mean(s)^2, over r^2. 0.0 with fewer than two iterations."""
    n = m.iterations
    if n < 2 or m.compute_s <= 0:
        return 0.0
    rate = m.generated / m.compute_s
    elapsed = m.events.columns["elapsed_s"]
    previous, spread = 0.0, 0.0
    for tokens, at in zip(m.per_iteration_accepted, elapsed):
        spread += (tokens - rate * (at - previous)) ** 2
        previous = at
    mean_s = m.compute_s / n
    return (spread / (n * (n - 1))) ** 0.5 / mean_s / rate


@dataclass(frozen=True)
class Ratio:
    value: float  # TokenSwift tok/s over AR tok/s (0.0: no ratio yet)
    error: float  # its standard error (absolute), from both methods' iteration-to-iteration spread
    settled: bool  # both methods have MIN_RATIO_ITERATIONS iterations


def speed_ratio(ts: MethodTrace, ar: MethodTrace) -> Ratio:
    if not (ts.tokens_per_s and ar.tokens_per_s):
        return Ratio(0.0, 0.0, False)
    value = ts.tokens_per_s / ar.tokens_per_s
    error = value * (rate_error(ts) ** 2 + rate_error(ar) ** 2) ** 0.5
    return Ratio(value, error, min(ts.iterations, ar.iterations) >= MIN_RATIO_ITERATIONS)
