"""The optional native CPU kernels (tokenswift/native): exact enough to share the lossless promise, and optional.

Where this machine cannot build them (no C compiler, no AVX2 with FMA) the kernel tests skip with the reason, and the
fallback tests still run: then every model runs through PyTorch, as the rest of the suite checks."""
import ctypes
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tokenswift as ts
from tokenswift.kv_cache import KVCache
from tokenswift.native import abi, build, decide, layers, panels, rows_attention
from tokenswift.sampling import decide_rows, seen_rows

from conftest import random_heads, tiny_config

ROOT = Path(__file__).resolve().parents[1]
needs_panels = pytest.mark.skipif(not panels.available(), reason=f"native panel kernel: {panels.why_unavailable()}")
needs_decide = pytest.mark.skipif(not decide.available(), reason=f"native decide kernel: {build.why_not('decide_rows')}")
needs_attention = pytest.mark.skipif(not rows_attention.available(),
                                     reason=f"native attention kernel: {build.why_not('attend_rows')}")
needs_amx = pytest.mark.skipif(not panels.amx_available(), reason=f"AMX panel kernel: {build.why_not('panel_amx') or 'off'}")
needs_bf16 = pytest.mark.skipif(not panels.bf16_available(),
                                reason=f"bfloat16 panel kernel: {build.why_not('panel_bf16') or 'off'}")
needs_q4 = pytest.mark.skipif(not panels.q4_available(), reason=f"Q4_1 block kernel: {build.why_not('panel_q4') or 'off'}")
needs_stack = pytest.mark.skipif(not (layers.available() and rows_attention.available() and panels.available()),
                                 reason=f"native decoder stack: {build.why_not('layer_rows') or build.why_not('attend_rows')}")


@needs_panels
@pytest.mark.parametrize("n,k", [(32, 7), (96, 200), (640, 384), (8192, 64)])
def test_panel_product_matches_torch_for_every_row_count(n, k):
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(20, k, generator=gen)
    m = panels.PanelMatrix(w)
    ref = x.double() @ w.double().t()
    for rows in range(1, panels.MAX_ROWS + 1):
        got = m(x[:rows])
        assert got.shape == (rows, n)
        assert torch.allclose(got.double(), ref[:rows], rtol=1e-5, atol=1e-4), rows


@needs_panels
def test_a_row_does_not_depend_on_the_rows_computed_with_it():
    """AR computes one row, verification many: the kernel gives every row bitwise the same result."""
    gen = torch.Generator().manual_seed(1)
    m = panels.PanelMatrix(torch.randn(256, 384, generator=gen))
    x = torch.randn(16, 384, generator=gen)
    together = m(x)
    for r in range(16):
        assert torch.equal(m(x[r : r + 1])[0], together[r])


@needs_amx
@pytest.mark.parametrize("n,k", [(32, 32), (640, 384), (384, 1024), (8192, 384)])
def test_amx_product_of_bfloat16_weights_matches_float64_for_every_row_count(n, k):
    """bfloat16 weights through AMX tiles, each float32 input split into three exact bfloat16 parts: as accurate
    as a float32 product, and a row never depends on the rows computed with it."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    m = panels.PanelMatrix.build(w)
    assert m.kind == 1 and m.panels.element_size() == 2  # half the bytes of float32 panels
    x = torch.randn(panels.MAX_ROWS, k, generator=gen) * torch.logspace(-3, 3, k)  # a wide range of magnitudes
    ref = x.double() @ w.double().t()
    bound = 4e-6 * (x.double().abs() @ w.double().abs().t())  # about 30 float32 ulps of the absolute sum
    assert ((x @ w.float().t()).double() - ref).abs().le(bound).all()  # a float32 product meets it too
    together = m(x)
    for rows in range(1, panels.MAX_ROWS + 1):
        got = m(x[:rows])
        assert torch.equal(got, together[:rows]), rows
        assert (got.double() - ref[:rows]).abs().le(bound[:rows]).all(), rows
    for r in range(panels.MAX_ROWS):
        assert torch.equal(m(x[r : r + 1])[0], together[r])


@needs_amx
def test_weights_that_are_not_bfloat16_keep_float32_panels():
    w = torch.randn(64, 64)
    assert panels.PanelMatrix.build(w).kind == 0
    assert panels.PanelMatrix.build(w.to(torch.bfloat16).float()).kind == 1


@needs_bf16
@pytest.mark.parametrize("n,k", [(32, 7), (640, 384), (384, 1024), (8192, 384), (49152, 576)])  # SmolLM2's LM head
def test_bfloat16_panels_give_the_float32_panels_products_bitwise(n, k):
    """Where AMX does not serve, a bfloat16-exact weight is kept as bfloat16 panels (half the bytes) and widened in
    registers (AVX-512 or AVX2): every product is bitwise what float32 panels of the same weight give, for every
    row count, so a verified row is bitwise AR's."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    m = panels.PanelMatrix(w, bf16=True)
    assert m.kind == 2 and m.panels.element_size() == 2
    wide = panels.PanelMatrix(w.float())
    assert wide.kind == 0
    x = torch.randn(panels.MAX_ROWS, k, generator=gen) * torch.logspace(-3, 3, k)
    for rows in range(1, panels.MAX_ROWS + 1):
        assert torch.equal(m(x[:rows]), wide(x[:rows])), rows


@needs_bf16
def test_bfloat16_exact_weights_take_bfloat16_panels_where_amx_does_not_serve(monkeypatch):
    """AMX tiles where they serve (kind 1); bfloat16 panels for the other bfloat16-exact weights and everywhere
    without AMX (an AVX-512 CPU without AMX, an AVX2 CPU: kind 2); float32 panels for the rest (kind 0)."""
    exact = torch.randn(64, 64).to(torch.bfloat16).float()
    assert panels.PanelMatrix.build(exact).kind == (1 if panels.amx_available() else 2)
    assert panels.PanelMatrix.build(torch.randn(64, 48).to(torch.bfloat16)).kind == 2  # k % 32: no AMX tiles
    assert panels.PanelMatrix.build(torch.randn(64, 64)).kind == 0  # not bfloat16-exact: float32 panels
    monkeypatch.setattr(panels, "_amx_function", lambda: None)  # as on a CPU without AMX
    assert panels.PanelMatrix.build(exact).kind == 2


def test_bfloat16_panels_can_be_turned_off():
    out = run_isolated("import torch; from tokenswift.native import panels; w = torch.ones(64, 64); "
                       "print(panels.bf16_available(), panels.PanelMatrix.build(w) is None or "
                       "panels.PanelMatrix.build(w).kind)", TOKENSWIFT_BF16_PANELS="0")
    assert out.split() in (["False", "0"], ["False", "True"], ["False", "1"])


def test_amx_can_be_turned_off():
    out = run_isolated("import torch; from tokenswift.native import panels; "
                       "print(panels.amx_available(), panels.PanelMatrix.build(torch.ones(64, 64)) is None or "
                       "panels.PanelMatrix.build(torch.ones(64, 64)).kind)", TOKENSWIFT_AMX="0")
    available, kind = out.split()
    assert available == "False" and kind in ("0", "2", "True")  # float32 or AVX2 bfloat16 panels, or none


