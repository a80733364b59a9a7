"""The shipped default model: loads with heads through our loader and plainly through transformers,
offline, and TokenSwift on it is lossless."""
import pytest

import tokenswift as ts

from app_server import DEFAULT_MODEL

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


@pytest.mark.parametrize("draft", ["paper", "fused"])
def test_greedy_tokenswift_equals_ar_on_the_default_model(gen, draft):
    prompt = "It is a truth universally acknowledged, that"
    ar = gen.generate(prompt, ts.Settings(), 200, method="ar")
    fast = gen.generate(prompt, ts.Settings(draft=draft), 200)
    assert fast.token_ids == ar.token_ids and fast.text == ar.text
    assert fast.stats["mean_accepted"] > 1.2
