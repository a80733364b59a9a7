"""Pure pieces: tree specs and trie, n-gram table, sampling chain, acceptance walks, settings, partial cache."""
import pytest
import torch

import tokenswift as ts
from tokenswift.acceptance import exact_walk, per_row_walk
from tokenswift.events import position_runs
from tokenswift.kv_cache import KVCache
from tokenswift.ngram import NGramTable
from tokenswift.partial_cache import PartialKVCache, select_positions
from tokenswift.sampling import apply_penalty, sample_from, target_distribution, truncation_mask
from tokenswift.tree import DraftTree, ancestor_mask, build_head_paths, parse_tree, tree_widths


# ---- tree -------------------------------------------------------------------------------------------
def test_paper_tree_has_40_nodes_and_widths():
    paths = parse_tree("1x3x3x3")
    assert len(paths) == 40 and parse_tree("paper") == paths
    assert tree_widths(paths) == [1, 3, 3, 3]
    assert parse_tree("none") == []


@pytest.mark.parametrize("bad", ["1x0", "abc", "1x3x", "1x100"])
def test_bad_tree_specs_are_rejected(bad):
    with pytest.raises(ValueError, match="tree"):
        parse_tree(bad)


def test_trie_shares_prefixes_and_mask_follows_ancestors():
    tree = DraftTree.with_root(9)
    tree.add_path([1, 2, 3], "head")
    tree.add_path([1, 2, 4], "ngram")
    tree.add_path([5], "head")
    assert tree.tokens == [9, 1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 1, 2, 2, 0]
    assert tree.sources[4] == "ngram" and tree.sources[2] == "head"
    mask = ancestor_mask(tree.parents)
    assert mask[4].tolist() == [True, True, True, False, True, False]
    assert mask[5].tolist() == [True, False, False, False, False, True]
    assert tree.leaves() == [3, 4, 5]


def test_head_paths_map_ranks_to_tokens():
    cands = [[7], [3, 4], [5, 6]]
    probs = [[0.9], [0.5, 0.3], [0.6, 0.2]]
    out = build_head_paths(cands, probs, parse_tree("1x2x2"))
    assert ([7, 4, 5], [0.9, 0.3, 0.6]) in out and len(out) == 7


# ---- n-grams ----------------------------------------------------------------------------------------
def test_ngram_counts_incrementally_and_ranks_by_frequency_then_recency():
    table = NGramTable(4)
    table.extend([1, 2, 3, 4, 1, 2, 3])
    table.extend([5, 1, 2, 3, 4])
    top = table.top(1, 5)
    assert top[0] == ((2, 3, 4), 2)
    assert {c for c, _ in top} == {(2, 3, 4), (2, 3, 5)}
    assert table.top(42, 3) == []


# ---- sampling -----------------------------------------------------------------------------------------
def test_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([2.0, -2.0, 1.0])
    out = apply_penalty(logits, torch.tensor([0, 1, 1]), 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_truncation_chain():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    base = ts.Settings(temperature=1.0)
    assert truncation_mask(probs, base.with_changes(top_k=2)).tolist() == [False, False, True, True]
    assert truncation_mask(probs, base.with_changes(top_p=0.7)).tolist() == [False, False, True, True]
    assert truncation_mask(probs, base.with_changes(min_p=0.35)).tolist() == [False, False, True, True]
    assert truncation_mask(probs, base.with_changes(top_p=0.01)).tolist() == [False, True, True, True]


def test_greedy_distribution_is_one_hot_and_sampling_hits_only_kept_tokens():
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0])
    greedy = target_distribution(logits, torch.tensor([], dtype=torch.long), ts.Settings())
    assert greedy.tolist() == [0.0, 1.0, 0.0, 0.0]
    probs = target_distribution(logits, torch.tensor([], dtype=torch.long), ts.Settings(temperature=1.0, top_k=2))
    assert probs[0] == 0 and probs[3] == 0 and abs(float(probs.sum()) - 1) < 1e-6
    for u in torch.linspace(0, 0.999999, 50).tolist():
        assert sample_from(probs, u) in (1, 2)


# ---- acceptance -----------------------------------------------------------------------------------------
def small_tree():
    tree = DraftTree.with_root(0)
    tree.add_path([1, 2], "head")
    tree.add_path([1, 3], "head")
    tree.add_path([4], "ngram")
    return tree