def test_panel_matrix_refuses_what_it_cannot_serve():
    assert panels.PanelMatrix.build(torch.randn(33, 16)) is None  # output size not a multiple of 32


def reference_attention(qs, k, v, scale, t, block_mask):
    scores = (qs.double() @ k.double().transpose(1, 2)) * scale  # (Hkv, R, S)
    if block_mask is not None:
        rows, s = scores.shape[1], scores.shape[2]
        allowed = block_mask[torch.arange(rows) % t]  # (R, t)
        scores[..., s - t :] = scores[..., s - t :].masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.double()).float()


SHAPES = [(s, t, g) for s in (1, 15, 16, 17, 1000) for t, g in ((1, 3), (3, 1), (5, 3), (16, 3)) if t <= s]


@needs_attention
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s,t,g", SHAPES)
def test_rows_attention_matches_softmax_attention(d, s, t, g):
    gen = torch.Generator().manual_seed(s * 7 + t)
    hkv, cap = 2, s + 9
    k = torch.randn(hkv, cap, d, generator=gen)[:, :s]  # cache views: a head stride larger than s * d
    v = torch.randn(hkv, cap, d, generator=gen)[:, :s]
    qs = torch.randn(hkv, g * t, d, generator=gen) * 2
    mask = None
    if t > 1:  # a random tree: each new token sees itself and some earlier ones
        mask = (torch.rand(t, t, generator=gen) < 0.5).tril()
        mask.fill_diagonal_(True)
    got = rows_attention.attend_rows(qs, k, v, d ** -0.5, t, mask)
    assert got is not None
    assert torch.allclose(got, reference_attention(qs, k, v, d ** -0.5, t, mask), rtol=1e-5, atol=2e-6)


def tree_parents(t: int) -> list[int]:
    """A small tree laid out parents first: siblings and chains (node i's parent is node max(0, i - 2))."""
    return [-1] + [max(0, i - 2) for i in range(1, t)]


def tree_mask(parents: list[int]) -> torch.Tensor:
    """(t, t) bool: node i sees itself and its ancestors."""
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i in range(1, len(parents)):
        mask[i] |= mask[parents[i]]
    return mask


@needs_attention
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("prefix", [1, 16, 31, 37, 300])
def test_a_tree_row_is_bitwise_the_row_its_path_gives_alone(d, prefix):
    """A verified node's attention is what AR's step computes for that token once its ancestors are committed: the
    keys of the prefix, then its path's keys in order, one new token (t = 1). Bitwise, for trees of 2 to 48 nodes
    whose new tokens fall in other lanes than AR's (the sum must add each in AR's lane; 48 nodes after a prefix of
    31 fill the kernel's path buffer)."""
    gen = torch.Generator().manual_seed(prefix * 3 + d)
    hkv = 2
    for t, g in ((2, 3), (5, 3), (9, 3), (16, 3), (48, 1)):
        parents = tree_parents(t)
        mask = tree_mask(parents)
        k = torch.randn(hkv, prefix + t, d, generator=gen)
        v = torch.randn(hkv, prefix + t, d, generator=gen)
        qs = torch.randn(hkv, g * t, d, generator=gen) * 2
        tree = rows_attention.attend_rows(qs, k, v, d ** -0.5, t, mask)
        for node in range(t):
            path = [prefix + j for j in range(t) if mask[node, j]]  # ancestors, then the node: slot order
            keys = list(range(prefix)) + path
            alone = rows_attention.attend_rows(qs[:, node::t].contiguous(), k[:, keys], v[:, keys], d ** -0.5, 1, None)
            assert torch.equal(alone, tree[:, node::t]), (t, node)


@needs_attention
def test_rows_attention_declines_other_head_sizes_and_dtypes():
    q, k = torch.randn(2, 3, 32), torch.randn(2, 10, 32)
    assert rows_attention.attend_rows(q, k, k, 0.1, 1, None) is None
    q, k = torch.randn(2, 3, 64, dtype=torch.float64), torch.randn(2, 10, 64, dtype=torch.float64)
    assert rows_attention.attend_rows(q, k, k, 0.1, 1, None) is None


