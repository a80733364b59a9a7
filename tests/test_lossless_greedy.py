"""Greedy TokenSwift == our AR == HF greedy `generate`, token for token, for 1,000 new tokens.

Every family runs every case in the full suite (`python -m pytest`); the fast tier (`-m "not slow"`) keeps every
case of the head-size-64 model (NATIVE_FAMILY: the native decoder stack, where this machine builds it) and, for the
head-size-16 families (PyTorch attention), a subset that still runs each configuration and each family.

Where two outputs diverge, the divergence must be a floating-point tie: the target's top-2 logits at that
position differ by less than 1e-4 (two summation orders may then pick different argmaxes). Such ties are
counted and printed (run with -s to see the report)."""
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

import tokenswift as ts
from tokenswift.auto import choose

from conftest import FAMILIES, NATIVE_FAMILY, ROOT, native_stack_or_skip, random_heads, tiny_model

NEW = 1000
TIE = 1e-4
PROMPT_LEN = 40
TIES: list[str] = []
ALL_FAMILIES = FAMILIES + [NATIVE_FAMILY]


def cases(families, variants, fast, ids=None):
    """pytest params (family, *variant) for every family and variant; those not in `fast` ({(family, variant
    index)}) are marked slow: the full suite runs them, the fast tier leaves them out."""
    params = []
    for family in families:
        for i, variant in enumerate(variants):
            marks = () if (family, i) in fast else (pytest.mark.slow,)
            label = f"{family}-{ids[i] if ids else variant}"
            params.append(pytest.param(family, *(variant if isinstance(variant, tuple) else (variant,)), marks=marks,
                                       id=label))
    return params


def check_native(family, gen):
    """The head-size-64 model must go through the native decoder stack wherever the native library builds."""
    if family == NATIVE_FAMILY:
        native_stack_or_skip(gen)


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


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_ar_equals_hf(family):
    model, gen, prompt, hf = setup(family)
    check_native(family, gen)
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


# The fast tier: every configuration on the native-stack model, and each configuration on one or two of the others.
FAST_CONFIGS = {(NATIVE_FAMILY, i) for i in range(len(CONFIGS))} | {
    ("llama-mha", 1), ("llama-mha", 5), ("llama-gqa", 0), ("llama-gqa", 4), ("qwen2", 2), ("qwen2", 3),
    ("mistral", 0), ("mistral", 1)}


@pytest.mark.parametrize("family,config", cases(ALL_FAMILIES, list(CONFIGS), FAST_CONFIGS))
def test_tokenswift_equals_hf(family, config, monkeypatch):
    if config == "auto":  # rows as if free: auto verifies every candidate it merged (random heads rarely pay)
        monkeypatch.setattr("tokenswift.auto.choose", eager_choose)
    model, gen, prompt, hf = setup(family)
    check_native(family, gen)
    result = gen.generate(prompt, ts.Settings(**CONFIGS[config]), NEW)
    assert_same_or_tie(model, prompt, hf, result.token_ids, f"{family} TokenSwift[{config}] vs HF")
    assert result.stats["mean_accepted"] > 1.0, "drafts were never accepted: the verification path went untested"


PENALTY = dict(penalty=1.3, penalty_window=64)


REAL_CHOOSE = choose  # the planner's rule itself (tests patch tokenswift.auto.choose with eager_choose)


def eager_choose(reach, depths, costs, max_rows=None, calibration=1.0):
    """auto's planner on a machine where verifying rows costs nothing: keeps every candidate."""
    from tokenswift import auto

    flat = auto.CostModel()
    flat.rows, flat.seconds = [1, auto.MAX_ROWS], [1.0, 1.0]
    return REAL_CHOOSE(reach, depths, flat, auto.MAX_ROWS, 1.0, min_gain=1.0)


PENALTY_CASES = [(True, "dynamic", "paper", "1x3x3x3"), (False, "full", "paper", "1x3x3x3"),
                 (True, "once", "paper", "1x3x3x3"), (True, "dynamic", "fused", "1x3x3x3"),
                 (True, "dynamic", "paper", "auto")]
FAST_PENALTY = {(NATIVE_FAMILY, 0), (NATIVE_FAMILY, 4), ("llama-mha", 1), ("llama-gqa", 3), ("qwen2", 2),
                ("mistral", 0)}


