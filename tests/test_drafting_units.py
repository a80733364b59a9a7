"""Pure pieces of fast drafting: batched per-node penalty windows and decisions, the suffix index, the
uniform stream, and the cost-aware planner."""
import pytest
import torch

import tokenswift as ts
from tokenswift.auto import PROBE_ROWS, AcceptanceStats, Calibration, CostModel, choose
from tokenswift.sampling import UniformStream, decide, decide_rows, seen_rows
from tokenswift.suffix import SuffixIndex

from conftest import random_heads, tiny_model


def window_of(history: list[int], extra: list[int], window: int) -> list[int]:
    """The penalty window exactly as AR sees it after committing `extra` (the reference definition)."""
    return (history + extra)[-window:]


def test_seen_rows_equal_each_nodes_own_window():
    gen = torch.Generator().manual_seed(0)
    history = torch.randint(0, 12, (30,), generator=gen)
    extras = [[], [3], [3, 11], [5, 5, 7], [1, 2, 3, 4, 5, 6]]
    for window in (1, 4, 8, 29, 30, 40):
        seen = seen_rows(history, 30, window, extras, 12)
        for row, extra in enumerate(extras):
            expected = torch.zeros(12, dtype=torch.bool)
            expected[window_of(history.tolist(), extra, window)] = True
            assert seen[row].tolist() == expected.tolist(), (window, extra)


