"""The shipped default model: loads with heads through our loader and plainly through transformers,
offline, and TokenSwift on it is lossless."""
import pytest
import torch

import tokenswift as ts

from ui.app_server import DEFAULT_MODEL

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="the default model is not built")

TEXT = "“Emma,” said Mr. Knightley, “it is £20 a year!”\n\nAnd the LORD spake unto Moses, saying,"


@pytest.fixture(scope="module")
def gen():
    return ts.Generator.from_pretrained(DEFAULT_MODEL)


def test_loads_base_and_three_heads(gen):
    assert gen.heads is not None and gen.heads.num_heads == 3
    assert gen.model.config.model_type == "llama" and gen.model.config.num_key_value_heads < gen.model.config.num_attention_heads


def test_plain_transformers_loads_it_offline():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL, local_files_only=True)
    assert tok.decode(tok.encode(TEXT, add_special_tokens=False)) == TEXT
    assert model.config.vocab_size == len(tok)


def test_sizes_stay_small():
    total = sum(f.stat().st_size for f in DEFAULT_MODEL.parent.rglob("*") if f.is_file())
    assert total <= 40 * 2**20


BF16_TIE = 0.05  # bf16 rounding noise in the logits of this 8-layer model is of this order


@pytest.fixture(scope="module")
def reference():
    """The same weights in float32: judges whether a bf16 divergence sits on a near-tie."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, local_files_only=True, dtype=torch.float32).eval()


@pytest.mark.parametrize("draft", ["paper", "fused"])
def test_greedy_tokenswift_equals_ar_on_the_default_model(gen, reference, draft):
    """The shipped model runs in bf16, where a 1-token forward (AR) and an N-token forward (verification)
    round differently. Outputs must agree token for token; a divergence is allowed only where the float32
    top-2 logit gap is below bf16 noise (a near-tie, where either token is a correct greedy choice)."""
    prompt = "It is a truth universally acknowledged, that"
    ar = gen.generate(prompt, ts.Settings(), 200, method="ar")
    fast = gen.generate(prompt, ts.Settings(draft=draft), 200)
    assert fast.stats["mean_accepted"] > 1.2
    diverged = next((i for i, (a, b) in enumerate(zip(ar.token_ids, fast.token_ids)) if a != b), None)
    if diverged is None:
        assert fast.token_ids == ar.token_ids and fast.text == ar.text
        return
    ids = torch.tensor(gen.encode(prompt) + ar.token_ids[:diverged])
    with torch.no_grad():
        top2 = torch.topk(reference(ids[None]).logits[0, -1].float(), 2).values
    gap = float(top2[0] - top2[1])
    assert gap < BF16_TIE, f"diverged at new token {diverged} with a float32 top-2 gap of {gap:.3f} (not a tie)"
    print(f"\n[default model, {draft}] identical for {diverged} tokens, then a near-tie (gap {gap:.3f})")


def test_warm_up_runs_and_changes_no_output(gen):
    """The engine warms every model it loads (Generator.warm_up); a run afterwards is the same run."""
    settings = ts.Settings(tree="auto", temperature=1.0, min_p=0.1, penalty=1.2)
    before = gen.generate(TEXT, settings, 24, seed=3).token_ids
    assert gen.warm_up() > 0
    assert gen.generate(TEXT, settings, 24, seed=3).token_ids == before
    assert gen.generate(TEXT, settings, 24, method="ar", seed=3).token_ids == before
