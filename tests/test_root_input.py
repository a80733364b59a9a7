"""Heads with a root input (tokenswift.heads: they also read the token their tree starts from): the formula, the
file layout, self-distillation that uses it, and drafting with it that stays exactly AR's output."""
import json

import pytest
import torch

import tokenswift as ts
from tokenswift.heads import ROOT_INPUT_KEY, read_root_input, unit_rms
from tokenswift.train.distill_heads import DistillSettings, distill_heads, head_logits

from conftest import NATIVE_FAMILY, native_stack_or_skip, random_heads, tiny_model, tiny_model_folder, tiny_tokenizer


def heads_with_root(model, seed=2, scale=0.3):
    heads = random_heads(model, 3).add_root_input()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        heads.root_input.weight.copy_(torch.randn(heads.root_input.weight.shape, generator=g) * scale)
    return heads


def test_a_zero_root_input_changes_nothing_and_a_trained_one_is_added_to_h0():
    model = tiny_model("llama-gqa")
    heads = random_heads(model, 3)
    h0 = torch.randn(5, model.config.hidden_size)
    emb = model.get_input_embeddings().weight[torch.tensor([3, 9, 9, 0, 200])]  # (5, H)
    plain = heads(h0)
    heads.add_root_input()
    assert torch.equal(heads(h0, emb), plain)  # U = 0: the plain heads until trained
    with torch.no_grad():
        heads.root_input.weight.normal_(0, 0.2)
    want = heads(h0 + unit_rms(emb) @ heads.root_input.weight.T)
    assert torch.allclose(heads(h0, emb), want, atol=1e-6)
    assert not torch.allclose(heads(h0, emb), plain, atol=1e-3)
    assert torch.equal(heads(h0), plain)  # no root given: h0 itself


def test_the_root_input_saves_and_loads_beside_the_official_keys(tmp_path):
    model = tiny_model("llama-gqa")
    heads = heads_with_root(model)
    path = heads.save(tmp_path / "heads.safetensors")
    loaded = ts.Heads.load(model, path)
    assert torch.equal(loaded.root_input.weight, heads.root_input.weight)
    assert read_root_input(tmp_path / "nowhere") is None
    plain = random_heads(model, 3)
    plain.save(tmp_path / "plain" / "heads.safetensors")
    assert ts.Heads.load(model, tmp_path / "plain").root_input is None  # official heads stay plain
    ts.heads.save_with_model(model, heads, tiny_tokenizer(), tmp_path / "with-model")
    assert torch.equal(read_root_input(tmp_path / "with-model"), heads.root_input.weight)


def test_a_root_input_of_the_wrong_shape_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_model("llama-gqa")
    path = heads_with_root(model).save(tmp_path / "heads.safetensors")
    tensors = load_file(str(path))
    tensors[ROOT_INPUT_KEY] = tensors[ROOT_INPUT_KEY][:, :-1].contiguous()
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match="root_input"):
        ts.Heads.load(model, path)


@pytest.mark.parametrize("family", ["llama-gqa", NATIVE_FAMILY])
def test_drafts_read_the_root_on_the_native_and_pytorch_paths_alike(family):
    """head_drafts(hidden, root) ranks what the heads compute from h0 + U unit_rms(embed(root)), through the native
    heads where they serve and through PyTorch otherwise; another root gives other drafts."""
    model = tiny_model(family, vocab=256)
    heads = heads_with_root(model)
    gen = ts.Generator(model, heads=heads)
    if family == NATIVE_FAMILY:
        native_stack_or_skip(gen)
    g = torch.Generator().manual_seed(4)
    embeddings = model.get_input_embeddings().weight.detach()
    differ = 0
    for root in (1, 17, 200):
        hidden = torch.randn(1, model.config.hidden_size, generator=g)
        want_input = heads.float().with_root(hidden, embeddings[root].float())  # the formula, as training computes it
        assert torch.allclose(gen.heads_input(hidden, root).float(), want_input, rtol=1e-4, atol=1e-5)
        ids, probs = gen.head_drafts(hidden, 3, 3, root)
        logits = gen.run_heads(gen.heads_input(hidden, root), 3)[:, 0].float()  # (3, V)
        want = torch.topk(torch.softmax(logits, dim=-1), 3, dim=-1)
        assert ids == want.indices.tolist()
        assert torch.allclose(torch.tensor(probs), want.values, rtol=1e-4, atol=1e-6)
        differ += ids != gen.head_drafts(hidden, 3, 3, (root + 1) % 256)[0]
    assert differ  # the root is read


@pytest.mark.parametrize("family", ["llama-gqa", NATIVE_FAMILY])
@pytest.mark.parametrize("settings", [dict(tree="auto"), dict(tree="auto", penalty=1.3, penalty_window=64),
                                      dict(draft="fused"), dict(draft="paper", kv_mode="dynamic", kv_budget=64,
                                                                 kv_sink=4, kv_recent=16)],
                         ids=["auto", "auto-penalty", "fused", "paper"])
def test_tokenswift_with_root_input_heads_is_ar(family, settings, monkeypatch):
    from test_lossless_greedy import eager_choose

    monkeypatch.setattr("tokenswift.auto.choose", eager_choose)  # auto verifies every candidate it merged
    model = tiny_model(family, vocab=256, seed=11)
    gen = ts.Generator(model, heads=heads_with_root(model))
    if family == NATIVE_FAMILY:
        native_stack_or_skip(gen)
    prompt = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    s = ts.Settings(**settings)
    ar = gen.generate(prompt, s, 600, method="ar").token_ids
    result = gen.generate(prompt, s, 600)
    assert result.token_ids == ar
    assert result.stats["mean_accepted"] > 1.0


