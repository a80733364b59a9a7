"""Greedy TokenSwift == our AR == HF greedy `generate`, token for token, for 1,000 new tokens.

Where two outputs diverge, the divergence must be a floating-point tie: the target's top-2 logits at that
position differ by less than 1e-4 (two summation orders may then pick different argmaxes). Such ties are
counted and printed (run with -s to see the report)."""
import functools

import pytest
import torch

import tokenswift as ts

from conftest import FAMILIES, random_heads, tiny_model

NEW = 1000
TIE = 1e-4
PROMPT_LEN = 40
TIES: list[str] = []


@functools.lru_cache(maxsize=None)
def setup(family: str):
    model = tiny_model(family, seed=11)
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, PROMPT_LEN, dtype=torch.long),
                            max_new_tokens=NEW, do_sample=False, pad_token_id=0)[0, PROMPT_LEN:].tolist()
    return model, gen, prompt, hf


def top2_gap(model, ids: list[int], penalty: float = 1.0, window: int = 1024) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    if penalty != 1.0:
        from tokenswift.sampling import apply_penalty

        logits = apply_penalty(logits, torch.tensor(ids[-window:]), penalty)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def assert_same_or_tie(model, prompt, expected, actual, label, penalty=1.0, window=1024):
    assert len(actual) == len(expected) == NEW, label
    for i, (x, y) in enumerate(zip(expected, actual)):
        if x != y:
            gap = top2_gap(model, prompt + expected[:i], penalty, window)
            assert gap < TIE, f"{label}: diverged at new token {i} ({x} vs {y}) with a top-2 logit gap of {gap:.2e}"
            TIES.append(f"{label} at token {i} (gap {gap:.1e})")
            return
    return


@pytest.mark.parametrize("family", FAMILIES)
def test_ar_equals_hf(family):
    model, gen, prompt, hf = setup(family)
    ours = gen.generate(prompt, ts.Settings(), NEW, method="ar").token_ids
    assert_same_or_tie(model, prompt, hf, ours, f"{family} AR vs HF")


CONFIGS = {
    "reuse-dynamic": dict(ngram_reuse=True, kv_mode="dynamic", kv_budget=64, kv_sink=4, kv_recent=16),
    "noreuse-once": dict(ngram_reuse=False, kv_mode="once", kv_budget=64, kv_sink=4, kv_recent=16),
    "reuse-full": dict(ngram_reuse=True, kv_mode="full"),
    "noreuse-dynamic-small-tree": dict(ngram_reuse=False, tree="1x2x2", kv_mode="dynamic", kv_budget=48, kv_sink=4),
    "fused-reuse": dict(draft="fused", ngram_reuse=True),
    "auto": dict(tree="auto"),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("family", FAMILIES)
def test_tokenswift_equals_hf(family, config, monkeypatch):
    if config == "auto":  # rows as if free: auto verifies every candidate it merged (random heads rarely pay)
        monkeypatch.setattr("tokenswift.generator.choose", eager_choose)
    model, gen, prompt, hf = setup(family)
    result = gen.generate(prompt, ts.Settings(**CONFIGS[config]), NEW)
    assert_same_or_tie(model, prompt, hf, result.token_ids, f"{family} TokenSwift[{config}] vs HF")
    assert result.stats["mean_accepted"] > 1.0, "drafts were never accepted: the verification path went untested"


PENALTY = dict(penalty=1.3, penalty_window=64)


def eager_choose(reach, depths, costs, max_rows=None, calibration=1.0):
    """auto's planner on a machine where verifying rows costs nothing: keeps every candidate."""
    from tokenswift import auto

    flat = auto.CostModel()
    flat.rows, flat.seconds = [1, auto.MAX_ROWS], [1.0, 1.0]
    return auto.choose(reach, depths, flat, auto.MAX_ROWS, 1.0, min_gain=1.0)


@pytest.mark.parametrize("reuse,kv_mode,draft,tree", [(True, "dynamic", "paper", "1x3x3x3"),
                                                     (False, "full", "paper", "1x3x3x3"),
                                                     (True, "once", "paper", "1x3x3x3"),
                                                     (True, "dynamic", "fused", "1x3x3x3"),
                                                     (True, "dynamic", "paper", "auto")])
@pytest.mark.parametrize("family", FAMILIES)
def test_tokenswift_equals_ar_with_penalty(family, reuse, kv_mode, draft, tree, monkeypatch):
    if tree == "auto":  # rows as if free, so that auto verifies every candidate it merged (random heads rarely pay)
        monkeypatch.setattr("tokenswift.generator.choose", eager_choose)
    model, gen, prompt, _ = setup(family)
    ar = gen.generate(prompt, ts.Settings(**PENALTY), NEW, method="ar").token_ids
    settings = ts.Settings(ngram_reuse=reuse, kv_mode=kv_mode, kv_budget=64, kv_sink=4, kv_recent=16, draft=draft,
                           tree=tree, **PENALTY)
    result = gen.generate(prompt, settings, NEW)
    assert_same_or_tie(model, prompt, ar, result.token_ids, f"{family} TokenSwift[penalty,{kv_mode},{draft}] vs AR", **{
        "penalty": PENALTY["penalty"], "window": PENALTY["penalty_window"]})
    assert result.stats["mean_accepted"] > 1.0


def test_ngram_only_generator_is_lossless(monkeypatch):
    """No heads at all: drafts come only from reused n-grams (and, under auto, suffix matches)."""
    monkeypatch.setattr("tokenswift.generator.choose", eager_choose)
    model, _, prompt, hf = setup("llama-gqa")
    gen = ts.Generator(model)
    for tree in ("1x3x3x3", "auto"):
        result = gen.generate(prompt, ts.Settings(tree=tree), NEW)
        assert_same_or_tie(model, prompt, hf, result.token_ids, f"llama-gqa n-gram only ({tree}) vs HF")
        assert result.stats["accepted_by_source"].get("ngram", 0) > 0


def teardown_module(module):
    print(f"\n[greedy lossless] floating-point ties that explained a divergence: {len(TIES)}")
    for line in TIES:
        print("  ", line)


@pytest.mark.parametrize("draft", ["paper", "fused", "auto"])
def test_one_token_prompt_and_eos_stop(draft):
    """Edge cases: nothing to prefill; stop_at_eos truncates right after the end-of-sequence token."""
    model, gen, _, _ = setup("llama-gqa")
    tree = "auto" if draft == "auto" else "1x3x3x3"
    draft = "paper" if draft == "auto" else draft
    ar = gen.generate([7], ts.Settings(), 200, method="ar").token_ids
    assert gen.generate([7], ts.Settings(draft=draft, tree=tree, kv_budget=32, kv_sink=4), 200).token_ids == ar

    class Tok:  # a minimal tokenizer stand-in: only the eos id matters here
        eos_token_id = ar[50]

        def decode(self, ids, **kwargs):
            return " ".join(map(str, ids))

    gen.tokenizer = Tok()
    try:
        out = gen.generate([7], ts.Settings(draft=draft, tree=tree, stop_at_eos=True), 200).token_ids
    finally:
        gen.tokenizer = None
    assert out == ar[: ar.index(Tok.eos_token_id) + 1]