def test_exact_walk_follows_samples_and_returns_bonus():
    tree = small_tree()
    answers = {0: 1, 1: 3, 3: 9}
    path, bonus = exact_walk(tree, lambda node: answers[node])
    assert [tree.tokens[n] for n in path] == [1, 3] and bonus == 9
    path, bonus = exact_walk(tree, lambda node: 7)
    assert path == [] and bonus == 7


def test_per_row_walk_resamples_shared_prefixes():
    tree = small_tree()
    calls = []

    def pick(node):
        calls.append(node)
        return 1 if node == 0 else 5

    per_row_walk(tree, pick)
    assert calls.count(0) == len(tree.leaves())  # the root is sampled once per row: the source of the bias


# ---- settings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,message", [
    ("temperature", -1.0, "temperature"), ("top_p", 0.0, "top_p"), ("min_p", 1.0, "min_p"),
    ("penalty", 0.5, "penalty"), ("kv_mode", "sometimes", "kv_mode"), ("tree", "3x", "tree"),
    ("kv_budget", 10, "kv_budget"), ("acceptance", "fast", "acceptance"),
])
def test_invalid_settings_raise_value_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        ts.Settings(**{field: value})


def test_settings_round_trip_and_unknown_keys():
    s = ts.Settings(temperature=0.7, tree="small")
    assert ts.Settings.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown setting"):
        ts.Settings.from_dict({"temprature": 1.0})


# ---- partial cache -------------------------------------------------------------------------------------------
def test_select_positions_keeps_sink_and_top_scores():
    keys = torch.zeros(1, 10, 2)
    keys[0, 7] = torch.tensor([5.0, 0.0])
    keys[0, 4] = torch.tensor([3.0, 0.0])
    query = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # 2 query heads in one GQA group
    assert select_positions(query, keys, sink=2, keep=2).tolist() == [[0, 1, 4, 7]]


def make_full(n, hkv=2, d=4, layers=2):
    full = KVCache([torch.device("cpu")] * layers, 128, hkv, d, torch.float32)
    for layer in range(layers):
        full.write(layer, 0, torch.randn(hkv, n, d), torch.randn(hkv, n, d))
    full.length = n
    return full


def test_dynamic_partial_cache_refreshes_when_tail_is_full():
    full = make_full(40)
    queries = [torch.randn(4, 4) for _ in range(2)]
    p = PartialKVCache(full, budget=20, sink=4, recent=6, mode="dynamic")
    p.refresh(full, queries)
    st = p.state()
    assert (st.sink, st.selected, st.recent, p.count) == (4, 10, 0, 14)
    assert p.held_positions()[:4] == [0, 1, 2, 3]
    for layer in range(2):
        write = torch.randn(2, 6, 4)
        full.write(layer, 40, write, write)
    full.length = 46
    p.append(full, list(range(40, 46)), queries)
    assert not p.state().refreshed and p.state().recent == 6 and p.count == 20
    assert torch.equal(p.k[0][:, 14:20], full.k[0][:, 40:46])
    full.length = 47
    p.append(full, [46], queries)
    assert p.state().refreshed and p.state().recent == 0 and p.refreshes == 2


def test_once_partial_cache_rolls_the_tail():
    full = make_full(60)
    full.length = 30
    queries = [torch.randn(4, 4) for _ in range(2)]
    p = PartialKVCache(full, budget=20, sink=4, recent=6, mode="once")
    p.refresh(full, queries)
    full.length = 40
    p.append(full, list(range(30, 40)), queries)  # 10 slots into a tail of room 6: the oldest 4 are evicted
    held = p.held_positions()
    assert p.count == 20 and p.refreshes == 1
    assert [x for x in held if x >= 30] == list(range(34, 40))