def head_dim_64_model(family: str):
    """A tiny model whose attention heads have 64 dims, so that the native attention kernel serves it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    cfg = tiny_config(family, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                      num_key_value_heads=1 if family != "llama-mha" else 2, head_dim=64)
    cfg.eos_token_id = cfg.bos_token_id = cfg.pad_token_id = None
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


@needs_attention
@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa", "qwen2"])
def test_native_forward_matches_hf(family):
    """Prefill, one token at a time, and a tree-masked block, through the native kernels, against HF."""
    model = head_dim_64_model(family)
    adapter = ts.Generator(model).adapter
    assert adapter.lean is not None and adapter.lean.native_rows
    ids = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids[None]).logits[0].float()
    cache = KVCache(adapter.layer_devices, 256, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype)
    rows = []
    for start, end in [(0, 100)] + [(i, i + 1) for i in range(100, 140)] + [(140, 150)]:
        t = end - start
        h, _ = adapter.forward(ids[start:end], torch.arange(start, end), cache, start,
                               torch.ones(t, t, dtype=torch.bool).tril())
        rows.append(adapter.logits(h))
    assert (torch.cat(rows) - ref).abs().max().item() <= 1e-4


@needs_stack
@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa", "qwen2"])
def test_native_stack_computes_what_the_pytorch_path_computes(family):
    """The whole decoder stack in one native call (layer_rows.c) gives bitwise the hidden states and cache entries of
    the PyTorch path (which uses the same element-wise functions), for 1 to 16 new tokens under a tree mask."""
    model = head_dim_64_model(family)
    lean = ts.Generator(model).adapter.lean
    stack = lean.native_stack
    assert stack is not None
    adapter = ts.Generator(model).adapter
    ids = torch.randint(0, 256, (120,), generator=torch.Generator().manual_seed(4))
    for t in (1, 2, 5, 9, 16):
        caches, hidden = [], []
        for use_stack in (True, False):
            lean.native_stack = stack if use_stack else None
            cache = KVCache(adapter.layer_devices, 160, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype)
            lean.forward(ids[:100], torch.arange(100), cache, 0, torch.ones(100, 100, dtype=torch.bool).tril())
            mask = tree_mask(tree_parents(t))  # a small tree: siblings and chains
            depths = mask.sum(1) - 1
            h, _ = lean.forward(ids[100 : 100 + t], 100 + depths, cache, 100, mask if t > 1 else None)
            hidden.append(h)
            caches.append((torch.stack(cache.k)[:, :, : 100 + t], torch.stack(cache.v)[:, :, : 100 + t]))
        lean.native_stack = stack
        assert torch.equal(hidden[0], hidden[1]), t
        assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1]), t


@needs_stack
@pytest.mark.parametrize("family", ["llama-gqa", "qwen2"])
def test_a_verified_row_is_bitwise_the_row_ar_computes(family):
    """Through the native decoder stack, the logits of every node of a verified tree are bitwise those AR's step
    computes for that token after committing its ancestors one by one: TokenSwift's tokens are AR's by construction,
    not only where no near-tie happens to fall."""
    model = head_dim_64_model(family)
    adapter = ts.Generator(model).adapter
    lean = adapter.lean
    stack = lean.native_stack
    assert stack is not None
    served = []  # every forward below must run through the stack (a PyTorch fallback would prove nothing)
    stack_run = stack.run
    stack.run = lambda *args: served.append(stack_run(*args)) or served[-1]
    ids = torch.randint(0, 256, (130,), generator=torch.Generator().manual_seed(6))
    n = 107  # not a multiple of 16: the tree's new tokens fall in other lanes than AR's

    def prefilled() -> KVCache:
        cache = KVCache(adapter.layer_devices, n + 20, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype)
        lean.forward(ids[:n], torch.arange(n), cache, 0, torch.ones(n, n, dtype=torch.bool).tril())
        return cache

    forwards = 0
    for t in (2, 6, 16):
        parents = tree_parents(t)
        mask = tree_mask(parents)
        forwards += 1 + int(mask.sum())  # the tree's, then one per token of every node's path
        tokens = ids[n : n + t]
        hidden, _ = lean.forward(tokens, n + mask.sum(1) - 1, prefilled(), n, mask)
        tree_logits = lean.logits(hidden)
        for node in range(t):
            path = [j for j in range(t) if mask[node, j]]
            cache = prefilled()
            for depth, j in enumerate(path):  # AR: one token at a time
                h, _ = lean.forward(tokens[j : j + 1], torch.tensor([n + depth]), cache, n + depth, None)
            assert torch.equal(lean.logits(h)[0], tree_logits[node]), (family, t, node)
    assert len(served) == forwards and all(served)


@needs_attention
@pytest.mark.parametrize("settings", [dict(), dict(draft="fused"), dict(tree="1x2x2", ngram_topk=3),
                                      dict(penalty=1.3, penalty_window=64)])
def test_greedy_tokenswift_equals_ar_through_the_native_kernels(settings):
    model = head_dim_64_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    base = {k: v for k, v in settings.items() if k.startswith("penalty")}
    ar = gen.generate(prompt, ts.Settings(**base), 300, method="ar").token_ids
    result = gen.generate(prompt, ts.Settings(**settings), 300)
    assert result.token_ids == ar
    assert result.stats["mean_accepted"] > 1.0  # drafts were accepted: multi-row verification ran


@needs_stack
@pytest.mark.parametrize("kind", [pytest.param(1, marks=needs_amx, id="amx"),
                                  pytest.param(2, marks=needs_bf16, id="bf16-panels")])
def test_tokenswift_equals_ar_through_bfloat16_weights_and_the_native_stack(kind, monkeypatch):
    """A bfloat16 checkpoint (as the default model is): its matrices go through AMX tiles (kind 1) or, without AMX
    (AVX-512 or AVX2 CPUs; here AMX is set aside for kind 2), bfloat16 panels (kind 2) inside the native stack;
    greedy TokenSwift gives AR's tokens and sampled TokenSwift AR's samples."""
    if kind == 2:
        monkeypatch.setattr(panels, "_amx_function", lambda: None)
    model = head_dim_64_model("llama-gqa").to(torch.bfloat16)
    gen = ts.Generator(model, heads=random_heads(model))
    lean = gen.adapter.lean
    assert lean.native_stack is not None and lean.layers[0].gate_up.panels.kind == kind and lean.head.panels.kind == kind
    prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    for settings in (dict(), dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)):
        ar = gen.generate(prompt, ts.Settings(**settings), 200, method="ar", seed=4).token_ids
        for tree in ("auto", "1x2x2", "1x3x3x3"):  # 1x3x3x3: 40 rows, through the PyTorch path
            result = gen.generate(prompt, ts.Settings(tree=tree, **settings), 200, seed=4)
            assert result.token_ids == ar, (settings, tree)


def q4_model(family: str):
    """head_dim_64_model in bfloat16 with every layer matrix made of random GGUF Q4_1 blocks and its LM head of Q8_0
    blocks (as SmolLM2 converted from its GGUF file is), the blocks attached as tokenswift.gguf_blocks.load_for
    attaches a folder's."""
    from tokenswift import gguf_blocks

    model = head_dim_64_model(family).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(11)
    blocks = {}
    for name, p in model.named_parameters():
        if (name.startswith("model.layers.") and p.dim() == 2) or name == "lm_head.weight":
            b = panels._random_blocks(gen, *p.shape, "q8_0" if name == "lm_head.weight" else "q4_1")
            with torch.no_grad():
                p.copy_(b.values())
            blocks[name] = b
    gguf_blocks.attach(model, blocks)
    return model


@needs_q4
@pytest.mark.parametrize("n,k", [(16, 32), (48, 160), (640, 384), (96, 1536)])
def test_q4_block_products_match_float64_over_the_values_they_encode(n, k):
    """panel_q4 (every build): for 1-20 rows, within float32 rounding of float64 products over the bfloat16 values
    the blocks encode, every row bitwise the same whatever rows come with it; the rebuilt values are those bitwise."""
    blocks = panels._random_blocks(torch.Generator().manual_seed(n + k), n, k)
    groups = blocks.groups()
    values = blocks.values().float()
    rebuilt = torch.empty(n, k)
    dequantize = build.library().q4_dequantize
    dequantize.restype, dequantize.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    assert dequantize(groups.data_ptr(), n, k, rebuilt.data_ptr()) == 0 and torch.equal(rebuilt, values)
    m = panels.PanelMatrix.from_blocks(groups, n, k, amx=False)
    assert m.kind == 3 and m.any_rows
    x = torch.randn(panels.MAX_ROWS + 4, k, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ values.double().t()
    alone = torch.cat([m(x[i : i + 1]) for i in range(len(x))])  # each row in a one-row call
    for rows in range(1, len(x) + 1):  # 1-6 rows: each rebuilt row used at once; from 7: a strip, in passes of 1-4
        got = m(x[:rows])
        assert torch.allclose(got.double(), ref[:rows], rtol=1e-5, atol=1e-4), rows
        assert torch.equal(got, alone[:rows]), rows


@needs_q4
@needs_amx
@pytest.mark.parametrize("n,k", [(32, 32), (64, 96), (960, 576), (576, 1536)])
def test_q4_blocks_on_amx_tiles_give_the_amx_products_bitwise(n, k):
    """panel_q4_amx: the weights on the other side of the tile product, rebuilt from their blocks, give bitwise what
    panel_amx gives over their bfloat16 values, for any number of rows (prefill chunks too)."""
    blocks = panels._random_blocks(torch.Generator().manual_seed(n * k), n, k)
    m = panels.PanelMatrix.from_blocks(blocks.groups(), n, k)
    assert m.kind == 4
    reference = panels.PanelMatrix(blocks.values().float(), amx=True)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(2))
    # beyond 16 rows the sums go through vector lanes: passes of 5 tokens, the last of 1 or 2 tokens, alone or paired
    for rows in (1, 4, 5, 6, 12, 16, 17, 21, 22, 26, 40):
        assert torch.equal(m(x[:rows]), reference(x[:rows])), rows


