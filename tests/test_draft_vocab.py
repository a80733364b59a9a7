"""Heads with a drafting vocabulary of their own, the fresh-head identity, and self-distilled head training."""
import json

import pytest
import torch

import tokenswift as ts
from tokenswift.heads import DRAFT_VOCAB_KEY, read_draft_vocab
from tokenswift.train.distill_heads import DistillSettings, distill_heads, drafting_vocabulary
from tokenswift.train.heads import last_layer_hidden

from conftest import NATIVE_FAMILY, random_heads, tiny_model, tiny_model_folder, tiny_tokenizer


def test_fresh_heads_give_the_base_logits_when_the_final_norm_is_not_ones():
    """A fresh head is the identity on the model's logits: W = 0 and its post norm is the model's final norm (a
    real model's is far from ones: SmolLM2's averages 1.8), so training starts from the base model's guess."""
    model = tiny_model("llama-gqa")
    with torch.no_grad():
        model.model.norm.weight.copy_(torch.linspace(-2.0, 3.0, model.config.hidden_size))
    heads = ts.Heads.init(model, 3)
    h0 = torch.randn(7, model.config.hidden_size)
    base = model.lm_head(model.model.norm(h0))
    for i, out in enumerate(heads(h0)):
        assert torch.allclose(model.lm_head(out), base, atol=1e-5), i


def test_draft_vocabulary_saves_loads_and_maps_drafts_to_token_ids(tmp_path):
    """Heads saved with their drafting vocabulary bring it back; the engine then ranks only those ids, and every
    draft it returns is a token id of that vocabulary, the same as the full LM head's ranking restricted to it."""
    model = tiny_model("llama-gqa", vocab=256)
    heads = random_heads(model, 3)
    vocab = torch.randperm(256, generator=torch.Generator().manual_seed(0))[:48]
    heads.draft_vocab = vocab
    path = heads.save(tmp_path / "heads.safetensors")
    loaded = ts.Heads.load(model, path)
    assert torch.equal(loaded.draft_vocab, vocab)

    gen = ts.Generator(model, tiny_tokenizer())
    gen.set_heads(loaded)
    lean = gen.adapter.lean
    assert lean.draft_ids == vocab.tolist() and lean.draft_vocab == 48
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        hidden = torch.randn(1, model.config.hidden_size, generator=g)
        ids, probs = gen.head_drafts(hidden, 3, 4)
        full = gen.run_heads(hidden, 3)[:, 0].float()[:, vocab]  # (3, 48): the full head's logits on the vocabulary
        want = torch.topk(torch.softmax(full, dim=-1), 4, dim=-1)
        assert ids == vocab[want.indices].tolist()
        assert torch.allclose(torch.tensor(probs), want.values, rtol=1e-4, atol=1e-6)
    gen.set_heads(random_heads(model, 3))  # heads without a vocabulary of their own: the engine's default again
    assert lean.draft_ids is None


@pytest.mark.parametrize("bad", [[3, 3, 4], [0, 256], [-1, 2]])
def test_a_malformed_draft_vocabulary_is_refused(tmp_path, bad):
    model = tiny_model("llama-gqa", vocab=256)
    heads = random_heads(model, 2)
    heads.draft_vocab = torch.tensor(bad)
    path = heads.save(tmp_path / "heads.safetensors")
    with pytest.raises(ValueError, match=DRAFT_VOCAB_KEY):
        read_draft_vocab(path, 256)


def test_drafting_vocabulary_is_the_smallest_frequent_set_with_the_coverage():
    labels = torch.tensor([[5]] * 60 + [[7]] * 30 + [[9]] * 10)
    vocab, table = drafting_vocabulary(labels, 16, DistillSettings(coverage=0.85, vocab_multiple=1))
    assert vocab.tolist() == [5, 7]
    vocab, _ = drafting_vocabulary(labels, 16, DistillSettings(coverage=0.95, vocab_multiple=1))
    assert vocab.tolist() == [5, 7, 9]


