"""Cost-aware drafting (`tree="auto"`): the draft tree that maximizes expected tokens per second here.

On a GPU verifying 100 nodes costs about one step, so the paper's fixed 40-node tree is nearly free. On a
CPU every verified row costs a real fraction of a step (measured here: 9 rows about 1.7x one row at 1K
context), so the tree must be sized by what the machine charges and what the drafts are worth:

* **Cost model** (`CostModel`): the time of verifying q rows (forward, logits and the per-row decision).
  The first iteration is an AR-cost step that measures one row; a prior curve scaled from it serves until
  a plan wants to draft, which triggers a probe of a few q at the current context length (re-probed when
  the context has doubled); every iteration's own timing corrects the curve; plus the iteration's fixed
  overhead (drafting and bookkeeping), also measured online.
* **Acceptance model** (`AcceptanceStats`): for every kind of drafted node (a suffix match of length m at
  chain position j; head level l with the head's own probability in a given bin; an n-gram of a given
  count share) the rate at which the target accepted it when its parent was reached, decayed so that it
  follows the text, starting from a prior.
* **Calibration**: the planner picks the best-looking nodes, so their rates are optimistic; accepted over
  expected drafted tokens, decayed, scales every expectation.
* **The rule** (Sequoia's hardware-aware objective, EAGLE-2's confidence ranking): merge every proposal
  into one trie, give each node the probability that the walk reaches and accepts it (the product of
  conditional rates along its path), take nodes in decreasing probability (parents always first), and
  keep the prefix q that maximizes (1 + sum of the kept probabilities) / (cost of q + 1 rows + overhead).
  When no draft pays for its row, q = 0: the iteration is one AR-cost step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

PROBE_ROWS = (1, 3, 6, 12)  # rows timed by a probe; costs in between are interpolated, beyond extrapolated. Where
#                            the products take rows in passes of 3 (AVX2), 1-3 rows cost about one and 4 a step more:
#                            a probe at 4 alone priced 2 rows 10% above 1 (measured 1.00-1.06), and drafts went unmade
PRIOR_SHAPE = (1.0, 1.33, 1.78, 2.6)  # cost of PROBE_ROWS relative to one row before the first probe (PyTorch matmuls)
PRIOR_SHAPE_NATIVE = (1.0, 1.07, 1.47, 3.0)  # the same with the native kernels (measured: 1.1K context, 2-vCPU AMD
#                                             EPYC, AVX2 only: `python -m tokenswift.bench rows`, 1 / 3 / 6 / 12 rows;
#                                             a Xeon with AMX measured 1.0 / 1.2 / 1.85 at 1 / 4 / 12)
PROBE_TIMED = 6  # a probe times the points up to this many rows; beyond, the prior's shape scales the last timed
#                 one until plans that wide correct it (a 12-row verification costs 3 steps here, and at temperature
#                 1 plans rarely pass 4 rows)
MAX_ROWS = 48  # the largest verification (root included) the planner considers
MIN_GAIN = 1.05  # a plan drafts only when it expects at least this many times the tokens per second of a plain
#                 step: drafts that barely pay on paper lose to the costs no model prices (measured: paper sampling)
MIN_REACH = 0.01  # candidates the walk would reach and accept with less than this probability (after calibration)
#                  are not offered: a row costs at least 1-4% of a step here (1 to 3 rows), so such a node never pays
PRIOR_STEPS = 9  # plain steps whose median time scales the prior curve until the first probe
REPROBE_GROWTH = 2.0  # re-probe when the context has grown by this factor since the last probe ...
REPROBE_MIN_TOKENS = 2048  # ... and by at least this many tokens (short contexts cost about the same)


class AcceptanceStats:
    """Decayed acceptance rates per node kind, with a prior worth `prior_weight` observations."""

    def __init__(self, decay: float = 0.97, prior_weight: float = 2.0) -> None:
        self.decay, self.prior_weight = decay, prior_weight
        self._counts: dict[Hashable, list[float]] = {}  # key -> [accepted, visited]

    def rate(self, key: Hashable, prior: float) -> float:
        accepted, visited = self._counts.get(key, (0.0, 0.0))
        return (accepted + prior * self.prior_weight) / (visited + self.prior_weight)

    def observe(self, key: Hashable, accepted: bool) -> None:
        c = self._counts.setdefault(key, [0.0, 0.0])
        c[0] = c[0] * self.decay + (1.0 if accepted else 0.0)
        c[1] = c[1] * self.decay + 1.0


class CostModel:
    """Seconds to verify q rows at the current context, and the iteration's fixed overhead."""

    def __init__(self, prior_shape: tuple[float, ...] = PRIOR_SHAPE) -> None:
        self.prior_shape = prior_shape
        self.rows: list[int] = []
        self.seconds: list[float] = []
        self.probed_context = 0
        self.overhead = 0.0  # drafting + bookkeeping beyond the verification, EMA
        self._seen_overhead = False
        self._plain: list[float] = []  # before the first probe: the latest one-row times (the prior's yardstick)

    def needs_probe(self, context: int) -> bool:
        """True before the first probe and when the context has grown enough since the last one."""
        if not self.probed_context:
            return True
        grown = max(REPROBE_GROWTH * self.probed_context, self.probed_context + REPROBE_MIN_TOKENS)
        return context >= grown

    def seed(self, step_s: float) -> None:
        """Before any probe: a prior curve scaled from the measured one-row step (a shape measured at 1K context,
        see PRIOR_SHAPE_NATIVE), the median of the latest PRIOR_STEPS plain steps, so that one slow step
        (a cold first call, a hiccup of the machine) cannot price rows out for the whole run. The probe
        runs only once a plan under this prior wants to draft, so a run where nothing pays never probes."""
        if self.probed_context:
            return
        self._plain = (self._plain + [step_s])[-PRIOR_STEPS:]
        one_row = sorted(self._plain)[len(self._plain) // 2]
        self.rows, self.seconds = list(PROBE_ROWS), [one_row * f for f in self.prior_shape]

    def probe(self, verify: Callable[[int], None], context: int) -> None:
        """verify(q) runs one verification of q rows (forward, logits, decision), timed once per q up to
        PROBE_TIMED (a probe at 1K context costs about 2.5 steps; every iteration corrects the curve afterwards,
        so one hiccup does not mislead a whole run). One row is not timed again: plain steps measure it."""
        times = []
        for i, q in enumerate(PROBE_ROWS):
            if q == 1 and self.rows:  # one row is measured by every plain step already
                times.append(self.seconds[0])
                continue
            if q > PROBE_TIMED and i:  # the prior's step from the last timed point
                times.append(times[-1] * self.prior_shape[i] / self.prior_shape[i - 1])
                continue
            t = time.perf_counter()
            verify(q)
            times.append(time.perf_counter() - t)
        for i in range(1, len(times)):  # more rows never cost less: smooth out timing noise
            times[i] = max(times[i], times[i - 1])
        self.rows, self.seconds, self.probed_context = list(PROBE_ROWS), times, context

    def cost(self, q: int) -> float:
        """Interpolated seconds for q rows (linear beyond the last probe)."""
        rows, sec = self.rows, self.seconds
        if q <= rows[0]:
            return sec[0]
        for i in range(1, len(rows)):
            if q <= rows[i]:
                w = (q - rows[i - 1]) / (rows[i] - rows[i - 1])
                return sec[i - 1] * (1 - w) + sec[i] * w
        slope = (sec[-1] - sec[-2]) / (rows[-1] - rows[-2])
        return sec[-1] + slope * (q - rows[-1])

    def table(self, n: int) -> list[float]:
        """[cost(0), cost(1), ..., cost(n)] in one walk over the probe points (a plan prices every prefix)."""
        rows, sec = self.rows, self.seconds
        out = [sec[0]] * (min(n, rows[0]) + 1)
        seg, last = 1, len(rows) - 1
        for q in range(len(out), n + 1):
            while seg < last and q > rows[seg]:
                seg += 1
            lo, hi = rows[seg - 1], rows[seg]
            out.append(sec[seg - 1] + (sec[seg] - sec[seg - 1]) * (q - lo) / (hi - lo))  # beyond the last: its slope
        return out

    def observe(self, q: int, verify_s: float, other_s: float, rate: float = 0.1) -> None:
        """One iteration's measured verification time for q rows and its other time (drafting, bookkeeping)."""
        if q == 1 or not self.rows:  # before the first probe the prior follows the plain steps (seed)
            self.seed(verify_s)
        predicted = self.cost(q)
        if self.probed_context and predicted > 0:
            factor = 1.0 + rate * (verify_s / predicted - 1.0)
            for i, r in enumerate(self.rows):  # correct the probe points around q
                lo = self.rows[i - 1] if i > 0 else 0
                hi = self.rows[i + 1] if i + 1 < len(self.rows) else 10**9
                if lo < q < hi:
                    self.seconds[i] *= factor
            for i in range(1, len(self.seconds)):  # more rows never cost less
                self.seconds[i] = max(self.seconds[i], self.seconds[i - 1])
        if not self._seen_overhead:
            self.overhead, self._seen_overhead = other_s, True
        else:
            self.overhead += rate * (other_s - self.overhead)


@dataclass
class Plan:
    """Which candidate nodes to verify, and why."""

    keep: list[int]  # candidate node indices, parents before children
    expected_tokens: float
    note: str = field(default="")


class Calibration:
    """Per-node rates are optimistic where the planner picks the best-looking nodes (and where merged
    proposals take the larger rate): this tracks accepted drafted tokens over the expected ones, decayed,
    and scales expectations by it. Every iteration decays the evidence, those that drafted nothing too, so
    an unlucky start cannot shut drafting off for good (the factor returns to its prior of 1)."""

    def __init__(self, decay: float = 0.95, prior_weight: float = 1.0) -> None:
        self.decay, self.prior_weight = decay, prior_weight
        self.expected = self.actual = 0.0

    @property
    def factor(self) -> float:
        w = self.prior_weight
        return min(1.2, max(0.2, (self.actual + w) / (self.expected + w)))

    def observe(self, expected_drafted: float, accepted_drafted: int) -> None:
        self.expected = self.expected * self.decay + expected_drafted
        self.actual = self.actual * self.decay + accepted_drafted


class Payoff:
    """What drafting actually yields: tokens per second of the iterations that verified drafts against those of
    plain (AR-cost) iterations, both measured whole (draft, verify and bookkeeping). The cost model prices
    rows and the acceptance stats price tokens, but some costs escape both (caches a wider step evicts, Python
    per node); where drafted iterations yield less per second than plain ones, expected drafted tokens are
    scaled down by that ratio. The evidence decays every iteration towards a prior of 1, so drafting is
    tried again after a while."""

    def __init__(self, decay: float = 0.97, prior_tokens: float = 3.0) -> None:
        self.decay, self.prior_tokens = decay, prior_tokens
        self.drafted_tokens = self.drafted_s = self.plain_tokens = self.plain_s = 0.0

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        d = self.decay
        self.drafted_tokens, self.drafted_s = self.drafted_tokens * d, self.drafted_s * d
        self.plain_tokens, self.plain_s = self.plain_tokens * d, self.plain_s * d
        if drafted:
            self.drafted_tokens += tokens
            self.drafted_s += seconds
        else:
            self.plain_tokens += tokens
            self.plain_s += seconds

    @property
    def factor(self) -> float:
        """min(1, drafted rate / plain rate), with `prior_tokens` of drafted evidence at the plain rate."""
        if self.plain_tokens <= 0.0 or self.plain_s <= 0.0:
            return 1.0
        plain_rate = self.plain_tokens / self.plain_s
        drafted_rate = (self.drafted_tokens + self.prior_tokens) / (self.drafted_s + self.prior_tokens / plain_rate)
        return min(1.0, drafted_rate / plain_rate)


def choose(reach: list[float], depths: list[int], costs: CostModel, max_rows: int = MAX_ROWS,
           calibration: float = 1.0, min_gain: float | None = None) -> Plan:
    """reach[i]: probability that the walk accepts candidate node i (its path's product of rates);
    node 0 is the root. Returns the prefix (by decreasing reach, shallower first on ties) that maximizes
    expected tokens per second, with expected drafted tokens scaled by `calibration`; no node at all unless
    that rate is at least `min_gain` (default MIN_GAIN) times a plain step's."""
    min_gain = MIN_GAIN if min_gain is None else min_gain
    order = sorted(range(1, len(reach)), key=lambda i: (-reach[i], depths[i], i))[: max_rows - 1]
    overhead = costs.overhead
    prices = costs.table(len(order) + 1)  # prices[q]: seconds to verify q rows
    plain_s = prices[1] + overhead
    best_q, best_rate, best_tokens, best_s = 0, 1.0 / plain_s, 1.0, plain_s
    tokens = 1.0
    for q in range(1, len(order) + 1):
        tokens += calibration * reach[order[q - 1]]
        seconds = prices[q + 1] + overhead
        if tokens > best_rate * seconds:
            best_q, best_rate, best_tokens, best_s = q, tokens / seconds, tokens, seconds
    if best_q and best_rate < min_gain / plain_s:  # not worth it: a plain step
        best_q, best_tokens, best_s = 0, 1.0, plain_s
    note = f"{best_q} nodes: expected {best_tokens:.2f} tokens for {best_s / prices[1]:.2f} steps"
    return Plan(order[:best_q], best_tokens, note)
