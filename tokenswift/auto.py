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

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

from . import events as ev
from .datastore import ORDERS as DATASTORE_ORDERS
from .drafters import DraftingModel, Proposal, ReuseIndex, fused_input
from .kinds import PartialMode, Source
from .partial_cache import PartialKVCache
from .run_state import RunState
from .settings import Settings
from .tree import DraftTree, build_head_paths, parse_tree, tree_widths
from .verifier import Verdict, Verifier

PROBE_ROWS = (1, 3, 6, 12)  # rows timed by a probe; costs in between are interpolated, beyond extrapolated. Where
#                            the products take rows in passes of 3 (AVX2), 1-3 rows cost about one and 4 a step more:
#                            a probe at 4 alone priced 2 rows 10% above 1 (measured 1.00-1.06), and drafts went unmade
PRIOR_SHAPE = (1.0, 1.33, 1.78, 2.6)  # cost of PROBE_ROWS relative to one row before the first probe (PyTorch matmuls)
PRIOR_SHAPE_NATIVE = (1.0, 1.07, 1.47, 3.0)  # the same with the native kernels (measured: 1.1K context, 2-vCPU AMD
#                                             EPYC, AVX2 only: `python -m tokenswift.bench rows`, 1 / 3 / 6 / 12 rows;
#                                             a Xeon with AMX measured 1.0 / 1.2 / 1.85 at 1 / 4 / 12)
MAX_ROWS = 48  # the largest verification (root included) the planner considers
MIN_GAIN = 1.05  # a plan drafts only when it expects at least this many times the tokens per second of a plain
#                 step: drafts that barely pay on paper lose to the costs no model prices (measured: paper sampling)
MIN_REACH = 0.01  # candidates the walk would reach and accept with less than this probability (after calibration)
#                  are not offered: a row costs at least 1-4% of a step here (1 to 3 rows), so such a node never pays
PRIOR_STEPS = 9  # plain steps whose median time scales the prior curve until the first probe
REPROBE_GROWTH = 2.0  # re-probe when the context has grown by this factor since the last probe ...
REPROBE_MIN_TOKENS = 2048  # ... and by at least this many tokens (short contexts cost about the same)
AUTO_HEAD_TREE = "3x1x1"  # the head candidates auto may draw from (it keeps only those that pay; measured:
#                           it rarely keeps more than 10 nodes, and every offered node costs Python time)
PLANNER_REST_LOG2 = 5  # the planner rests at most 2**5 iterations after plans that kept nothing
HEAD_REST_LOG2 = 6  # unused heads are consulted at least every 2**6 iterations (a consult, three head blocks and three
#                     LM-head rows, costs about 0.2 ms in the decode loop through the native heads, 0.8 ms without;
#                     at paper sampling they rarely pay: consulting at least every 2**3 measured the same, 0.989
#                     against 0.991 in the app-like check)
HEAD_CHEAP_RATIO = 20  # a consult costing at most 1/20 of a one-row step is not backed off. Measured here (AMX host,
#                        the page's story, greedy + penalty 1.2): SmolLM2-135M's consult 0.80 ms against a 27.7 ms
#                        step, now every iteration: 1.20 -> 1.32 tokens per iteration, 1.09 -> 1.15x over 400 tokens;
#                        the default model's 0.26 ms against 3.6 ms keeps the backoff unless its heads pay (below)
HEAD_PAY_MARGIN = 2.0  # nor are heads whose accepted tokens per consult, each worth about a step, repay a consult's
#                        time this many times over (measured, SmolLM2-135M with heads that read the root, greedy +
#                        penalty 1.2: a consult about 1.1 ms in the loop against a 21 ms step, just above 1/20, left
#                        39 consults in 200 iterations; each consult yields about 0.2-0.3 accepted tokens). While they
#                        pay, the planner does not rest either: 1.28-1.48 -> 1.58-1.59 tokens per iteration (1K Emma)
HEAD_YIELD_DECAY = 0.97  # the decay of that evidence per consult
HEAD_YIELD_PRIOR = (0.5, 2.0)  # its start: 0.5 tokens in 2 consults (without it, heads never consulted never show a yield)
AUTO_NGRAMS = 3  # 4-gram continuations of the root offered to auto
PROBE_AFTER = 16  # iterations before the first cost probe: until then plans price rows by the prior curve
SAMPLED_PRIOR_SCALE = 0.5  # suffix and 4-gram priors when sampling (the stats replace them within a few visits)
SUFFIX_DRAFT = 24  # longest suffix-match chain offered to auto (verbatim loops accept whole chains: 12 -> 24 took
#                   SmolLM2's greedy 2.42-2.47x -> 2.54-2.55x AR on a Zen 4, with chains of up to 15 there, as its
#                   native stack verifies 16 rows at most; the planner still prices every node)
DATASTORE_DRAFT = 4  # longest datastore chain offered to auto (measured: deeper links rarely survive)
DATASTORE_CONTEXT = max(DATASTORE_ORDERS)  # tokens of context a datastore lookup reads
PRIOR_CAP = 0.9  # no prior rate reaches 1 (a child must never look likelier than its parent)


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

    def probe(self, verify: Callable[[int], None], context: int, max_rows: int = MAX_ROWS) -> None:
        """verify(q) runs one verification of q rows (forward, logits, decision), timed once per q (a probe costs
        about 5 steps, once per doubling of the context; every iteration corrects the curve afterwards, so one
        hiccup does not mislead a whole run). One row is not timed again: plain steps measure it. Twelve rows are
        timed too: priced from six by the prior's shape, 12 rows of SmolLM2 came out at 79 ms against 51 measured
        on an AVX-512 CPU without AMX (each row past six at twice its cost), and plans in verbatim loops stopped at
        8 drafted tokens. Points past max_rows (the most the planner may verify) are priced from the last timed
        one by the prior's shape: timing them would run a path no plan takes."""
        times = []
        for i, q in enumerate(PROBE_ROWS):
            if q == 1 and self.rows:  # one row is measured by every plain step already
                times.append(self.seconds[0])
                continue
            if q > max_rows and i:
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