def test_batched_decisions_equal_single_row_decisions():
    """Every row of one batched call gives the token and distribution of its own single-row call."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 50, generator=gen) * 3
    history = torch.randint(0, 50, (20,), generator=gen)
    extras = [[], [4], [4, 9], [7], [7, 7], [1, 2, 3]]
    uniforms = torch.rand(6, generator=gen, dtype=torch.float64)
    for settings in (ts.Settings(), ts.Settings(penalty=1.5, penalty_window=10),
                     ts.Settings(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, eta=0.01, penalty=1.3,
                                 penalty_window=10)):
        tokens, probs = decide_rows(logits, seen_rows(history, 20, 10, extras, 50)
                                    if settings.penalty != 1.0 else None, settings, uniforms)
        for r, extra in enumerate(extras):
            window = torch.tensor(window_of(history.tolist(), extra, 10))
            token, dist = decide(logits[r], window, settings, float(uniforms[r]))
            assert token == tokens[r]
            assert torch.allclose(dist, probs[r])


def test_uniform_stream_peek_does_not_consume():
    a, b = UniformStream(3), UniformStream(3)
    first = a.peek(5).clone()
    assert torch.equal(a.peek(5), first)
    a.take(2)
    assert float(a.peek(1)[0]) == float(first[2])
    assert [b.next() for _ in range(300)] == [UniformStream(3).peek(300)[i].item() for i in range(300)]


def test_suffix_index_finds_the_longest_latest_match_and_loops():
    index = SuffixIndex(max_match=4)
    index.extend([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3])
    m, cont = index.lookup(3)
    assert m == 3 and cont == [4, 5, 1]  # the latest earlier "1 2 3" is followed by 4 5 1
    index.extend([7])
    assert index.lookup(2) == (0, [])  # 7 never occurred before
    loop = SuffixIndex()
    loop.extend([8, 6, 6, 6])
    assert loop.lookup(5) == (2, [6, 6, 6, 6, 6])  # a period-1 loop continues itself


def test_suffix_index_follows_the_occurrence_that_agrees_longest():
    # a phrase of 5 tokens repeats, with a line break (9) after every third: the last 4 tokens occurred one
    # phrase back too, but only the occurrence one period of 16 back continues with the break
    phrase_lines = ([1, 2, 3, 4, 5] * 3 + [9]) * 4
    text = phrase_lines + [1, 2, 3, 4, 5] * 3
    index = SuffixIndex(max_match=4, long_match=64, candidates=8)
    index.extend(text)
    m, cont = index.lookup(6)
    assert cont == [9, 1, 2, 3, 4, 5] and m >= 16
    latest_only = SuffixIndex(max_match=4, candidates=0)
    latest_only.extend(text)
    assert latest_only.lookup(6) == (4, [1, 2, 3, 4, 5, 1])  # the latest occurrence alone misses the break
    ties = SuffixIndex(max_match=2, long_match=8, candidates=8)
    ties.extend([6, 5, 7, 1, 2, 3, 5, 7, 1, 2, 4, 5, 7, 1, 2])
    assert ties.lookup(1) == (4, [4])  # equal agreement (5 7 1 2): the later occurrence
    end = list(range(100, 120)) + [1, 2, 3, 4]  # the text's last 24 tokens
    exact = SuffixIndex(max_match=4, long_match=64, candidates=8)
    exact.extend([50] + end + [7] + [51] + end[2:] + [8] + [60] + end)
    assert exact.lookup(1) == (16, [7])  # 24 tokens agree before the first occurrence, 22 before the later one


def test_acceptance_stats_move_from_prior_to_observed_rate():
    stats = AcceptanceStats(decay=1.0, prior_weight=2.0)
    assert stats.rate("k", 0.5) == 0.5
    for _ in range(8):
        stats.observe("k", True)
    assert abs(stats.rate("k", 0.5) - 0.9) < 1e-9  # (8 + 1) / (8 + 2)


def test_planner_keeps_drafts_only_while_they_pay():
    costs = CostModel()
    costs.rows, costs.seconds = [1, 4, 12, 32], [1.0, 1.3, 2.0, 4.0]
    depths = [0, 1, 2, 3, 1]
    sure = choose([1.0, 0.95, 0.9, 0.85, 0.01], depths, costs)
    assert sure.keep == [1, 2, 3] and sure.expected_tokens > 3.6  # the unlikely sibling is not worth its row
    hopeless = choose([1.0, 0.01, 0.001], [0, 1, 2], costs)
    assert hopeless.keep == [] and hopeless.expected_tokens == 1.0  # an AR-cost step
    assert "0 nodes" in hopeless.note


def test_planner_skips_drafts_that_barely_pay():
    """A plan that expects a few percent more tokens per second than a plain step is not worth the costs no
    model prices; the same plan with a margin of 1.0 drafts."""
    costs = CostModel()
    costs.rows, costs.seconds = [1, 4, 12], [1.0, 1.1, 2.0]
    reach = [1.0, 0.07]  # one node: (1 + 0.07) / 1.033 = 1.036 x a plain step's rate
    assert choose(reach, [0, 1], costs, min_gain=1.0).keep == [1]
    marginal = choose(reach, [0, 1], costs, min_gain=1.05)
    assert marginal.keep == [] and "0 nodes" in marginal.note
    assert choose([1.0, 0.5], [0, 1], costs, min_gain=1.05).keep == [1]


def test_cost_model_interpolates_and_follows_observations():
    costs = CostModel()
    assert costs.needs_probe(100)
    costs.observe(1, 2.0, 0.1)  # no probe yet: one measured step seeds a prior curve
    assert costs.cost(1) == 2.0 and costs.cost(12) > costs.cost(4) > 2.0 and costs.needs_probe(100)
    costs.probe(lambda q: None, context=100)
    assert costs.rows[0] == 1 and all(b >= a for a, b in zip(costs.seconds, costs.seconds[1:]))
    costs.rows, costs.seconds = [1, 4, 12, 32], [1.0, 1.3, 2.0, 4.0]
    assert abs(costs.cost(8) - 1.65) < 1e-9 and costs.cost(64) > 4.0
    assert costs.table(70) == pytest.approx([costs.cost(q) for q in range(71)], abs=1e-12)  # a plan's price list
    costs.observe(1, 0.5, 0.0, rate=1.0)  # a cheaper one-row step than probed: the yardstick follows it
    assert costs.cost(1) == 0.5 and all(b >= a for a, b in zip(costs.seconds, costs.seconds[1:]))
    costs.rows, costs.seconds, costs._seen_overhead = [1, 4, 12, 32], [1.0, 1.3, 2.0, 4.0], False
    for _ in range(100):
        costs.observe(8, 3.3, 0.5)  # this machine turns out twice as slow around 8 rows
    assert 3.0 < costs.cost(8) < 3.5 and abs(costs.overhead - 0.5) < 1e-6
    assert costs.needs_probe(2148) and not costs.needs_probe(2000)


def test_cost_probe_times_only_row_counts_a_plan_may_verify():
    timed = []
    costs = CostModel()
    costs.observe(1, 1.0, 0.0)
    costs.probe(timed.append, context=100)
    assert timed == [3, 6, 12]  # one row is every plain step's measurement
    capped, timed[:] = CostModel(), []
    capped.observe(1, 1.0, 0.0)
    capped.probe(timed.append, context=100, max_rows=6)  # e.g. a GQA model whose native stack serves 6 rows
    assert timed == [3, 6] and capped.seconds[3] >= capped.seconds[2]  # 12 rows priced, not run


def test_one_slow_first_step_does_not_price_rows_out_for_the_run():
    """Before the first probe the prior curve scales with the median of the latest plain steps: a cold first
    step (kernels built, caches empty) 3x slower than the rest is forgotten within a few steps."""
    shape = (1.0, 1.1, 1.3, 1.7)  # at PROBE_ROWS
    costs = CostModel(prior_shape=shape)
    costs.observe(1, 3.0, 0.0)
    for _ in range(8):
        costs.observe(1, 1.0, 0.0)
    assert [costs.cost(q) for q in PROBE_ROWS] == pytest.approx(shape, abs=1e-9)


def test_ngram_rankings_are_cached_until_their_bucket_changes():
    from tokenswift.ngram import NGramTable

    table = NGramTable(3)
    table.extend([1, 2, 3, 1, 2, 3])
    first = table.top(1, 2)
    assert first == [((2, 3), 2)] and table.top(1, 2) is first  # the cached ranking is reused
    table.extend([1, 5, 6, 1, 5, 6, 1, 5, 6])  # (1, 5, 6) becomes the most frequent 3-gram starting with 1
    assert table.top(1, 2) == [((5, 6), 3), ((2, 3), 2)]


def test_calibration_recovers_after_iterations_that_drafted_nothing():
    calibration = Calibration()
    for _ in range(5):
        calibration.observe(2.0, 0)  # an unlucky start: nothing accepted
    assert calibration.factor < 0.3
    for _ in range(100):
        calibration.observe(0.0, 0)  # plans that kept no node still let old evidence fade
    assert calibration.factor > 0.9


def test_payoff_scales_drafting_down_where_it_yields_less_per_second_and_recovers():
    from tokenswift.auto import Payoff

    pay = Payoff()
    assert pay.factor == 1.0  # no evidence yet
    for _ in range(20):
        pay.observe(False, 1, 0.010)  # plain steps: 100 tok/s
        pay.observe(True, 2, 0.030)  # drafted iterations: 67 tok/s
    assert 0.6 < pay.factor < 0.8
    for _ in range(200):
        pay.observe(False, 1, 0.010)
    assert pay.factor > 0.99  # the evidence decayed: drafting is tried again
    for _ in range(20):
        pay.observe(False, 1, 0.010)
        pay.observe(True, 3, 0.015)  # drafting pays: never scaled up beyond 1
    assert pay.factor == 1.0


def test_kept_ngram_rankings_stay_what_a_full_sort_gives():
    """top(token, k) keeps its rankings and updates them as n-grams arrive; they must equal a fresh sort by
    (count, most recent) every time."""
    import heapq
    import random

    from tokenswift.ngram import NGramTable

    rng = random.Random(0)
    for _ in range(20):
        table = NGramTable(4)
        table.extend([rng.randrange(6) for _ in range(40)])
        for _ in range(200):
            token = rng.randrange(6)
            for k in (1, 3, 20):
                bucket = table._counts.get(token, {})
                fresh = heapq.nlargest(k, bucket.items(), key=lambda item: (item[1], table._last_seen[(token, *item[0])]))
                assert table.top(token, k) == fresh
            table.extend([rng.randrange(6) for _ in range(rng.randrange(1, 4))])


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, min_p=0.1, penalty=1.2)], ids=["greedy", "paper"])
def test_tree_events_carry_the_targets_probabilities(sampling):
    """The per-node target probabilities the app's tree view shows are read from the right row and column: at a
    visited node the token the target chose has positive probability (greedy: the largest among its siblings),
    and the children of one node never hold more than its whole distribution."""
    model = tiny_model("llama-gqa", seed=3)
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    checked = 0
    for step in gen.stream(prompt, ts.Settings(tree="1x3x3x3", **sampling), 60, seed=2):
        nodes = step.tree
        for i, node in enumerate(nodes):
            if node.target_sample is None:  # not visited
                continue
            kids = [c for c in nodes[1:] if c.parent == i]
            probs = [c.target_prob for c in kids]
            assert all(p is not None and 0.0 <= p <= 1.0 + 1e-6 for p in probs)
            assert sum(probs) <= 1.0 + 1e-5
            for c in kids:
                if c.token == node.target_sample:
                    assert c.accepted and c.target_prob > 0.0
                    if not sampling:
                        assert c.target_prob >= max(probs) - 1e-7
                    checked += 1
    assert checked > 0  # some drafted token was accepted and its probability checked