@needs_q4
@needs_amx
def test_tile_products_cut_into_calls_give_the_rows_of_one_call(monkeypatch):
    """Many rows on AMX tiles go in calls whose split rows fit the core's L2 (TILE_SPLIT_BYTES): the rows of every
    call, the last one short, are bitwise those of one call, on bfloat16 weights and on Q4_1 blocks."""
    n, k = 64, 96
    blocks = panels._random_blocks(torch.Generator().manual_seed(7), n, k)
    tiled = panels.PanelMatrix.from_blocks(blocks.groups(), n, k)
    plain = panels.PanelMatrix(blocks.values().float(), amx=True)
    x = torch.randn(47, k, generator=torch.Generator().manual_seed(3))
    whole = [tiled(x), plain(x)]
    calls = {"tiled": [], "plain": []}
    for name, matrix in (("tiled", tiled), ("plain", plain)):
        spy = lambda *a, f=matrix._kernel, seen=calls[name]: seen.append(a[3]) or f(*a)  # noqa: E731
        monkeypatch.setattr(matrix, "_kernel", spy)
    monkeypatch.setattr(panels, "TILE_SPLIT_BYTES", 25 * 6.4 * k)  # calls of 20 rows (pairs of passes: 10s)
    assert torch.equal(tiled(x), whole[0]) and torch.equal(plain(x), whole[1]) and torch.equal(whole[0], whole[1])
    assert calls == {"tiled": [20, 20, 7], "plain": [20, 20, 7]}


@needs_amx
@pytest.mark.parametrize("n,k", [(32, 32), (96, 576), (4096, 576)])
def test_q8_blocks_on_amx_tiles_give_the_amx_products_bitwise(n, k):
    """panel_q8_amx (SmolLM2's tied LM head): bitwise panel_amx over the values Q8_0 blocks encode; off AMX no kernel
    takes Q8_0 blocks (the bfloat16 weights serve)."""
    if not panels.q8_amx_available():
        pytest.skip(f"Q8_0 blocks on AMX tiles: {build.why_not('panel_q8_amx') or 'off'}")
    blocks = panels._random_blocks(torch.Generator().manual_seed(n + k), n, k, "q8_0")
    m = panels.PanelMatrix.from_blocks(blocks.groups(), n, k, fmt="q8_0")
    assert m.kind == 5
    assert panels.PanelMatrix.from_blocks(blocks.groups(), n, k, amx=False, fmt="q8_0") is None
    reference = panels.PanelMatrix(blocks.values().float(), amx=True)
    x = torch.randn(26, k, generator=torch.Generator().manual_seed(3))
    for rows in (1, 3, 5, 6, 12, 17, 22, 26):  # beyond 16 rows the sums go through vector lanes
        assert torch.equal(m(x[:rows]), reference(x[:rows])), rows


@needs_q4
def test_panel_q4_refuses_shapes_it_does_not_handle():
    blocks = panels._random_blocks(torch.Generator().manual_seed(0), 16, 64)
    assert panels.PanelMatrix.from_blocks(blocks.groups(), 16, 48) is None  # k not a multiple of 32
    assert panels.PanelMatrix.from_blocks(blocks.groups(), 24, 64) is None  # n not a multiple of 16
    m = panels.PanelMatrix.from_blocks(blocks.groups(), 16, 64)
    assert m.kind == 3  # 16 outputs: too few for AMX's pairs of 16, the vector kernel serves
    kernel = build.library().panel_q4
    kernel.restype, kernel.argtypes = ctypes.c_int, panels._BLOCK_ARGS
    x, y, scratch = torch.randn(1, 64), torch.empty(1, 16), torch.empty(1 << 16, dtype=torch.uint8)
    assert kernel(x.data_ptr(), m.panels.data_ptr(), y.data_ptr(), 1, 64, 16, None, 0) == -2  # no scratch
    for k, n in ((48, 16), (64, 24), (0, 16)):  # the kernel's own checks (from_blocks declines these first)
        assert kernel(x.data_ptr(), m.panels.data_ptr(), y.data_ptr(), 1, k, n, scratch.data_ptr(), scratch.numel()) == -1


@needs_stack
@needs_q4
@pytest.mark.parametrize("tiles", [True, False])
def test_tokenswift_equals_ar_through_q4_blocks_and_the_native_stack(tiles, monkeypatch):
    """A model converted from Q4_1 blocks: its layer matrices stream the blocks (AMX tiles, or the vector kernel
    where AMX is set aside) inside the native stack, with logits within float32 rounding of the bfloat16 path's
    (bitwise on AMX tiles), greedy TokenSwift giving AR's tokens and sampled TokenSwift AR's samples."""
    if not tiles:
        monkeypatch.setattr(panels, "_amx_function", lambda: None)
    elif not panels.q4_amx_available():
        pytest.skip(f"Q4_1 blocks on AMX tiles: {build.why_not('panel_q4_amx') or 'no AMX'}")
    model = q4_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    lean = gen.adapter.lean
    kind = 4 if tiles else 3
    assert lean.native_stack is not None and {lean.layers[0].qkv.panels.kind, lean.layers[1].down.panels.kind} == {kind}
    assert lean.head.panels.kind == (5 if tiles else 1 if panels.amx_available() else 2)  # Q8_0: AMX tiles only
    assert lean.draft_head is lean.head  # the heads draft over every row: heads_top reads the Q8_0 blocks too
    same_weights = head_dim_64_model("llama-gqa").to(torch.bfloat16)
    same_weights.load_state_dict(model.state_dict())
    plain = ts.Generator(same_weights)  # no blocks attached
    assert plain.adapter.lean.layers[0].qkv.panels.kind in (1, 2)
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(5))

    def logits(adapter):  # a prefill, then a token at a time
        cache = KVCache(adapter.layer_devices, 64, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype)
        rows = []
        for start, end in [(0, 30)] + [(i, i + 1) for i in range(30, 40)]:
            t = end - start
            h, _ = adapter.forward(ids[start:end], torch.arange(start, end), cache, start,
                                   torch.ones(t, t, dtype=torch.bool).tril())
            rows.append(adapter.logits(h))
        return torch.cat(rows)
    ours, theirs = logits(gen.adapter), logits(plain.adapter)
    assert torch.equal(ours, theirs) if tiles else torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    prompt = ids[:12].tolist()
    for settings in (dict(), dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)):
        ar = gen.generate(prompt, ts.Settings(**settings), 150, method="ar", seed=4).token_ids
        for tree in ("auto", "1x2x2", "1x3x3x3"):
            assert gen.generate(prompt, ts.Settings(tree=tree, **settings), 150, seed=4).token_ids == ar, (settings, tree)


