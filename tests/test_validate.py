"""tokenswift.validate at every boundary: the library (Settings, from_dict, validate_request,
check_generation), the UI's controls and the command line. Each bad input gets one clear sentence."""
import math
import subprocess
import sys
import tracemalloc

import pytest

import tokenswift as ts
from tokenswift.settings import PAPER_SAMPLING
from tokenswift.tree import AUTO, TREE_PRESETS, parse_tree
from tokenswift.validate import (InvalidRequest, ModelLimits, check_generation, validate_request, validate_seed,
                                 validate_settings)
from ui.controls import CONTROL_ORDER, UI_DEFAULTS, default_controls, parse_controls

from conftest import ROOT, random_heads, save_tiny_checkpoint, tiny_model


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and "Traceback" not in message


# ---- the library: Settings(...) -------------------------------------------------------------------------------
BAD_SETTINGS = [
    (dict(tree="64x64x64x64x64"), "tree '64x64x64x64x64' has 1,090,785,344 nodes; at most 256 are allowed"),
    (dict(tree="1x64x64x64"), "has 266,305 nodes; at most 256"),
    (dict(tree="1x" * 16 + "1"), "at most 16 levels; got 17"),
    (dict(tree="1x65"), "widths must each be from 1 to 64"),
    (dict(tree=5), "tree must be 'auto', a preset"),
    (dict(tree="1_0"), "tree must be 'auto', a preset"),
    (dict(tree="x" * 10_000), "a text of 10,000 characters"),
    (dict(ngram_topk=300_000_000), "ngram_topk must be a whole number from 0 to 64; got 300000000."),
    (dict(ngram_topk=2.5), "ngram_topk must be a whole number"),
    (dict(tree="64", ngram_topk=20), "may verify 5,264 nodes per step; at most 2,048"),
    (dict(kv_budget=10**12), "kv_budget must be a whole number from 2 to 131,072"),
    (dict(kv_budget=8), "kv_budget must be larger than kv_sink + kv_recent (16 + 2)"),
    (dict(kv_recent=0), "kv_recent must be a whole number from 1"),
    (dict(kv_sink=-1), "kv_sink must be a whole number from 0"),
    (dict(penalty_window=0), "penalty_window must be a whole number from 1"),
    (dict(top_k=True), "top_k must be a number: a whole one"),
    (dict(top_k=3.5), "top_k must be a whole number from 0 (off)"),
    (dict(top_k=10**400), "got a number of 401 digits"),  # 1 and 400 zeros, counted without writing them out
    (dict(temperature=1e-320), "temperature must be a number equal to 0 (greedy) or from 0.001 to 100; got 1e-320."),
    (dict(temperature=math.nan), "got nan."),
    (dict(temperature=-math.inf), "got -inf."),
    (dict(temperature="hot"), "temperature must be a number: equal to 0 (greedy)"),
    (dict(top_p=0.0), "top_p must be a number greater than 0 and at most 1"),
    (dict(top_p="0.9"), "top_p must be a number: greater than 0"),
    (dict(min_p=1.0), "min_p must be a number from 0 (off) up to but not including 1"),
    (dict(eta=[0.1]), "eta must be a number: from 0 (off) up to but not including 1; got a value of type list."),
    (dict(penalty=math.inf), "penalty must be a number from 1 (off) to 100; got inf."),
    (dict(penalty=0.5), "penalty must be a number from 1 (off)"),
    (dict(ngram_reuse=1), "ngram_reuse must be true or false; got 1."),
    (dict(kv_mode="sometimes"), "kv_mode must be one of full, once, dynamic; got 'sometimes'."),
    (dict(draft=None), "draft must be one of paper, fused; got None."),
    (dict(acceptance="fast"), "acceptance must be one of exact, per_row_biased"),
]


@pytest.mark.parametrize("changes,message", BAD_SETTINGS, ids=[repr(c)[:40] for c, _ in BAD_SETTINGS])
def test_bad_settings_are_refused_with_one_sentence(changes, message):
    with pytest.raises(InvalidRequest) as info:
        ts.Settings(**changes)
    assert message in str(info.value)
    assert one_sentence(str(info.value))
    with pytest.raises(InvalidRequest, match="^" + str(info.value).split(";")[0][:20]):  # from_dict says the same
        ts.Settings.from_dict(changes)


@pytest.mark.parametrize("data,message", [
    ([("temperature", 1.0)], "settings must be a mapping of setting names to values (a JSON object); got a value of type list."),
    ("temperature=1", "settings must be a mapping"),
    (None, "settings must be a mapping"),
    ({"temprature": 1.0}, "unknown setting(s) 'temprature'; the settings are temperature, top_k"),
    ({1: 2}, "unknown setting(s) 1;"),
    ({"temperature": {"nested": [1, 2]}}, "temperature must be a number: equal to 0 (greedy) or from 0.001 to 100; got a value of type dict."),
    ({"tree": ["1x3x3x3"]}, "got a value of type list."),
])
def test_from_dict_refuses_junk(data, message):
    with pytest.raises(InvalidRequest) as info:
        ts.Settings.from_dict(data)
    assert message in str(info.value) and one_sentence(str(info.value))