@dataclass
class Rest:
    """A backoff: consecutive idle uses, and the first iteration at which the thing is used again."""
    idle: int = 0
    next: int = 0


@dataclass
class HeadRest(Rest):
    """The heads' backoff, with the decayed evidence of what a consult brings: accepted head tokens and consults
    (starting at HEAD_YIELD_PRIOR, so that heads not yet verified show a yield)."""
    tokens: float = HEAD_YIELD_PRIOR[0]
    consults: float = HEAD_YIELD_PRIOR[1]
    paying: bool = False  # the last consult's verdict: its yield repays a consult HEAD_PAY_MARGIN times over

    def count_consult(self) -> float:
        """Count a consult (decaying the evidence); returns the accepted head tokens per consult before it."""
        rate = self.tokens / max(self.consults, 1.0)
        self.tokens, self.consults = self.tokens * HEAD_YIELD_DECAY, self.consults * HEAD_YIELD_DECAY + 1.0
        return rate


def head_tokens(keys: list[list], path: list[int]) -> tuple[int, int]:
    """Accepted nodes (`path`) the heads proposed: (with or without another source, only the heads). A consult's
    yield counts the second: a token another source offered too would have been verified without the heads
    (measured, default model, greedy + penalty 1.2: 32 head-only and 78 merged tokens in 372 consults; counting the
    merged ones kept its heads 'paying' and its planner from resting, 1.32x -> 1.15x; SmolLM2-135M: 129 and 175 in
    631 consults, its heads still pay)."""
    helped = only = 0
    for n in path:
        heads = [kind[0] == Source.HEAD for kind in keys[n]]
        helped += any(heads)
        only += bool(heads) and all(heads)
    return helped, only


