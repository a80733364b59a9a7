"""The datastore of continuations (tokenswift/datastore.py): counts, back-off, files, and drafts that keep
generation exactly AR's."""
from pathlib import Path

import pytest
import torch

import tokenswift as ts
from tokenswift.datastore import Datastore
from tokenswift.kinds import Source

from conftest import random_heads, tiny_model

ROOT = Path(__file__).resolve().parents[1]


def test_build_keeps_frequent_contexts_and_their_likeliest_continuations():
    seqs = [[1, 2, 3, 4, 5]] * 5 + [[1, 2, 3, 4, 6]] * 2 + [[9, 2, 3, 4, 7]] * 3
    store = Datastore.build(seqs, vocab_size=16, min_count=5, min_share=0.2)
    order, found = store.lookup([1, 2, 3, 4])  # seen 7 times: 5 then 6 (2 / 7 = 0.29 >= 0.2)
    assert order == 4 and [t for t, _ in found] == [5, 6] and abs(found[0][1] - 5 / 7) < 0.01
    order, found = store.lookup([9, 2, 3, 4])  # seen 3 times at order 4: backs off to "2 3 4" (10 times)
    assert order == 3 and found[0][0] == 5 and abs(found[0][1] - 0.5) < 0.01
    assert store.lookup([8, 8]) == (0, ())
    rare = Datastore.build(seqs, vocab_size=16, min_count=5, min_share=0.6)
    assert [t for t, _ in rare.lookup([1, 2, 3, 4])[1]] == [5]  # 6's share is below the cut


@pytest.mark.parametrize("vocab", [300, 70000])
def test_a_saved_datastore_loads_the_same(tmp_path, vocab):
    gen = torch.Generator().manual_seed(vocab)
    base = torch.randint(0, vocab, (40,), generator=gen).tolist()
    seqs = [base[i:] + base[:i] for i in range(0, 40, 8)] * 3
    store = Datastore.build(seqs, vocab_size=vocab, min_count=2, min_share=0.1)
    assert len(store) > 0
    path = store.save(tmp_path)
    loaded = Datastore.load(path)
    assert loaded.vocab_size == vocab and loaded.tables == store.tables


def generator_with_its_own_datastore():
    """A tiny model whose datastore holds its own greedy continuation: drafts that often survive."""
    model = tiny_model("llama-gqa", seed=5)
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    ar = gen.generate(prompt, ts.Settings(), 300, method="ar").token_ids
    gen.set_datastore(Datastore.build([prompt + ar], vocab_size=256, min_count=1, min_share=0.0))
    return gen, prompt


@pytest.mark.parametrize("settings", [dict(), dict(penalty=1.2, penalty_window=64),
                                      dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)],
                         ids=["greedy", "greedy-penalty", "paper-sampling"])
def test_datastore_drafts_keep_tokenswift_identical_to_ar(settings):
    gen, prompt = generator_with_its_own_datastore()
    ar = gen.generate(prompt, ts.Settings(**settings), 300, method="ar", seed=4).token_ids
    drafted = 0
    out = []
    for step in gen.stream(prompt, ts.Settings(tree="auto", **settings), 300, seed=4, detail=False):
        out += step.token_ids
        drafted += sum(t.source == Source.NGRAM for t in step.tokens)
    assert out == ar
    if not settings:  # greedy along the datastore's own text: its drafts are accepted
        assert drafted > 50


def test_token_reuse_off_means_no_datastore_drafts():
    gen, prompt = generator_with_its_own_datastore()
    steps = list(gen.stream(prompt, ts.Settings(tree="auto", ngram_reuse=False), 200, detail=False))
    assert not any(t.source == Source.NGRAM for s in steps for t in s.tokens)


def test_a_datastore_must_fit_the_vocabulary():
    gen = ts.Generator(tiny_model("llama-gqa"))
    with pytest.raises(ValueError, match="vocabulary"):
        gen.set_datastore(Datastore(vocab_size=100000, tables={}))


def test_the_default_model_ships_its_datastore():
    gen = ts.Generator.from_pretrained(ROOT / "assets" / "default-model")
    assert gen.datastore is not None and len(gen.datastore) > 10000
    order, found = gen.datastore.lookup(gen.encode("I do not know what"))
    assert order >= 2 and found
    assert ts.Generator.from_pretrained(ROOT / "assets" / "default-model", datastore=False).datastore is None


def test_draft_hits_bench_reports_rates(tmp_path):
    from tokenswift.bench.drafts import draft_hits

    line = ("She could not help thinking that Mr. Knightley was very much in the right, and that her father would "
            "be quite as well pleased to see them all again at Hartfield as he had ever been.\n")
    text = tmp_path / "prompt.txt"
    text.write_text(line * 40)  # the last 5% of lines (two) is the held-out prompt
    out = draft_hits(str(ROOT / "assets" / "default-model"), str(text), 64, 60)
    assert set(out["top1_hit_rate"]) == {"greedy", "greedy+penalty", "paper"}
    for rates in out["top1_hit_rate"].values():
        assert 0.0 <= rates["datastore_where_suffix_missed"] <= rates["datastore"] <= 1.0
        assert 0.0 <= rates["suffix"] <= 1.0
    assert out["top1_hit_rate"]["greedy"]["datastore"] > 0.05  # the model's own formulaic continuations