@needs_stack
@needs_bf16
def test_a_49152_row_lm_head_runs_on_bfloat16_panels(monkeypatch):
    """SmolLM2-135M's shape where AMX does not serve (an AVX-512 CPU without AMX): the 49,152 x 576 LM head (tied
    to the embeddings) and its drafting rows stay bfloat16 panels, and its logits are the float32 panels' bitwise."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(panels, "_amx_function", lambda: None)
    torch.manual_seed(7)
    cfg = tiny_config("llama-gqa", vocab=49152, hidden_size=576, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval().to(torch.bfloat16)
    lean = ts.Generator(model).adapter.lean
    assert lean.native_stack is not None and lean.layers[0].gate_up.panels.kind == 2
    assert lean.head.panels.kind == 2 and lean.head.panels.panels.element_size() == 2
    assert lean.draft_head.panels.kind == 2 and lean.draft_head.out_features < 49152
    h = torch.randn(4, 576)
    wide = panels.PanelMatrix(model.lm_head.weight.detach().float())
    assert torch.equal(lean.head(h), wide(h))


@needs_stack
def test_auto_never_plans_past_the_native_stack(monkeypatch):
    """Past the stack's limit a step takes the PyTorch path (measured 1.7x the time of 16 rows at 17), a step the cost
    model cannot see: tree="auto" plans at most `max_tokens` rows, and a plan given that bound keeps no more."""
    from tokenswift import auto

    model = head_dim_64_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    stack = gen.adapter.lean.native_stack
    limit = stack.max_tokens
    assert stack.serves(limit) and not stack.serves(limit + 1)
    bounds = []

    real_choose = auto.choose

    def recording_choose(reach, depths, costs, max_rows=auto.MAX_ROWS, **kw):
        bounds.append(max_rows)
        return real_choose(reach, depths, costs, max_rows, **kw)

    monkeypatch.setattr(auto, "choose", recording_choose)
    pattern = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(5)).tolist() * 6
    steps = list(gen.stream(pattern, ts.Settings(tree="auto"), 100, detail=False))
    assert bounds and set(bounds) == {limit}
    assert max(step.draft_nodes + 1 for step in steps) <= limit
    flat = auto.CostModel()
    flat.rows, flat.seconds = [1, 4, 12], [1.0, 1.0, 1.0]  # rows that cost nothing: only the bound stops a plan
    plan = auto.choose([1.0] + [0.99] * 40, [0] + [1] * 40, flat, limit)
    assert len(plan.keep) + 1 == limit


@needs_stack
def test_native_compaction_moves_what_the_pytorch_compaction_moves():
    gen = torch.Generator().manual_seed(8)
    caches = [KVCache([torch.device("cpu")] * 3, 60, 2, 64, torch.float32) for _ in range(2)]
    for x, y in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        x.copy_(torch.randn(x.shape, generator=gen))
        y.copy_(x)
    for src, dst in (([21, 23, 26, 30], 21), ([40], 35), ([10, 11, 12, 20], 10)):
        assert layers.move_slots(caches[0], src, dst)
        for layer in range(3):  # the PyTorch moves, as KVCache.compact does them without the native library
            index = torch.tensor(src)
            for buf in (caches[1].k[layer], caches[1].v[layer]):
                buf[:, dst : dst + len(src)] = buf.index_select(1, index)
        assert all(torch.equal(x, y) for x, y in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v))
    assert not layers.move_slots(caches[0], [30, 29], 20)  # not ascending: left to PyTorch


@needs_stack
def test_two_threads_generating_on_one_model_get_their_own_results():
    """The native stack keeps its scratch buffer and cache pointers per thread: two generations at once on the same
    generator (ctypes releases the GIL inside the kernels) give what each gives alone."""
    import threading

    model = head_dim_64_model("llama-gqa").to(torch.bfloat16)
    gen = ts.Generator(model, heads=random_heads(model))
    prompts = [torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(s)).tolist() for s in (1, 2)]
    alone = [gen.generate(p, ts.Settings(tree="auto"), 150).token_ids for p in prompts]
    together = [None, None]

    def run(i):
        together[i] = gen.generate(prompts[i], ts.Settings(tree="auto"), 150).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def run_isolated(code: str, **env) -> str:
    """Run `code` in a fresh interpreter (the kernels are loaded once per process)."""
    full_env = {**os.environ, **env}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CHECK = ("from tokenswift.native import panels, rows_attention, decide, build; import tokenswift as ts; "
         "print(panels.available(), rows_attention.available() or decide.available(), '|', panels.why_unavailable())")


def test_native_kernels_can_be_turned_off():
    out = run_isolated(CHECK, TOKENSWIFT_NATIVE="0")
    assert out.startswith("False False |") and "TOKENSWIFT_NATIVE=0" in out


# The same runs in this process (native kernels where they build) and in one whose compiler fails (PyTorch only).
COMPILER_RUNS = """
import json, torch
from conftest import NATIVE_FAMILY, random_heads, tiny_model
model = tiny_model(NATIVE_FAMILY, seed=3)
gen = ts.Generator(model, heads=random_heads(model))
prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(8)).tolist()
paper = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)
runs = {"stack": gen.adapter.lean.native_stack is not None,
        "greedy-ar": gen.generate(prompt, ts.Settings(), 120, method="ar").token_ids,
        "greedy": gen.generate(prompt, ts.Settings(tree="1x2x2"), 120).token_ids,
        "sampled-ar": gen.generate(prompt, ts.Settings(**paper), 120, method="ar", seed=5).token_ids,
        "sampled": gen.generate(prompt, ts.Settings(tree="auto", **paper), 120, seed=5).token_ids}