def test_refusals_are_value_errors_for_existing_callers():
    assert issubclass(InvalidRequest, ValueError)
    with pytest.raises(ValueError, match="tree"):
        parse_tree("1x64x64x64")


@pytest.mark.parametrize("build", [
    lambda: ts.Settings(tree="64x64x64x64x64"),
    lambda: ts.Settings(tree="1x64x64x64"),
    lambda: parse_tree("64x64x64x64x64"),
    lambda: ts.Settings(ngram_topk=10**9),
    lambda: ts.Settings.from_dict({"kv_budget": 10**12, "tree": "16x16x16"}),
])
def test_dangerous_values_are_refused_before_anything_is_expanded(build):
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):  # InvalidRequest; parse_tree, below the validator, raises a plain ValueError
            build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024  # the product alone would be gigabytes of tuples


# ---- good values are accepted unchanged -------------------------------------------------------------------------
GOOD = [dict(), PAPER_SAMPLING, dict(tree=AUTO), dict(temperature=1e-3), dict(temperature=100.0),
        dict(top_k=0, top_p=1.0, min_p=0.0, eta=0.0), dict(kv_mode="full", draft="fused"),
        dict(kv_budget=32, kv_sink=4, kv_recent=8), dict(ngram_topk=64), dict(acceptance="per_row_biased")]
GOOD += [dict(tree=name) for name in TREE_PRESETS] + [dict(tree=spec) for spec in TREE_PRESETS.values()]


@pytest.mark.parametrize("changes", GOOD, ids=[repr(c)[:40] for c in GOOD])
def test_good_settings_are_accepted_unchanged(changes):
    s = ts.Settings(**changes)
    assert {k: getattr(s, k) for k in changes} == changes
    assert ts.Settings.from_dict(s.to_dict()) == s == validate_settings(s)


def test_whole_floats_and_int_reals_are_normalised():
    s = ts.Settings(top_k=3.0, temperature=1, kv_budget=64.0)
    assert (s.top_k, s.kv_budget) == (3, 64) and type(s.top_k) is int and type(s.temperature) is float


def test_the_apps_defaults_pass():
    c = default_controls("Hello", "m")
    assert c.max_new_tokens == UI_DEFAULTS["max_new"] and c.settings.tree == UI_DEFAULTS["tree"]
    assert c.settings.penalty == UI_DEFAULTS["theta"] and c.seed == UI_DEFAULTS["seed"]


# ---- a request against the model -------------------------------------------------------------------------------
LIMITS = ModelLimits(max_positions=8192, vocab_size=256, head_levels=4)


@pytest.mark.parametrize("args,message", [
    ((0, 10), "The prompt is empty: give at least one token."),
    ((10, 0), "max_new_tokens must be a whole number from 1 to 50,000; got 0."),
    ((10, 2.5), "max_new_tokens must be a whole number from 1 to 50,000; got 2.5."),
    ((10, "100"), "max_new_tokens must be a number: a whole one from 1 to 50,000; got '100'."),
    ((10, True), "max_new_tokens must be a number: a whole one from 1 to 50,000; got True."),
    ((10, 60_000), "max_new_tokens must be a whole number from 1 to 50,000; got 60000."),
    ((9000, 10), "The prompt is 9,000 tokens long; at most 8,000 are allowed here."),
    ((8000, 500), "The prompt (8,000 tokens) plus max_new_tokens (500) must fit the model's 8,192 positions; ask for at most 192 new tokens."),
])
def test_bad_requests_are_refused(args, message):
    with pytest.raises(InvalidRequest) as info:
        validate_request(*args, LIMITS, max_new_limit=50_000, max_prompt_limit=8000)
    assert str(info.value) == message


def test_a_prompt_that_fills_the_model_asks_to_be_shortened():
    with pytest.raises(InvalidRequest, match="must fit the model's 8,192 positions; shorten the prompt."):
        validate_request(8192, 1, LIMITS, max_new_limit=50_000)
    assert validate_request(8000, 192.0, LIMITS, max_new_limit=50_000) == 192


@pytest.mark.parametrize("seed,ok", [(0, True), (2**32 - 1, True), (7.0, True), (-1, False), (2**32, False),
                                     (1.5, False), ("3", False), (None, False)])
def test_seed_range(seed, ok):
    if ok:
        assert validate_seed(seed) == int(seed)
    else:
        with pytest.raises(InvalidRequest, match="seed must be a"):
            validate_seed(seed)


@pytest.mark.parametrize("changes,message", [
    (dict(top_k=300), "top_k must be a whole number from 0 (off) to 256 (the vocabulary size); got 300."),
    (dict(kv_budget=10_000), "kv_budget must be a whole number from 2 to 8,192; got 10000."),
    (dict(penalty_window=9000), "penalty_window must be a whole number from 1 to 8,192; got 9000."),
])
def test_settings_beyond_the_model_are_refused(changes, message):
    model = tiny_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    assert ModelLimits.from_generator(gen) == LIMITS
    with pytest.raises(InvalidRequest) as info:
        check_generation(gen, [1, 2, 3], ts.Settings(**changes), 10)
    assert str(info.value) == message
    assert check_generation(gen, [1, 2, 3], ts.Settings(), 10.0) == 10
    assert check_generation(gen, [1, 2, 3], ts.Settings(tree="1x3x3x3x3"), 10) == 10  # trimmed to the heads, not refused


