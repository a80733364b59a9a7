"""Our forward (own cache and attention over the model's submodules) against the HF forward."""
import pytest
import torch

import tokenswift as ts
from tokenswift.kv_cache import KVCache
from tokenswift.tree import DraftTree, ancestor_mask

from conftest import tiny_model

TOL = 1e-4


def new_cache(adapter, capacity):
    return KVCache(adapter.layer_devices, capacity, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype)


def test_prefill_logits_match_hf(family):
    model = tiny_model(family)
    adapter = ts.Generator(model).adapter
    ids = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids[None]).logits[0].float()
    cache = new_cache(adapter, 256)
    causal = torch.ones(200, 200, dtype=torch.bool).tril()
    hidden, _ = adapter.forward(ids, torch.arange(200), cache, 0, causal)
    assert (adapter.logits(hidden) - ref).abs().max().item() <= TOL


def test_incremental_logits_match_hf(family):
    """Prefill in two chunks, then one token at a time: every row equals the HF full-sequence forward."""
    model = tiny_model(family)
    adapter = ts.Generator(model).adapter
    ids = torch.randint(0, 256, (160,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(ids[None]).logits[0].float()
    cache = new_cache(adapter, 256)
    rows = []
    for start, end in [(0, 70), (70, 120)] + [(i, i + 1) for i in range(120, 160)]:
        t = end - start
        h, _ = adapter.forward(ids[start:end], torch.arange(start, end), cache, start,
                               torch.ones(t, t, dtype=torch.bool).tril())
        rows.append(adapter.logits(h))
    assert (torch.cat(rows) - ref).abs().max().item() <= TOL


def test_tree_forward_equals_each_path_alone(family):
    """A tree-masked forward gives every node the logits its root-to-node path gets when run alone."""
    model = tiny_model(family)
    adapter = ts.Generator(model).adapter
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 256, (120,), generator=gen)
    tree = DraftTree.with_root(int(prefix[-1]))
    for _ in range(12):
        depth = int(torch.randint(1, 5, (1,), generator=gen))
        tree.add_path(torch.randint(0, 4, (depth,), generator=gen).tolist(), "head")  # small alphabet: shared prefixes
    assert len(tree) > 8
    cache = new_cache(adapter, 256)
    body = prefix[:-1]
    adapter.forward(body, torch.arange(len(body)), cache, 0, torch.ones(len(body), len(body), dtype=torch.bool).tril())
    base = len(body)
    h, _ = adapter.forward(torch.tensor(tree.tokens), base + torch.tensor(tree.depths), cache, base,
                           ancestor_mask(tree.parents))
    tree_logits = adapter.logits(h)
    for leaf in tree.leaves():
        nodes = [0] + tree.path_to(leaf)
        seq = torch.cat([prefix, torch.tensor([tree.tokens[n] for n in nodes[1:]], dtype=torch.long)])
        with torch.no_grad():
            ref = model(seq[None]).logits[0, base:].float()
        assert (tree_logits[nodes] - ref).abs().max().item() <= TOL


def test_unsupported_model_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="llama, qwen2, mistral"):
        ts.Generator(model)


def test_accelerate_device_map_with_disk_offload_keeps_working(tmp_path):
    """accelerate's hooks are honoured: a layer offloaded to disk (weights on `meta`) still runs."""
    from transformers import AutoModelForCausalLM

    model = tiny_model("llama-gqa", seed=2)
    model.save_pretrained(tmp_path)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    offloaded = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map, offload_folder=tmp_path / "off")
    assert offloaded.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    prompt = list(range(10, 40))
    expected = ts.Generator(model).generate(prompt, ts.Settings(), 50, method="ar").token_ids
    gen = ts.Generator(offloaded, heads=ts.Heads.init(offloaded, 2))
    assert gen.generate(prompt, ts.Settings(), 50, method="ar").token_ids == expected
    assert gen.generate(prompt, ts.Settings(kv_budget=32, kv_sink=4), 50).token_ids == expected