class AutoDrafter:
    """`tree="auto"`: every proposal (suffix match, datastore, fused heads, 4-grams) in one candidate trie, each node
    rated by its kind's measured acceptance, pruned to the best expected tokens per second (`choose`); drafting
    always fused (no draft forward: on a CPU it costs about an AR step, measured). Learns from each verdict."""
    drafts = True
    wants_queries = False
    partial: PartialKVCache | None = None
    max_nodes = MAX_ROWS + max(PROBE_ROWS)

    def __init__(self, gen: DraftingModel, settings: Settings) -> None:
        heads = gen.heads
        self.paths = [p for p in parse_tree(AUTO_HEAD_TREE) if len(p) <= heads.num_heads] if heads is not None else []
        self.widths = tree_widths(self.paths)
        self.head_drafts = gen.head_drafts
        self.input = fused_input(gen) if heads is not None else None  # the heads' input: None without heads
        self.partial_mode = PartialMode.FUSED if heads is not None else PartialMode(settings.kv_mode)
        reuse = settings.ngram_reuse
        self.reuse = ReuseIndex(ngrams=reuse and settings.ngram_topk > 0, suffix=reuse)
        self.datastore = gen.datastore if reuse else None
        lean = gen.adapter.lean
        stack = lean.native_stack if lean is not None else None
        # never plans past the native stack's limit: the cost model cannot see the step to the PyTorch path
        self.max_rows = min(MAX_ROWS, stack.max_tokens) if stack is not None else MAX_ROWS
        self.costs = CostModel(PRIOR_SHAPE_NATIVE if lean is not None and lean.native_rows else PRIOR_SHAPE)
        self.stats, self.calibration, self.payoff = AcceptanceStats(), Calibration(), Payoff()
        # a sampled token equals a draft with the target's probability of that draft: lower priors than greedy's
        self.prior_scale = 1.0 if settings.greedy else SAMPLED_PRIOR_SCALE
        self.planner_rest, self.heads_rest = Rest(), HeadRest()  # plans that kept nothing; consults no token came from
        self.probe_rows: Callable[[int], None] | None = None

    def start(self, state: RunState, verifier: Verifier, queries: list[torch.Tensor]) -> None:
        self.reuse.update(state.ids)
        self.probe_rows = verifier.probe_rows

    def propose(self, state: RunState) -> Proposal:
        last = state.ids[-1]
        root = DraftTree.with_root(last)
        if not self.costs.rows:  # the first iteration: an AR-cost step, which also measures the one-row cost
            return Proposal(root, plain=True, note="0 nodes: measuring this machine's step", keys=[[]])
        if state.iteration < self.planner_rest.next:  # nothing paid lately: rest (its Python costs ~6% of a step)
            return Proposal(root, plain=True, keys=[[]],
                            note=f"0 nodes: no draft paid in the last {self.planner_rest.idle} plans")
        cand = DraftTree.with_root(last)
        rates, keys, reach = [1.0], [[]], [1.0]
        self.reuse.update(state.ids)
        scale = self.calibration.factor * self.payoff.factor
        # a node whose walk probability (times the scale) is below MIN_REACH could never pay for its row, and its
        # descendants are less likely still: a proposal is cut there (at temperature 1 most chains end within
        # a node or two, so planning stays cheap; greedy chains are likely and go on)
        floor = MIN_REACH / max(scale, 1e-9)
        rate_of, children, add_node = self.stats.rate, cand.children, cand.add_node

        def link(node: int, token: int, source: str, prob: float, kind: tuple, prior: float) -> int | None:
            """The child of `node` for this proposed token (made if new and likely enough), or None where cut."""
            rate = rate_of(kind, prior)
            child = children[node].get(token)
            if child is None:
                likely = reach[node] * rate
                if likely < floor:
                    return None
                child = add_node(node, token, source, prob)
                rates.append(rate)
                keys.append([kind])
                reach.append(likely)
            else:  # merged proposals: the larger rate (reach is recomputed from the final rates below)
                if rate > rates[child]:
                    rates[child] = rate
                keys[child].append(kind)
            return child

        def add(tokens: list[int], source: str, probs: list[float], kinds: list[tuple], priors: list[float]) -> None:
            node: int | None = 0
            for i, token in enumerate(tokens):
                node = link(node, token, source, probs[i], kinds[i], priors[i])
                if node is None:
                    return

        suffix, ngrams = self.reuse.suffix, self.reuse.ngrams
        if suffix is not None:
            m, cont = suffix.lookup(SUFFIX_DRAFT)
            if cont:
                kinds, prior, priors = _suffix_kinds(m), (0.6 if m >= 3 else 0.3) * self.prior_scale, []
                for j, kind in enumerate(kinds[: len(cont)]):  # a chain bucket not yet verified expects the rate of
                    if j and kind != kinds[j - 1]:  # the bucket before it: a chain accepted to its end is offered
                        prior = min(PRIOR_CAP, rate_of(kinds[j - 1], prior))  # deeper next time
                    priors.append(prior)
                add(cont, Source.NGRAM, [1.0] * len(cont), kinds, priors)
        if self.datastore is not None:  # what followed the last tokens in the model's datastore: a chain, plus the
            context = state.ids[-DATASTORE_CONTEXT:]  # runner-up continuation at depth 1
            node = 0
            for depth in range(1, DATASTORE_DRAFT + 1):
                order, found = self.datastore.lookup(context)
                if not found:
                    break
                if depth == 1:
                    for token, share in found[1:]:
                        link(0, token, Source.NGRAM, share, (Source.DATASTORE, order, _prob_bucket(share), 1),
                             min(PRIOR_CAP, share * self.prior_scale))
                token, share = found[0]
                node = link(node, token, Source.NGRAM, share, (Source.DATASTORE, order, _prob_bucket(share), min(depth, 3)),
                            min(PRIOR_CAP, share * self.prior_scale))
                if node is None:  # cut: the next links would be less likely still
                    break
                context = context[1:] + [token]
        consult_heads = bool(self.paths) and self.input.hidden is not None and state.iteration >= self.heads_rest.next
        consult_s = 0.0
        if consult_heads:
            t_consult = time.perf_counter()
            cands, cprobs = self.head_candidates(last)
            consult_s = time.perf_counter() - t_consult
            for tokens, p in build_head_paths(cands, cprobs, self.paths):
                add(tokens, Source.HEAD, p, [(Source.HEAD, d + 1, _prob_bucket(q)) for d, q in enumerate(p)], p)
        if ngrams is not None:
            found = ngrams.top(last, AUTO_NGRAMS)
            total = sum(c for _, c in found) or 1
            for cont, count in found:
                share = count / total
                add(list(cont), Source.NGRAM, [share] * len(cont), _ngram_kinds(_prob_bucket(share), len(cont)),
                    [0.3 * share * self.prior_scale] * len(cont))

        for i in range(1, len(cand)):  # from the final (merged) rates
            reach[i] = reach[cand.parents[i]] * rates[i]
        plan = choose(reach, cand.depths, self.costs, self.max_rows, calibration=scale)
        probe_s = 0.0
        if plan.keep and state.iteration >= PROBE_AFTER and self.costs.needs_probe(len(state.ids)):
            # drafting looks worth it, and the acceptance rates rest on some evidence: measure, then decide
            t = time.perf_counter()
            self.costs.probe(self.probe_rows, len(state.ids), self.max_rows)
            probe_s = time.perf_counter() - t
            plan = choose(reach, cand.depths, self.costs, self.max_rows, calibration=scale)
        tree = DraftTree.with_root(last)
        node_of = {0: 0}
        kept_keys: list[list] = [[]]
        for i in plan.keep:
            node_of[i] = tree.add_node(node_of[cand.parents[i]], cand.tokens[i], cand.sources[i], cand.draft_probs[i])
            kept_keys.append(keys[i])
        self._rest(state.iteration, bool(plan.keep), consult_s if consult_heads else None)
        return Proposal(tree, plain=len(tree) == 1, note=plan.note, keys=kept_keys,
                        expected=sum(reach[i] for i in plan.keep), probe_s=probe_s)

    def _rest(self, iteration: int, kept: bool, consult_s: float | None) -> None:
        """Plans that keep nothing in a row: after the second, the planner rests 1, 2, 4, ... then at most 32
        iterations, unless the heads pay (below). Heads whose tokens are not accepted are consulted after 2, 4, 8,
        ... then every 64 iterations (an accepted head token, seen after the verification, resets that), unless a
        consult is cheap against a step (a large model's) or its accepted tokens repay it (HEAD_PAY_MARGIN): then
        every iteration, as its rates are measured only where its nodes are verified."""
        heads = self.heads_rest
        if consult_s is not None:  # the heads were consulted, in consult_s seconds
            heads.idle += 1
            step_s = self.costs.seconds[0] if self.costs.seconds else 0.0
            planning_s = max(consult_s, self.costs.overhead)  # a consult, and the plan it keeps from resting
            heads.paying = heads.count_consult() * step_s >= HEAD_PAY_MARGIN * planning_s
            cheap = heads.paying or consult_s * HEAD_CHEAP_RATIO <= step_s
            heads.next = iteration + (1 if cheap else 2 ** min(heads.idle, HEAD_REST_LOG2))
        rest = self.planner_rest
        rest.idle = 0 if kept else rest.idle + 1
        resting = rest.idle >= 2 and not heads.paying  # paying heads are worth a plan every iteration
        rest.next = iteration + (2 ** min(rest.idle - 2, PLANNER_REST_LOG2) if resting else 1)

    def head_candidates(self, root: int) -> tuple[list[list[int]], list[list[float]]]:
        """Ranked tokens and their probabilities per depth: the raw heads over the drafting vocabulary (their rates
        are measured), from the fused hidden state and the tree's root (`Generator.head_drafts`)."""
        cands, cprobs = self.head_drafts(self.input.hidden, len(self.widths), max(self.widths), root)
        return [c[:w] for c, w in zip(cands, self.widths)], [p[:w] for p, w in zip(cprobs, self.widths)]

    def plain_events(self, root: int, token: int, detail: bool) -> tuple[list[ev.AcceptedToken], list[ev.TreeNode]]:
        """A plain step: the root's own token is the bonus."""
        nodes = [ev.TreeNode(root, -1, 0, Source.ROOT, 1.0, True, None, token)] if detail else []
        return [ev.AcceptedToken(token, Source.BONUS, 1)], nodes

    def observe_plain(self, state: RunState, proposal: Proposal, h: torch.Tensor, timings: ev.Timings) -> None:
        """A plain step keeps the heads' input current and the one-row cost (every plan's yardstick) measured."""
        if self.input is not None:
            self.input.keep(h, 0)
        probe_s = proposal.probe_s
        self.costs.observe(1, timings.verify_s, timings.draft_s - probe_s + timings.bookkeeping_s)
        self.calibration.observe(0.0, 0)
        self.payoff.observe(False, 1, timings.total_s - probe_s)

    def observe(self, state: RunState, proposal: Proposal, verdict: Verdict, base: int) -> None:
        """Acceptance per node kind where the walk reached the parent, and the calibration of expectations."""
        tree, path, keys = proposal.tree, verdict.path, proposal.keys
        if self.input is not None:
            self.input.keep(verdict.h, verdict.last_row)
        self.calibration.observe(proposal.expected, len(path))
        helped, only = head_tokens(keys, path)
        if helped:  # merged proposals too: the heads are consulted again next iteration
            self.heads_rest.idle, self.heads_rest.next = 0, state.iteration + 1
        self.heads_rest.tokens += only
        on_path = set(path)
        for visited in [0] + path:
            for child in tree.children[visited].values():
                for kind in keys[child]:
                    self.stats.observe(kind, child in on_path)

    def observe_cost(self, proposal: Proposal, verdict: Verdict, timings: ev.Timings) -> None:
        """The verification's measured seconds for its rows, and the whole iteration's yield."""
        probe_s = proposal.probe_s
        other = timings.draft_s - probe_s + timings.bookkeeping_s - verdict.decide_s
        self.costs.observe(len(proposal.tree), timings.verify_s + verdict.decide_s, other)
        self.payoff.observe(True, len(verdict.path) + 1, timings.total_s - probe_s)


@functools.lru_cache(maxsize=None)
def _suffix_kinds(m: int) -> list[tuple]:
    """The acceptance-statistics keys of a suffix-match chain's nodes (match length m, by chain position)."""
    return [(Source.SUFFIX, m, _chain_bucket(j)) for j in range(1, SUFFIX_DRAFT + 1)]


@functools.lru_cache(maxsize=None)
def _ngram_kinds(bucket: int, n: int) -> list[tuple]:
    """The keys of a 4-gram continuation's n nodes whose count share falls in `bucket`."""
    return [(Source.NGRAM, j + 1, bucket) for j in range(n)]


def _chain_bucket(j: int) -> int:
    return j if j <= 2 else 3 if j <= 4 else 5 if j <= 8 else 9 if j <= 16 else 17


def _prob_bucket(p: float) -> int:
    return min(4, int(p * 5))