"""


def test_a_failing_compiler_leaves_the_pytorch_path(tmp_path):
    """No usable compiler: the kernels are unavailable with a reason, and generation gives the tokens this process
    gives (through the native kernels and decoder stack where they build here): same model, prompt, settings, seed."""
    code = CHECK + "\n" + COMPILER_RUNS + "print(json.dumps(runs))"
    out = run_isolated(code, CC="false", TOKENSWIFT_CACHE=str(tmp_path), PYTHONPATH=str(ROOT / "tests"))
    first, without = out.splitlines()
    assert first.startswith("False False |") and "could not build" in first
    without = json.loads(without)
    assert not without.pop("stack")
    scope = {"ts": ts}
    exec(COMPILER_RUNS, scope)
    native = scope["runs"]
    assert native.pop("stack") == (layers.available() and rows_attention.available() and panels.available())
    assert all(len(tokens) == 120 for tokens in without.values())
    assert native == without
    assert without["greedy"] == without["greedy-ar"] and without["sampled"] == without["sampled-ar"]


LOAD = ("from tokenswift.native import build, panels; print(panels.available(), '|', build.loaded_variant() and "
        "build.loaded_variant().name, '|', panels.why_unavailable())")


def fake_compiler(tmp_path, body: str) -> tuple[Path, Path]:
    """A compiler that logs each call and then runs `body` (sh), and the log."""
    log, compiler = tmp_path / "calls", tmp_path / "cc"
    compiler.write_text(f"#!/bin/sh\necho called >> {log}\n{body}\n")
    compiler.chmod(0o755)
    return compiler, log


def calls(log: Path) -> int:
    return log.read_text().count("called") if log.exists() else 0


@pytest.mark.skipif(not {"avx2", "fma"} <= build.cpu_flags(), reason="the kernels need an x86-64 CPU with AVX2 and FMA")
def test_a_variant_the_compiler_refuses_is_not_compiled_again(tmp_path):
    """A compiler's refusal (an #error, an unknown -m option) is remembered per machine, compiler and variant: a later
    process does not run the compiler again for it, and gives the same reason."""
    compiler, log = fake_compiler(tmp_path, "echo 'x.c:1:2: error: #error nope' >&2\nexit 1")
    env = dict(CC=str(compiler), TOKENSWIFT_CACHE=str(tmp_path / "cache"), TOKENSWIFT_NATIVE="1")
    first = run_isolated(LOAD, TOKENSWIFT_ISA="avx2", **env)
    once = calls(log)
    second = run_isolated(LOAD, TOKENSWIFT_ISA="avx2", **env)
    assert first.startswith("False | None |") and "could not build" in first and "#error nope" in first
    assert second.startswith("False | None |") and "#error nope" in second and "remembered in" in second
    assert once >= 1 and calls(log) == once
    run_isolated(LOAD, TOKENSWIFT_ISA="native", **env)  # other variants: built (and refused) on their own
    assert calls(log) > once


@pytest.mark.skipif(not {"avx2", "fma"} <= build.cpu_flags(), reason="the kernels need an x86-64 CPU with AVX2 and FMA")
@pytest.mark.parametrize("body", ["kill -9 $$", "echo 'cc1: fatal error: error writing to /tmp/x.s: No space left on "
                                  "device' >&2\nexit 1", "echo 'cc: fatal error: Killed signal terminated program cc1' "
                                  ">&2\nexit 1"], ids=["signal", "disk-full", "killed"])
def test_a_transient_build_failure_is_not_remembered(tmp_path, body):
    """A failure that says nothing about the compiler (killed, a full disk) is not cached: the next process builds."""
    compiler, log = fake_compiler(tmp_path, body)
    env = dict(CC=str(compiler), TOKENSWIFT_CACHE=str(tmp_path / "cache"), TOKENSWIFT_NATIVE="1", TOKENSWIFT_ISA="avx2")
    assert run_isolated(LOAD, **env).startswith("False | None |")
    once = calls(log)
    assert run_isolated(LOAD, **env).startswith("False | None |") and calls(log) > once
    assert not list((tmp_path / "cache").rglob("*.failed"))


@pytest.mark.skipif(not {"avx2", "fma"} <= build.cpu_flags(), reason="the kernels need an x86-64 CPU with AVX2 and FMA")
def test_a_better_variant_that_does_not_build_leaves_the_next_one(tmp_path):
    """Where the best variant this CPU runs does not build (a compiler without -mamx-tile, say), the next one
    loads, in this process and, without a second try at the refused one, in the next."""
    best = next(v for v in build.VARIANTS.values() if v.cpu <= build.cpu_flags())
    if best.name == "avx2":
        pytest.skip("this CPU's best variant is the last one")
    refused = best.flags[-1]
    compiler, log = fake_compiler(tmp_path, f"case \"$*\" in *{refused}*) echo \"cc1: error: unrecognized command-line "
                                            f"option '{refused}'\" >&2; exit 1;; esac\nexec gcc \"$@\"")
    env = dict(CC=str(compiler), TOKENSWIFT_CACHE=str(tmp_path / "cache"), TOKENSWIFT_NATIVE="1", TOKENSWIFT_ISA="")
    first = run_isolated(LOAD + "; print(panels.describe())", **env)
    once = calls(log)
    second = run_isolated(LOAD + "; print(panels.describe())", **env)
    assert first.startswith("True |") and f"| {best.name} |" not in first and "unrecognized" in first
    assert second.startswith("True |") and "remembered in" in second and calls(log) == once


def test_an_unknown_kernel_variant_is_refused():
    done = subprocess.run([sys.executable, "-c", "from tokenswift.native import panels; panels.available()"],
                          cwd=ROOT, env={**os.environ, "TOKENSWIFT_ISA": "avx9"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "TOKENSWIFT_ISA='avx9': expected one of native, amx, avx512bf16, avx512, avx2" in done.stderr


@needs_panels
def test_every_struct_crossing_into_c_has_the_size_c_gives_it():
    lib = build.library()
    assert abi.mismatch(lib) == ""
    for name, struct in abi.STRUCTS.items():
        size_of = lib[f"sizeof_{name}"]
        size_of.restype = ctypes.c_size_t
        assert size_of() == ctypes.sizeof(struct) > 0


@needs_stack
def test_the_kernels_refuse_sizes_and_slots_out_of_range():
    """Bounds are checked in C, not only by the Python wrappers: a head size past rotate's buffer, a slot past
    the cache, more new tokens than attention's path buffer holds, a tree whose parents do not precede their
    children, a scratch too small are refused before any write."""
    import numpy as np

    lib = layers._library()
    cache = KVCache([torch.device("cpu")] * 2, 8, 1, 64, torch.float32)
    k_ptrs, v_ptrs = layers.cache_pointers(cache)
    src = (ctypes.c_long * 2)(6, 9)  # slot 9 is past the 8 slots
    assert lib.move_slots(k_ptrs, v_ptrs, 2, 1, 8 * 64, 64, src, 2, 5) == -1
    x = torch.randn(2, 40)
    assert lib.rms_norm_rows(x.data_ptr(), x.data_ptr(), x.data_ptr(), 2, 40, 1e-6) == -1  # not a multiple of 16
    h = torch.zeros(1, 256)
    weights = (abi.LayerWeights * 1)()
    scratch = torch.empty(1 << 20)
    for d, start in ((256, 0), (64, 8)):  # a head size past 128; a new token past the cache's last slot
        code = lib.layer_rows(h.data_ptr(), 1, 1, weights, h.data_ptr(), h.data_ptr(), k_ptrs, v_ptrs, 8 * 64, start,
                              None, 256, 1, 1, d, 256, 1e-6, 1.0, scratch.data_ptr(), scratch.numel(), None)
        assert code == -1, (d, start)
    assert torch.equal(h, torch.zeros(1, 256))
    attend = rows_attention._function()  # more new tokens than a row's path buffer holds
    q, kv, out = torch.randn(1, 49, 64), torch.randn(1, 60, 64), torch.zeros(1, 49, 64)
    scores = torch.empty(49 * 64)
    assert attend(q.data_ptr(), kv.data_ptr(), kv.data_ptr(), 60 * 64, out.data_ptr(), 1, 49, 49, 60, 64, 0.125, None,
                  scores.data_ptr(), scores.numel()) == -1
    assert torch.equal(out, torch.zeros(1, 49, 64))
    vocab = 100
    logits = torch.randn(3, vocab)
    history = torch.zeros(4, dtype=torch.int64)
    bad_tree = np.array([[1, 2, 3], [-1, 2, 0]], dtype=np.int64)  # node 1's parent comes after it
    assert decide.walk_tree(logits, history.data_ptr(), 4, 4, bad_tree, decide.Rule(), 0, False) is None
    good_tree = np.array([[1, 2, 3], [-1, 0, 0]], dtype=np.int64)
    assert decide.walk_tree(logits, history.data_ptr(), 4, 4, good_tree, decide.Rule(), 0, False) is not None
    fn = decide._function()  # the published, checked function
    tokens = np.empty(3, dtype=np.int64)
    small = np.empty(16, dtype=np.uint8)
    assert fn(logits.data_ptr(), 3, vocab, history.data_ptr(), 4, 4, None, None, 1.0, 1, 1.0, 0.0, None,
              tokens.ctypes.data, None, small.ctypes.data, small.nbytes) == -2


@needs_panels
def test_the_kernel_variant_is_described_in_one_line():
    line = panels.describe()
    assert "\n" not in line and line.startswith(f"native kernels: {panels.isa()} build (")
    assert ("AMX on" in line) == panels.amx_available() and ("bf16 panels on" in line) == panels.bf16_available()


# Variants of the kernels this CPU can run besides its native build: each reruns this file in a fresh process,
# where the forced variant's libraries are built (cached apart from the native ones) and self-checked.
VARIANT_ENV = "TOKENSWIFT_TEST_VARIANT"  # set in those processes: they do not start variants again
FORCED_VARIANTS = {"avx2": {"TOKENSWIFT_ISA": "avx2"}, "avx512": {"TOKENSWIFT_ISA": "avx512"},
                   "avx512bf16": {"TOKENSWIFT_ISA": "avx512bf16"}}


def variant_unavailable(name: str) -> str:
    """Why this host does not run the forced variant `name` ('' where it does)."""
    flags = build.cpu_flags()
    if os.environ.get(VARIANT_ENV):
        return f"this process runs the forced {os.environ[VARIANT_ENV]} variant"
    if os.environ.get(build.DISABLE_ENV, "1") == "0":
        return f"native kernels off ({build.DISABLE_ENV}=0)"
    loaded = build.loaded_variant()
    if name == "avx2":
        if not build.VARIANTS["avx2"].cpu <= flags:
            return "this CPU has no AVX2 with FMA"
        if loaded is None or loaded.name == "avx2":
            return "this run's kernels are the AVX2 build already (or none)"
    if name == "avx512":
        if not build.VARIANTS["avx512"].cpu <= flags:
            return "this CPU has no AVX-512"
        if loaded is None or loaded.name == "avx512":
            return "this run's kernels are the AVX-512 build already (or none)"
    if name == "avx512bf16":
        if not build.VARIANTS["avx512bf16"].cpu <= flags:
            return "this CPU has no AVX-512 BF16"
        if loaded is None or loaded.name == "avx512bf16":
            return "this run's kernels are the AVX-512 BF16 build already (or none)"
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORCED_VARIANTS))
def test_the_kernel_tests_pass_for_each_variant_this_cpu_runs(name):
    """Every variant this CPU runs besides its native one passes this file's tests too, without skipping the
    bfloat16 panels: on an AVX-512 CPU the AVX2 kernels (TOKENSWIFT_ISA=avx2), and the AVX-512 builds with and
    without AVX-512 BF16 where the CPU has it (an AMD EPYC Zen 4 tests all three)."""
    reason = variant_unavailable(name)
    if reason:
        pytest.skip(reason)
    env = {**os.environ, **FORCED_VARIANTS[name], VARIANT_ENV: name}
    done = subprocess.run([sys.executable, "-m", "pytest", str(Path(__file__)), "-x", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    kernels = ("bfloat16 panel", "native panel kernel", "Q4_1 block kernel")
    assert not any(kernel in line for line in skipped for kernel in kernels), skipped


@needs_attention
@pytest.mark.parametrize("tree", ["1x3x3x3", "auto"])
def test_sampled_tokenswift_reproduces_ar_samples_through_the_native_kernels(tree):
    """One uniform per produced token in AR's order: with the same seed TokenSwift draws AR's tokens, here with
    AR's single rows through the native kernels and a 40-node tree's verification through PyTorch's attention."""
    model = head_dim_64_model("llama-gqa")
    gen = ts.Generator(model, heads=random_heads(model))
    prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(6)).tolist()
    settings = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)
    ar = gen.generate(prompt, ts.Settings(**settings), 300, method="ar", seed=9).token_ids
    result = gen.generate(prompt, ts.Settings(tree=tree, **settings), 300, seed=9)
    assert result.token_ids == ar