def test_position_runs():
    assert position_runs([0, 1, 2, 5, 7, 8]) == [(0, 3), (5, 6), (7, 9)]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Softmax attention in float64: q (Hq, T, d) over k, v (Hkv, S, d), the T new tokens last under `block`."""
    t, s, g, d = q.shape[1], k.shape[1], q.shape[0] // k.shape[0], q.shape[2]
    allowed = torch.ones(t, s, dtype=torch.bool)
    allowed[:, s - t:] = block
    kk = k.double().repeat_interleave(g, dim=0)
    scores = (q.double() @ kk.transpose(1, 2)) * d ** -0.5
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v.double().repeat_interleave(g, dim=0)


@pytest.mark.parametrize("s,t,g", [(40, 1, 3), (600, 8, 3), (700, 1, 4), (5000, 6, 3), (5000, 1, 3), (9000, 40, 2),
                                   (9000, 2, 3), (300, 300, 2)])
def test_attention_paths_match_a_float64_reference(s, t, g):
    """Every CPU path of `attend` (plain, key-chunked, split prefix + block) against naive softmax attention."""
    from tokenswift.attention import attend

    torch.manual_seed(s + t)
    hkv, d = 2, 16
    q, k, v = torch.randn(hkv * g, t, d), torch.randn(hkv, s, d), torch.randn(hkv, s, d)
    block = (torch.rand(t, t) < 0.4).tril() | torch.eye(t, dtype=torch.bool)  # a tree-like mask
    out = attend(q, k, v, d ** -0.5, block)
    assert (out.double() - naive_attention(q, k, v, block)).abs().max().item() < 1e-5


@pytest.mark.parametrize("s,t,g", [(100, 100, 3), (700, 128, 3), (5000, 64, 2), (200, 64, 1), (63, 63, 3)])
def test_causal_blocks_match_a_float64_reference(s, t, g, monkeypatch):
    """A prefill chunk's causal block (with and without a prefix, grouped or not) against naive softmax attention;
    from CAUSAL_FLASH_MIN_TOKENS new tokens it takes the flash kernel's causal form, below them the other paths."""
    from tokenswift import attention

    calls = []
    causal = attention._attend_causal
    monkeypatch.setattr(attention, "_attend_causal", lambda *a: calls.append(a[-2]) or causal(*a))
    torch.manual_seed(s + t)
    hkv, d = 2, 16
    # q as the callers pass it: a transposed view of the projections, (Hq, T, d) over (T, Hq + Hkv, d)
    q = torch.randn(t, hkv * g + hkv, d)[:, : hkv * g].transpose(0, 1)
    k, v = torch.randn(hkv, s, d), torch.randn(hkv, s, d)
    block = torch.ones(t, t, dtype=torch.bool).tril()
    out = attention.attend(q, k, v, d ** -0.5, block)
    assert (out.double() - naive_attention(q, k, v, block)).abs().max().item() < 1e-5
    low = attention.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), d ** -0.5, block)  # a half-precision cache
    assert low.dtype == torch.bfloat16 and (low.double() - naive_attention(q, k, v, block)).abs().max().item() < 0.05
    flash = attention._cpu_flash is not None and t >= attention.CAUSAL_FLASH_MIN_TOKENS
    assert calls == ([t, t] if flash else [])


def test_best_occurrence_bound_follows_the_longest_known_continuation():
    """suffix-bound's bound for drafting from the text: at each position, the longest run that an earlier
    occurrence of the last token continues with, from known text only (a continuation reaching the end of the
    known text repeats its period); replayed as iterations that accept that run plus one token."""
    from tokenswift.bench.drafts import best_matches, replay, row_cost_curve

    # prompt "1 2 3 9 1 2 4"; the output continues "1 2 4 1 2 4"
    prompt, out = [1, 2, 3, 9, 1, 2, 4], [1, 2, 4, 1, 2, 4]
    matches = best_matches(prompt, out, cap=8)
    # at out[0] (last known 4): 4 was followed by nothing known before -> 0; at out[1] (last 1): the 1 at
    # index 4 continues "2 4" then its period "1 2 4": the whole rest (5 tokens)
    assert matches[0] == 0 and matches[1] == 5
    assert best_matches(prompt, out, cap=2)[1] == 2
    assert all(m <= len(out) - i for i, m in enumerate(matches))  # never past the end of the text
    per_iteration, per_step = replay(matches, lambda q: 1.0)  # rows free: tokens per step = per iteration
    assert per_iteration == per_step == 3.0  # iterations: out[0] alone, then out[1] plus the 5 drafted tokens
    cost = row_cost_curve("1:1,3:1.2,5:2")
    assert cost(1) == 1 and cost(2) == pytest.approx(1.1) and cost(4) == pytest.approx(1.6)
    assert cost(7) == pytest.approx(2.8)  # extrapolated from the last two points
    assert replay(matches, cost)[1] == pytest.approx(6 / (1 + cost(6)))