def test_without_heads_any_bounded_tree_is_allowed():
    model = tiny_model("llama-gqa")
    limits = ModelLimits.from_config(model.config)
    assert limits.head_levels is None and limits.max_positions == 8192
    assert validate_settings({"tree": "1x1x1x1x1x1"}, limits).tree == "1x1x1x1x1x1"


# ---- the UI's controls -------------------------------------------------------------------------------------------
def controls(prompt="a prompt", **changes):
    values = {**UI_DEFAULTS, "greedy": False, **changes}  # sampling, so that the temperature is read
    return [prompt, *(values[k] for k in CONTROL_ORDER), "model"]


@pytest.mark.parametrize("prompt,changes,message", [
    ("a prompt", dict(max_new=10**9), "Max new tokens must be a whole number from 1 to 50,000; got 1000000000."),
    ("a prompt", dict(max_new=None), "Max new tokens must be a number: a whole one from 1 to 50,000; got None."),
    ("a prompt", dict(temperature=math.nan), "temperature must be a number equal to 0 (greedy)"),
    ("a prompt", dict(temperature=1e-320), "got 1e-320."),
    ("a prompt", dict(seed=-5), "Seed must be a whole number from 0 to 4,294,967,295; got -5."),
    ("a prompt", dict(seed=0.5), "Seed must be a whole number"),
    ("a prompt", dict(window=math.inf), "Penalty window must be a whole number from 1 to 131,072; got inf."),
    ("a prompt", dict(ngram_topk=1e9), "N-gram top-k must be a whole number from 0 to 64"),
    ("a prompt", dict(theta=-2.0), "Theta must be a number from 1 (off) to 100; got -2.0."),
    ("a prompt", dict(kv_budget=10**12), "kv_budget must be a whole number from 2 to 131,072"),
    ("a prompt", dict(tree={"a": 1}), "tree must be 'auto', a preset"),
    ("a prompt", dict(tree="64x64x64x64x64"), "at most 256 are allowed"),
    ("a prompt", dict(kv_mode=3), "kv_mode must be one of full, once, dynamic; got 3."),
    ("a prompt", dict(greedy="yes"), "Greedy must be true or false; got 'yes'."),
    ("a prompt", dict(reuse_on=None), "Token reuse must be true or false; got None."),
    (None, {}, "Type a prompt (or pick an example) first."),
    (12, {}, "Type a prompt (or pick an example) first."),
    ("x" * 200_001, {}, "The prompt is too long for this demo (200,000 characters at most)."),
])
def test_bad_controls_are_refused_with_a_message_for_the_user(prompt, changes, message):
    with pytest.raises(InvalidRequest) as info:
        parse_controls(*controls(prompt, **changes))
    assert message in str(info.value) and one_sentence(str(info.value))


def test_the_model_control_must_be_a_name():
    args = controls()
    args[-1] = ["m"]
    with pytest.raises(InvalidRequest, match="Model must be the name of a listed model"):
        parse_controls(*args)


# ---- the command line --------------------------------------------------------------------------------------------
def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tokenswift", "generate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("flags,message", [
    (["--tree", "64x64x64x64x64"], "error: tree '64x64x64x64x64' has 1,090,785,344 nodes"),
    (["--ngram-topk", "300000000"], "error: ngram_topk must be a whole number from 0 to 64; got 300000000."),
    (["--temperature", "nan"], "error: temperature must be a number equal to 0 (greedy)"),
    (["--top-k", "3.5"], "error: top_k must be a whole number"),
    (["--kv-budget", "lots"], "error: kv_budget must be a number: a whole one from 2 to 131,072; got 'lots'."),
    (["--seed", "-1"], "error: seed must be a whole number from 0 to 4,294,967,295; got -1."),
    (["--draft", "eager"], "error: draft must be one of paper, fused; got 'eager'."),
    (["--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
])
def test_cli_refuses_bad_values_in_one_line_with_status_2(flags, message):
    proc = run_cli("--model", "no-model-is-loaded", "--prompt", "x", *flags)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_checks_new_tokens_against_the_models_positions(tmp_path):
    model_dir = save_tiny_checkpoint(tmp_path / "m", with_heads=False)
    proc = run_cli("--model", str(model_dir), "--prompt", "It is a truth", "--max-new-tokens", "8190")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]  # after the loader's progress bars
    assert last.startswith("error: The prompt (") and "must fit the model's 8,192 positions; ask for at most" in last


def test_every_settings_field_has_a_rule():
    import dataclasses

    from tokenswift.setting_rules import _field_rules

    assert set(_field_rules(None)) == {f.name for f in dataclasses.fields(ts.Settings)}