@pytest.mark.parametrize("family,reuse,kv_mode,draft,tree", cases(
    ALL_FAMILIES, PENALTY_CASES, FAST_PENALTY, ids=["-".join(map(str, case)) for case in PENALTY_CASES]))
def test_tokenswift_equals_ar_with_penalty(family, reuse, kv_mode, draft, tree, monkeypatch):
    if tree == "auto":  # rows as if free, so that auto verifies every candidate it merged (random heads rarely pay)
        monkeypatch.setattr("tokenswift.auto.choose", eager_choose)
    model, gen, prompt, _ = setup(family)
    check_native(family, gen)
    ar = gen.generate(prompt, ts.Settings(**PENALTY), NEW, method="ar").token_ids
    settings = ts.Settings(ngram_reuse=reuse, kv_mode=kv_mode, kv_budget=64, kv_sink=4, kv_recent=16, draft=draft,
                           tree=tree, **PENALTY)
    result = gen.generate(prompt, settings, NEW)
    assert_same_or_tie(model, prompt, ar, result.token_ids, f"{family} TokenSwift[penalty,{kv_mode},{draft}] vs AR", **{
        "penalty": PENALTY["penalty"], "window": PENALTY["penalty_window"]})
    assert result.stats["mean_accepted"] > 1.0


def test_ngram_only_generator_is_lossless(monkeypatch):
    """No heads at all: drafts come only from reused n-grams (and, under auto, suffix matches)."""
    monkeypatch.setattr("tokenswift.auto.choose", eager_choose)
    model, _, prompt, hf = setup("llama-gqa")
    gen = ts.Generator(model)
    for tree in ("1x3x3x3", "auto"):
        result = gen.generate(prompt, ts.Settings(tree=tree), NEW)
        assert_same_or_tie(model, prompt, hf, result.token_ids, f"llama-gqa n-gram only ({tree}) vs HF")
        assert result.stats["accepted_by_source"].get("ngram", 0) > 0


# Run in a fresh process: the native library is loaded (or not) once per process, and the lean step is chosen at load.
OFF_CODE = """
import json, torch, tokenswift as ts, tokenswift.generator
from tokenswift.native import panels
import test_lossless_greedy as T
tokenswift.auto.choose = T.eager_choose  # as the auto cases here: rows as if free
model = T.tiny_model("llama-gqa", seed=11)
gen = ts.Generator(model, heads=T.random_heads(model))
prompt = torch.randint(0, 256, (T.PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
out = {"lean": gen.adapter.lean is not None, "native": panels.available(), "why": panels.why_unavailable(), "runs": {}}
ar = {}
for name, settings in T.OFF_CASES.items():
    base = {k: v for k, v in settings.items() if k.startswith("penalty")}
    key = json.dumps(base)
    if key not in ar:
        ar[key] = gen.generate(prompt, ts.Settings(**base), T.NEW, method="ar").token_ids
    result = gen.generate(prompt, ts.Settings(**settings), T.NEW)
    out["runs"][name] = [ar[key], result.token_ids, result.stats["mean_accepted"]]
print(json.dumps(out))
"""
OFF_CASES = {"paper": dict(), "auto": dict(tree="auto"), "penalty": dict(PENALTY)}


def test_tokenswift_equals_ar_with_the_native_and_lean_paths_off():
    """TOKENSWIFT_NATIVE=0 TOKENSWIFT_LEAN=0: every forward through the model's own modules and every decision
    through PyTorch. TokenSwift gives AR's tokens (the same function, token for token), and AR gives HF's."""
    env = {**os.environ, "TOKENSWIFT_NATIVE": "0", "TOKENSWIFT_LEAN": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", OFF_CODE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["lean"] and not out["native"] and "TOKENSWIFT_NATIVE=0" in out["why"], out
    model, _, prompt, hf = setup("llama-gqa")
    for name, (ar, fast, accepted) in out["runs"].items():
        assert len(ar) == NEW and fast == ar, f"TokenSwift[{name}] vs AR, native and lean off"
        assert accepted > 1.0, f"{name}: drafts were never accepted"
    assert_same_or_tie(model, prompt, hf, out["runs"]["paper"][0], "AR (native and lean off) vs HF")


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