@pytest.mark.parametrize("settings", [dict(tree="auto", penalty=1.3), dict(draft="fused", penalty=1.3),
                                      dict(draft="paper", penalty=1.3, kv_mode="full")], ids=["auto", "fused", "paper"])
def test_the_heads_read_the_token_after_their_hidden_states_position(settings, monkeypatch):
    """fused and auto: the root is the last committed token; paper (and fused's first iteration): depth 1's top token
    after the penalty, the token the heads' depths follow. Checked at every consult of a greedy run with a penalty."""
    from test_lossless_greedy import eager_choose

    from tokenswift.auto import AutoDrafter
    from tokenswift.drafters import FixedTreeDrafter
    from tokenswift.sampling import penalize_rows

    monkeypatch.setattr("tokenswift.auto.choose", eager_choose)
    model = tiny_model("llama-gqa", vocab=256, seed=11)
    gen = ts.Generator(model, heads=heads_with_root(model))
    calls, context = [], {}
    for cls in (FixedTreeDrafter, AutoDrafter):
        def propose(self, state, _original=cls.propose):
            context["ids"] = list(state.ids)  # the committed tokens when the drafter proposes
            return _original(self, state)
        monkeypatch.setattr(cls, "propose", propose)
    reads = gen.heads_input

    def heads_input(hidden, root):
        calls.append((hidden.detach().float().clone(), root, context["ids"]))
        return reads(hidden, root)

    monkeypatch.setattr(gen, "heads_input", heads_input)
    s = ts.Settings(**settings)
    prompt = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    gen.generate(prompt, s, 200)
    assert len(calls) >= 5, len(calls)
    for i, (hidden, root, ids) in enumerate(calls):
        if s.draft == "paper" and s.tree != "auto" and (s.kv_mode == "full" or i == 0):  # a draft forward's hidden
            with torch.no_grad():
                logits = model.lm_head(model.model.norm(hidden)).float()  # (1, V)
            seen = torch.zeros_like(logits, dtype=torch.bool)
            seen[0, ids[-s.penalty_window:]] = True
            logits = penalize_rows(logits, seen, s.penalty)
            assert float(logits[0, root]) >= float(logits.max()) - 1e-4, (i, root, int(logits.argmax()))
        elif s.tree != "auto" and i == 0:  # fused's first iteration drafts from a draft forward, as the paper does
            continue
        else:
            assert root == ids[-1], (i, root, ids[-3:])


def test_head_rest_decays_its_yield_towards_what_consults_bring():
    from tokenswift.auto import HEAD_YIELD_PRIOR, HeadRest

    rest = HeadRest()
    assert rest.count_consult() == pytest.approx(HEAD_YIELD_PRIOR[0] / HEAD_YIELD_PRIOR[1])
    for _ in range(200):  # consults that bring nothing: the yield decays towards 0
        rate = rest.count_consult()
    assert rate < 0.01
    for _ in range(200):  # one accepted head token per consult: towards 1
        rest.tokens += 1
        rate = rest.count_consult()
    assert 0.9 < rate <= 1.0


def test_a_consults_yield_counts_only_tokens_no_other_source_proposed():
    from tokenswift.auto import head_tokens
    from tokenswift.kinds import Source

    keys = [[], [(Source.HEAD, 0)], [(Source.HEAD, 1), (Source.SUFFIX, 0)], [(Source.SUFFIX, 1)], [(Source.HEAD, 2)]]
    assert head_tokens(keys, [1, 2, 3]) == (2, 1)
    assert head_tokens(keys, [3]) == (0, 0)
    assert head_tokens(keys, [2, 4]) == (2, 1)


def _root_rule_selfgen(directory, rows=64, prompt=8, new=40, seed=0):
    """A selfgen batch whose text h0 at t cannot foresee: every other token is random (a sample), the token after it
    follows from it by a fixed rule. Only a head that reads the root (the token at t+1) can guess t+2 there."""
    g = torch.Generator().manual_seed(seed)
    rule = torch.randperm(32, generator=g) + 32
    length = prompt + new
    ids = torch.randint(0, 32, (rows, length), generator=g)
    ids[:, 1::2] = rule[ids[:, 0::2]]
    directory.mkdir(parents=True)
    torch.save({"prompt_tokens": prompt, "ids": ids, "mode": "sample"}, directory / "batch000.pt")


def test_self_distilled_heads_with_a_root_input_guess_what_follows_a_sampled_root(tmp_path):
    model, model_dir = tiny_model_folder(tmp_path / "model")
    _root_rule_selfgen(tmp_path / "selfgen")
    top1 = {}
    for root_input in (True, False):
        s = DistillSettings(num_heads=1, steps=200, batch_positions=256, lr=2e-2, warmup=10, coverage=0.99,
                            vocab_multiple=16, root_input=root_input)
        out = tmp_path / f"run-{root_input}"
        heads = distill_heads(str(model_dir), [str(tmp_path / "selfgen")], str(out), s)
        card = json.loads((out / "card.json").read_text())
        assert card["root_input"] is root_input and (heads.root_input is not None) is root_input
        top1[root_input] = card["held_out"]["all"]["top1"][0]
    # half the positions have a random root (32 ids), after which the rule decides t+2: read, about 0.5 + 0.5/32;
    # unread, t+2 is chance everywhere (where the rule decides it, it follows a random token h0 cannot foresee)
    assert top1[True] > 0.45 and top1[True] > top1[False] + 0.25, top1
    loaded = ts.Heads.load(model, out.parent / "run-True" / "heads.safetensors")
    assert loaded.root_input is not None
    h0 = torch.randn(4, model.config.hidden_size)
    lm_rows = model.lm_head.weight.detach()
    emb = model.get_input_embeddings().weight[:4]
    assert head_logits(loaded.float(), lm_rows, h0, emb).shape == (1, 4, lm_rows.shape[0])