def _chain_selfgen(directory, vocab=256, rows=48, prompt=8, new=40, seed=0):
    """A selfgen batch file whose text follows one rule (each id determines the next, over 64 ids), so that a
    head reading h0 at t can learn the token at t+2+i and held-out rows follow the same rule."""
    g = torch.Generator().manual_seed(seed)
    successor = torch.randperm(64, generator=g)
    start = torch.randint(0, 64, (rows,), generator=g)
    ids = [start]
    for _ in range(prompt + new - 1):
        ids.append(successor[ids[-1]])
    directory.mkdir(parents=True)
    torch.save({"prompt_tokens": prompt, "ids": torch.stack(ids, 1), "mode": "greedy"}, directory / "batch000.pt")


def test_self_distilled_heads_learn_the_models_own_text_and_ship_their_vocabulary(tmp_path):
    model, model_dir = tiny_model_folder(tmp_path / "model")
    _chain_selfgen(tmp_path / "selfgen")
    s = DistillSettings(num_heads=2, steps=150, batch_positions=256, lr=2e-2, warmup=10, coverage=0.99, vocab_multiple=16)
    heads = distill_heads(str(model_dir), [str(tmp_path / "selfgen")], str(tmp_path / "run"), s)
    card = json.loads((tmp_path / "run" / "card.json").read_text())
    assert card["steps"] == 150 and card["minutes"]["total"] > 0
    assert heads.draft_vocab is not None and card["draft_vocab"] == heads.draft_vocab.numel()
    assert card["draft_vocab"] == 64  # the text uses 64 ids; rounded up to a multiple of 16
    # the rule is learnt: held-out rows are predicted far better than by a fresh head
    fresh_hits = _top1(model, ts.Heads.init(model, 2), tmp_path / "selfgen")
    assert card["held_out"]["all"]["top1"][0] > max(0.5, fresh_hits + 0.3), (card["held_out"], fresh_hits)
    loaded = ts.Heads.load(model, tmp_path / "run" / "heads.safetensors")
    assert torch.equal(loaded.draft_vocab, heads.draft_vocab)


def _top1(model, heads, directory):
    """Head 0's top-1 hit rate on the held-out rows (every 16th) of a selfgen batch file."""
    saved = torch.load(directory / "batch000.pt", weights_only=True)
    start = saved["prompt_tokens"] - 1
    hits = total = 0
    for row in saved["ids"][::16]:
        h0 = last_layer_hidden(model, row[None], bf16=True)[0]  # (T, H) before the final norm
        with torch.no_grad():
            pred = model.lm_head(heads(h0)[0])[start:-2].argmax(-1)
        hits += int((pred == row[start + 2 :]).sum())
        total += pred.numel()
    return hits / total


@pytest.mark.parametrize("family", ["llama-gqa", NATIVE_FAMILY])
@pytest.mark.parametrize("size", [1, 2])
def test_a_drafting_vocabulary_smaller_than_the_candidates_asked_for_still_drafts(size, family):
    """auto asks the heads for 3 candidates at depth 1: a drafting vocabulary of fewer ids gives what it has (no
    torch.topk error), on the native heads and on the PyTorch path alike, and the output stays AR's."""
    model = tiny_model(family, vocab=256)
    heads = random_heads(model, 3)
    heads.draft_vocab = torch.tensor([5, 9][:size])
    gen = ts.Generator(model, heads=heads)
    ids, probs = gen.head_drafts(torch.randn(1, model.config.hidden_size), 3, 3)
    assert [len(row) for row in ids] == [size] * 3 and all(t in (5, 9) for row in ids for t in row)
    assert [len(row) for row in probs] == [size] * 3
    prompt = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3)).tolist() * 2
    ar = gen.generate(prompt, ts.Settings(tree="auto"), 60, method="ar")
    assert gen.generate(prompt, ts.Settings(tree="auto"), 60).token_ids == ar.token_ids
