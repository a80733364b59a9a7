"""Sampled TokenSwift is distributed exactly as AR: a chi-square test on the joint distribution of the
first three new tokens cannot tell them apart, and the same test does catch the original per-row rule."""
import collections
import functools
import time

import pytest
import torch

import tokenswift as ts

from conftest import NATIVE_FAMILY, native_stack_or_skip, random_heads, tiny_model

VOCAB = 8
SAMPLES = 3000
SETTINGS = dict(temperature=0.9, top_p=0.95, min_p=0.05, penalty=1.3, penalty_window=8, tree="1x3x3x3", ngram_topk=4)
PROMPT = [1, 5, 2, 7, 3, 1, 5]


@functools.lru_cache(maxsize=None)
def generator():
    model = tiny_model("llama-gqa", seed=21, vocab=VOCAB)
    return ts.Generator(model, heads=random_heads(model, scale=0.3, seed=4))


def joint_counts(method: str, seeds: range, **overrides) -> collections.Counter:
    gen = generator()
    settings = ts.Settings(**{**SETTINGS, **overrides})
    counts = collections.Counter()
    for seed in seeds:
        out = gen.generate(PROMPT, settings, max_new_tokens=3, method=method, seed=seed).token_ids
        counts[tuple(out)] += 1
    return counts


def chi2_homogeneity(a: collections.Counter, b: collections.Counter, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Two-sample chi-square test; cells with a small expected count are pooled. Returns (stat, p, df)."""
    na, nb = sum(a.values()), sum(b.values())
    cells = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    rows, pooled = [], [0, 0]
    for c in cells:
        total = a[c] + b[c]
        if min(total * na, total * nb) / (na + nb) >= min_expected:
            rows.append((a[c], b[c]))
        else:
            pooled[0] += a[c]
            pooled[1] += b[c]
    if sum(pooled) > 0:
        rows.append(tuple(pooled))
    stat = 0.0
    for oa, ob in rows:
        total = oa + ob
        ea, eb = total * na / (na + nb), total * nb / (na + nb)
        stat += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    df = len(rows) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, p, df


@functools.lru_cache(maxsize=None)
def ar_counts():
    return joint_counts("ar", range(0, SAMPLES))


def test_sampled_tokenswift_matches_ar():
    t0 = time.perf_counter()
    ar = ar_counts()
    ts_counts = joint_counts("tokenswift", range(SAMPLES, 2 * SAMPLES))  # independent seeds
    stat, p, df = chi2_homogeneity(ar, ts_counts)
    print(f"\n[sampling] exact rule: chi2={stat:.1f} df={df} p={p:.3f} ({time.perf_counter() - t0:.0f}s)")
    assert len(ar) > 20, "the test distribution is too concentrated to say anything"
    assert p > 0.01


@pytest.mark.slow  # 3,000 more samples (the same-seed test below runs auto's trees in the fast tier)
def test_sampled_auto_tree_matches_ar():
    """The cost-aware tree drafts from suffix matches, fused heads and 4-grams: still exactly AR's law."""
    ar = ar_counts()
    auto = joint_counts("tokenswift", range(2 * SAMPLES, 3 * SAMPLES), tree="auto")
    stat, p, df = chi2_homogeneity(ar, auto)
    print(f"\n[sampling] auto tree: chi2={stat:.1f} df={df} p={p:.3f}")
    assert p > 0.01
    drafted = sum(generator().generate(PROMPT, ts.Settings(**{**SETTINGS, "tree": "auto"}), 3, seed=seed)
                  .stats["accepted_by_source"].get("head", 0) for seed in range(20))
    assert drafted > 0, "auto never drafted here: the test would not exercise its verification"


@pytest.mark.slow  # 3,000 more samples: the test's power, not the engine's
def test_same_test_detects_the_original_per_row_rule():
    ar = ar_counts()
    biased = joint_counts("tokenswift", range(SAMPLES, 2 * SAMPLES), acceptance="per_row_biased")
    stat, p, df = chi2_homogeneity(ar, biased)
    print(f"\n[sampling] per-row rule: chi2={stat:.1f} df={df} p={p:.2e}")
    assert p < 0.01


@pytest.mark.parametrize("family", ["llama-gqa", NATIVE_FAMILY])
def test_same_seed_gives_the_same_tokens_as_ar(family):
    """One uniform per produced token in the same order: with equal seeds TokenSwift reproduces AR's
    sample path exactly (up to floating-point ties, which these seeds do not hit); NATIVE_FAMILY's through the
    native decoder stack."""
    model = tiny_model(family, seed=5)
    gen = ts.Generator(model, heads=random_heads(model))
    if family == NATIVE_FAMILY:
        native_stack_or_skip(gen)
    prompt = list(range(10, 40))
    settings = ts.Settings(temperature=1.0, min_p=0.02, penalty=1.2, penalty_window=32, kv_budget=48, kv_sink=4)
    for seed in range(6):
        ar = gen.generate(prompt, settings, 200, method="ar", seed=seed).token_ids
        draft, tree = [("paper", "1x3x3x3"), ("fused", "1x3x3x3"), ("paper", "auto")][seed % 3]
        fast = gen.generate(prompt, settings.with_changes(draft=draft, tree=tree), 200, method="tokenswift", seed=seed)
        assert fast.token_ids == ar, f"seed {seed}"
        if tree != "auto":  # auto rightly drafts nothing for random heads on random text (drafts do not pay)
            assert fast.stats["mean_accepted"] > 1.0
