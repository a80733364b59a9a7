"""GGUF Q4_1 blocks kept beside a converted model (tokenswift/gguf_blocks.py): the values they encode, the kernels'
layout, and the check that only blocks encoding a weight bit for bit are used."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenswift import gguf_blocks
from tokenswift.gguf_blocks import Blocks


def quantized(rows: int, cols: int, seed: int = 0, fmt: str = "q4_1") -> tuple[np.ndarray, Blocks]:
    """A random (rows, cols) float32 matrix quantized by gguf's own quantizer, as raw blocks."""
    import gguf

    data = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.1).astype(np.float32)
    raw = gguf.quants.quantize(data, gguf.GGMLQuantizationType[fmt.upper()])
    return raw, Blocks(torch.from_numpy(raw.copy()).reshape(rows, cols // 32, gguf_blocks.BLOCK_BYTES[fmt]), fmt)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_values_are_ggufs_dequantization_rounded_to_bfloat16(fmt):
    import gguf

    raw, blocks = quantized(48, 96, fmt=fmt)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt.upper()])).to(torch.bfloat16)
    assert blocks.shape == (48, 96)
    assert torch.equal(blocks.values().view(torch.int16), expected.view(torch.int16))


def test_q8_groups_hold_sixteen_rows_scales_then_their_int8_codes():
    _, blocks = quantized(16, 64, fmt="q8_0")
    groups = blocks.groups().reshape(2, 16 * 34)  # [inputs / 32][bytes]
    for kb in range(2):
        assert torch.equal(groups[kb, :32].view(torch.float16), blocks.raw[:, kb, :2].contiguous().view(torch.float16).reshape(16))
        assert torch.equal(groups[kb, 32:].reshape(16, 32), blocks.raw[:, kb, 2:])


def test_matches_only_the_weight_the_blocks_encode():
    _, blocks = quantized(32, 64)
    weight = blocks.values()
    assert blocks.matches(weight) and blocks.matches(weight.float())
    changed = weight.clone()
    changed[3, 17] += 0.5
    assert not blocks.matches(changed)
    assert not blocks.matches(weight[:16])  # another shape
    assert not blocks.matches(weight.float() + 1e-3)  # not even bfloat16


def test_groups_hold_sixteen_rows_scales_then_codes_in_shifted_word_order():
    """q4_blocks.h layout: per (16 rows, 32 inputs): 16 d, 16 m, then per row 8 words, word j holding the codes of
    inputs j, j + 8, j + 16, j + 24 from its low bits up."""
    _, blocks = quantized(32, 64, seed=1)
    flat = blocks.groups()
    assert flat.numel() == 32 * 2 * 20 and flat.dtype == torch.uint8
    groups = flat.reshape(2, 2, 320)  # [rows / 16][inputs / 32][bytes]
    codes = blocks.codes()
    for nb, kb in ((0, 0), (1, 1), (1, 0)):
        g = groups[nb, kb]
        rows = slice(16 * nb, 16 * nb + 16)
        assert torch.equal(g[:32].view(torch.float16), blocks.raw[rows, kb, :2].contiguous().view(torch.float16).reshape(16))
        assert torch.equal(g[32:64].view(torch.float16), blocks.raw[rows, kb, 2:4].contiguous().view(torch.float16).reshape(16))
        words = g[64:].reshape(16, 8, 2).to(torch.int32)
        words = words[..., 0] | (words[..., 1] << 8)  # (16 rows, 8 words)
        for quarter in range(4):
            got = (words >> (4 * quarter)) & 15
            assert torch.equal(got.to(torch.uint8), codes[rows, kb, 8 * quarter : 8 * quarter + 8])


def test_stack_puts_weights_one_above_the_other_or_declines():
    _, a = quantized(16, 64, seed=2)
    _, b = quantized(32, 64, seed=3)
    both = Blocks.stack([a, b])
    assert both.shape == (48, 64) and torch.equal(both.values(), torch.cat([a.values(), b.values()]))
    _, other_width = quantized(16, 96)
    _, other_format = quantized(16, 64, fmt="q8_0")
    assert Blocks.stack([a, other_width]) is None and Blocks.stack([a, None]) is None
    assert Blocks.stack([a, other_format]) is None


def test_save_and_load_keep_every_block(tmp_path):
    _, a = quantized(16, 64)
    _, e = quantized(32, 64, fmt="q8_0")
    path = tmp_path / gguf_blocks.FILE_NAME
    gguf_blocks.save({"model.layers.0.mlp.up_proj.weight": a, "model.embed_tokens.weight": e}, path)
    loaded = gguf_blocks.load(path)
    assert sorted(loaded) == ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"]
    assert loaded["model.embed_tokens.weight"].format == "q8_0" and torch.equal(loaded["model.embed_tokens.weight"].raw, e.raw)
    assert loaded["model.layers.0.mlp.up_proj.weight"].format == "q4_1"
    assert torch.equal(loaded["model.layers.0.mlp.up_proj.weight"].raw, a.raw)


def test_a_model_keeps_only_blocks_that_encode_its_weights():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).to(torch.bfloat16)
    _, up = quantized(128, 64)
    _, other = quantized(64, 128, seed=5)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.copy_(up.values())
    kept = gguf_blocks.matching({"model.layers.0.mlp.up_proj.weight": up,
                                 "model.layers.0.mlp.down_proj.weight": other,
                                 "model.layers.9.mlp.down_proj.weight": other}, model)
    assert list(kept) == ["model.layers.0.mlp.up_proj.weight"]


@pytest.mark.parametrize("heads", [1, 3])
def test_unpermuting_rows_undoes_llama_cpps_rotary_order(heads):
    """llama.cpp writes each head's rows as (pairs, halves) interleaved; Hugging Face keeps (halves, pairs)."""
    rows = heads * 8
    hf = torch.arange(rows)
    llama_cpp = hf.reshape(heads, 2, rows // heads // 2).transpose(1, 2).reshape(rows)  # the converter's permute
    raw = llama_cpp[:, None, None].expand(rows, 1, 20).to(torch.uint8)  # a block of 20 bytes holding its row's number
    assert torch.equal(gguf_blocks._unpermute_rows(raw, heads)[:, 0, 0], hf.to(torch.uint8))