DECIDE_SETTINGS = [
    ts.Settings(),  # greedy
    ts.Settings(penalty=1.2, penalty_window=24),  # greedy + penalty, windows that drop old tokens
    ts.Settings(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024),  # the paper's sampling
    ts.Settings(temperature=0.7, penalty=1.5, penalty_window=40),  # no cut
    ts.Settings(temperature=1.3, min_p=0.3),
]


@needs_decide
@pytest.mark.parametrize("settings", DECIDE_SETTINGS, ids=["greedy", "greedy-penalty", "paper", "t0.7", "t1.3-minp"])
def test_native_decision_matches_the_pytorch_chain(settings):
    """Same tokens as `sampling.decide_rows` over `seen_rows` windows (drafted ancestors included, old tokens
    dropping out of short windows), and the same distributions to float32 rounding. A sample whose uniform
    lies within 1e-6 of a CDF step may round either way; none is expected among these draws."""
    gen = torch.Generator().manual_seed(11)
    vocab, n = 1000, 60
    history = torch.randint(0, vocab, (n + 10,), generator=gen)
    extras = [[], [3], [3, 999], history[:5].tolist(), [7] * 30]
    mismatched = 0
    for trial in range(40):
        logits = torch.randn(len(extras), vocab, generator=gen) * 4
        u = torch.rand(len(extras), generator=gen, dtype=torch.float64)
        got = decide.decide_rows(logits, history, n, settings.penalty_window, extras, decide.rule_of(settings), u,
                                 want_probs=True)
        seen = seen_rows(history, n, settings.penalty_window, extras, vocab) if settings.penalty != 1.0 else None
        tokens, probs = decide_rows(logits, seen, settings, u, want_probs=True)
        assert got is not None
        assert torch.allclose(got[1], probs, rtol=1e-4, atol=1e-6)
        mismatched += sum(a != b for a, b in zip(got[0], tokens))
    assert mismatched == 0


@needs_decide
def test_a_decision_does_not_depend_on_the_rows_decided_with_it():
    """AR decides one row, verification many: every row gets bitwise the same token and distribution."""
    gen = torch.Generator().manual_seed(12)
    vocab = 8192
    history = torch.randint(0, vocab, (300,), generator=gen)
    extras = [[], [5], [5, 6], [9]]
    logits = torch.randn(4, vocab, generator=gen) * 3
    u = torch.rand(4, generator=gen, dtype=torch.float64)
    for settings in DECIDE_SETTINGS:
        chain = decide.rule_of(settings)
        together = decide.decide_rows(logits, history, 250, settings.penalty_window, extras, chain, u, True)
        for r in range(4):
            alone = decide.decide_rows(logits[r : r + 1], history, 250, settings.penalty_window, [extras[r]], chain,
                                       u[r : r + 1], True)
            assert alone[0][0] == together[0][r] and torch.equal(alone[1][0], together[1][r])


