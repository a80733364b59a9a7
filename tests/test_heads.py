"""Multi-token heads: official checkpoint layout in and out, the documented formula, identity init."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tokenswift as ts
from tokenswift.kv_cache import KVCache

from conftest import tiny_model, tiny_tokenizer


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def write_official_checkpoint(model, directory, num_heads=3, seed=0):
    """A directory laid out like the official TokenSwift checkpoints: head tensors inside
    model.safetensors under model.medusa_layers.*, and medusa_heads in config.json."""
    model.save_pretrained(directory, safe_serialization=True)
    weights = directory / "model.safetensors"
    tensors = load_file(str(weights))
    gen = torch.Generator().manual_seed(seed)
    h = model.config.hidden_size
    for i in range(num_heads):
        tensors[f"model.medusa_layers.{i}.linear.weight"] = torch.randn(h, h, generator=gen) * 0.1
        tensors[f"model.medusa_layers.{i}.input_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
        tensors[f"model.medusa_layers.{i}.post_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["medusa_heads"] = num_heads
    (directory / "config.json").write_text(json.dumps(config))
    return tensors


def test_official_checkpoint_loads_and_matches_the_formula(tmp_path):
    model = tiny_model("llama-gqa")
    tensors = write_official_checkpoint(model, tmp_path)
    heads = ts.Heads.load(model, tmp_path)
    assert heads.num_heads == 3
    gen = ts.Generator(model, heads=heads)
    adapter = gen.adapter
    ids = torch.arange(20, 50)
    cache = KVCache(adapter.layer_devices, 64, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype)
    h0, _ = adapter.forward(ids, torch.arange(30), cache, 0, torch.ones(30, 30, dtype=torch.bool).tril())
    ours = adapter.model.lm_head(heads(h0))  # (3, T, V)
    eps = model.config.rms_norm_eps
    h = h0
    for i in range(3):
        w = tensors[f"model.medusa_layers.{i}.linear.weight"]
        h = h + rms_norm(h, tensors[f"model.medusa_layers.{i}.input_layernorm.weight"], eps) @ w.T
        expected = rms_norm(h, tensors[f"model.medusa_layers.{i}.post_layernorm.weight"], eps) @ model.lm_head.weight.T
        assert (ours[i] - expected).abs().max().item() < 1e-4


def test_from_pretrained_loads_heads_and_plain_transformers_still_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    tokenizer = tiny_tokenizer()
    model = tiny_model("qwen2", vocab=len(tokenizer))
    write_official_checkpoint(model, tmp_path, num_heads=2)
    tokenizer.save_pretrained(tmp_path)
    gen = ts.Generator.from_pretrained(tmp_path)
    assert gen.heads is not None and gen.heads.num_heads == 2
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert plain.config.medusa_heads == 2
    without = ts.Generator.from_pretrained(tmp_path, heads=False)
    assert without.heads is None


def test_save_round_trip_in_official_layout(tmp_path):
    model = tiny_model("mistral")
    heads = ts.Heads.init(model, 3)
    with torch.no_grad():
        for block in heads.layers:
            block.linear.weight.normal_()
    path = heads.save(tmp_path)
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        assert f.metadata()["medusa_heads"] == "3"
    assert keys == {f"model.medusa_layers.{i}.{p}" for i in range(3)
                    for p in ("linear.weight", "input_layernorm.weight", "post_layernorm.weight")}
    again = ts.Heads.load(model, path)
    for a, b in zip(heads.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_a_folders_heads_file_replaces_the_heads_inside_its_weights(tmp_path):
    """Heads retrained for a checkpoint saved beside its weights (heads.safetensors, as `train-heads` writes it): the
    folder's heads file is what loads, with its own head count, drafting vocabulary and root input, though the
    weights still hold the older heads."""
    model = tiny_model("llama-gqa")
    write_official_checkpoint(model, tmp_path, num_heads=3, seed=0)
    newer = ts.Heads.init(model, 2)
    with torch.no_grad():
        for block in newer.layers:
            block.linear.weight.normal_()
    newer.add_root_input()
    with torch.no_grad():
        newer.root_input.weight.normal_()
    newer.draft_vocab = torch.tensor([5, 3, 9])
    newer.save(tmp_path / "heads.safetensors")
    loaded = ts.Heads.load(model, tmp_path)
    assert loaded.num_heads == 2
    for a, b in zip(newer.parameters(), loaded.parameters()):
        assert torch.equal(a, b)
    assert loaded.draft_vocab.tolist() == [5, 3, 9]
    (tmp_path / "heads.safetensors").unlink()  # without it, the heads inside the weights load as before
    older = ts.Heads.load(model, tmp_path)
    assert older.num_heads == 3 and older.root_input is None


def test_save_with_model_puts_heads_inside_the_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model("llama-mha")
    heads = ts.Heads.init(model, 3)
    ts.save_with_model(model, heads, None, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["medusa_heads"] == 3
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert "model.medusa_layers.2.post_layernorm.weight" in set(f.keys())
    AutoModelForCausalLM.from_pretrained(tmp_path)  # plain transformers still loads it
    assert ts.Heads.load(model, tmp_path).num_heads == 3


def test_fresh_heads_are_the_identity():
    model = tiny_model("llama-gqa")
    heads = ts.Heads.init(model, 3)
    h0 = torch.randn(5, model.config.hidden_size)
    out = heads(h0)
    for i in range(3):  # zero W: h_i == h0, so every head is post_norm(h0) with unit weights
        assert torch.allclose(out[i], heads.layers[i].post_layernorm(h0))


def test_mismatched_head_weights_are_refused(tmp_path):
    model = tiny_model("llama-gqa")
    heads = ts.Heads.init(model, 2)
    tensors = heads.official_state_dict()
    tensors["model.medusa_layers.0.linear.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape"):
        heads.load_official_state_dict(tensors)
    del tensors["model.medusa_layers.1.post_layernorm.weight"]
    with pytest.raises(ValueError, match="missing"):
        heads.load_official_state_dict(tensors)