@needs_decide
def test_sampled_tokens_follow_the_target_distribution():
    """Many uniforms through the kernel: the empirical frequencies match the distribution it reports (a
    chi-square bound far above its expectation, far below what one misplaced token would give)."""
    gen = torch.Generator().manual_seed(13)
    logits = torch.randn(1, 50, generator=gen) * 2
    settings = ts.Settings(temperature=1.0, min_p=0.05)
    history = torch.zeros(1, dtype=torch.int64)
    counts = torch.zeros(50)
    draws = 20000
    u_all = torch.rand(draws, generator=gen, dtype=torch.float64)
    probs = None
    for i in range(draws):
        tokens, probs = decide.decide_rows(logits, history, 1, 1, [[]], decide.rule_of(settings), u_all[i : i + 1], True)
        counts[tokens[0]] += 1
    expected = probs[0].double() * draws
    kept = expected > 0
    assert counts[~kept].sum() == 0  # tokens cut by min-p are never drawn
    chi2 = float((((counts.double() - expected) ** 2)[kept] / expected[kept]).sum())
    assert chi2 < 3 * int(kept.sum()), chi2


@needs_decide
@pytest.mark.parametrize("settings", DECIDE_SETTINGS, ids=["greedy", "greedy-penalty", "paper", "t0.7", "t1.3-minp"])
def test_native_walk_matches_the_exact_walk_over_decided_rows(settings):
    """`decide.walk_tree` (one native call, deciding only the rows it visits) against `acceptance.exact_walk` over
    every row decided by the checked kernel: the same accepted path and bonus, the same token and bitwise the same
    distribution at every visited node. The drafts mostly hold each row's likeliest token, so walks go deep."""
    import numpy as np

    from tokenswift.acceptance import exact_walk

    gen = torch.Generator().manual_seed(21)
    vocab, n = 500, 80
    history = torch.randint(0, vocab, (n + 20,), generator=gen)
    depths = []
    for trial in range(30):
        logits, tree = random_draft(torch.randn(24, vocab, generator=gen) * 5, int(history[n - 1]), 4, gen)
        u = torch.rand(len(tree), generator=gen, dtype=torch.float64)
        table = np.array([tree.tokens, tree.parents], dtype=np.int64)
        chain = decide.rule_of(settings)
        got = decide.walk_tree(logits, history.data_ptr(), n, settings.penalty_window, table, chain, u.data_ptr(), True)
        assert got is not None
        picks, probs = decide.decide_rows(logits, history, n, settings.penalty_window, tree.ancestor_tokens(),
                                          chain, u[torch.tensor(tree.depths)], want_probs=True)
        path, bonus = exact_walk(tree, picks.__getitem__)
        assert (got[0], got[1]) == (path, bonus)
        for node in [0] + path:
            assert int(got[2][node]) == picks[node]
            assert torch.equal(torch.from_numpy(got[3][node].copy()), probs[node])
        depths.append(len(path))
    assert max(depths) >= 3 and len(set(depths)) >= 3, depths  # walks of several lengths, some deep


def random_draft(logits: torch.Tensor, root: int, follow_every: int, gen: torch.Generator):
    """A random draft trie for checking walks: node i (1 <= i < rows of logits) hangs below a random earlier node and
    holds that node's likeliest token, except every `follow_every`-th, which holds a random one (merged where equal),
    so that decisions often follow it and walks go deep. Returns (the logits of its nodes, contiguous; the trie)."""
    from tokenswift.kinds import Source
    from tokenswift.tree import DraftTree

    tree = DraftTree.with_root(root)
    top = logits.argmax(-1).tolist()
    for i in range(1, logits.shape[0]):
        parent = int(torch.randint(0, len(tree), (1,), generator=gen))
        token = top[parent] if i % follow_every else int(torch.randint(0, logits.shape[1], (1,), generator=gen))
        if token not in tree.children[parent]:
            tree.add_node(parent, token, Source.NGRAM, 1.0)
    return logits[: len(tree)].contiguous(), tree


def test_native_decision_declines_settings_it_does_not_implement():
    logits = torch.randn(1, 64)
    history = torch.zeros(4, dtype=torch.int64)
    u = torch.rand(1, dtype=torch.float64)
    for settings in (ts.Settings(temperature=1.0, top_k=5), ts.Settings(temperature=1.0, top_p=0.9),
                     ts.Settings(temperature=1.0, eta=0.001)):
        assert decide.rule_of(settings) is None
        assert decide.decide_rows(logits, history, 4, 4, [[]], decide.rule_of(settings), u, True) is None
    assert decide.decide_rows(logits.double(), history, 4, 4, [[]], decide.Rule(), None, False) is None


def test_heads_draft_over_the_first_token_ids_on_a_cpu():
    """The default model's heads rank only the drafting vocabulary (its first 1,024 ids) under tree="auto":
    the same logits as the full LM head's first columns."""
    gen = ts.Generator.from_pretrained(ROOT / "assets" / "default-model")
    lean = gen.adapter.lean
    assert lean.draft_vocab == 1024 < gen.adapter.vocab_size
    hidden = torch.randn(2, gen.adapter.hidden_size)
    full = gen.run_heads(hidden, 3)
    draft = gen.run_heads(hidden, 3, draft_vocab=True)
    assert draft.shape == (3, 2, 1024)
    assert torch.allclose(draft, full[..., :1024], rtol=1e-5, atol=1e-4)


@needs_stack
def test_native_heads_propose_what_the_pytorch_heads_propose():
    """Under tree="auto" the heads' drafts (each head's top ids over the drafting vocabulary, with their softmax
    probabilities) come from one native call (NativeHeads, `heads_top` in layer_rows.c): the same ids as the lean
    PyTorch heads' softmax and top-k, and the same probabilities to float32 rounding, for 1-3 heads and 1-5 ids."""
    gen = ts.Generator.from_pretrained(ROOT / "assets" / "default-model")
    native = gen._native_heads
    assert native is not None and native.vocab == gen.adapter.lean.draft_vocab
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        hidden = torch.randn(1, gen.adapter.hidden_size, generator=g) * (1 + trial)
        for levels, k in ((1, 1), (3, 3), (2, 5)):
            ids, probs = native.top(hidden, levels, k)
            logits = gen.run_heads(hidden, levels, draft_vocab=True)[:, 0].float()
            want = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
            assert ids == want.indices.tolist(), (trial, levels, k)
            assert torch.allclose(torch.tensor(probs), want.values, rtol=1e-4, atol=1e-6)
    assert native.top(hidden, 4, 3) is None and native.top(hidden, 1, 17) is None  # more heads or ids than it serves
    assert native.top(hidden.double(), 1, 3) is None


def test_head_drafts_fall_back_to_pytorch_without_the_native_heads():
    gen = ts.Generator.from_pretrained(ROOT / "assets" / "default-model")
    hidden = torch.randn(1, gen.adapter.hidden_size)
    with_native = gen.head_drafts(hidden, 3, 3)
    gen._native_heads = None
    assert gen.head_drafts(hidden, 3, 3)[0] == with_native[0]
