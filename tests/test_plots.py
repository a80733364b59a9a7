"""The live plot builders and the repetition metrics, on synthetic Step events (no model needed)."""
from __future__ import annotations

import random
import time

import plotly.graph_objects as go
import pytest

from tokenswift.events import AcceptedToken, CacheState, Step, Timings, TreeNode, position_runs
from ui.plots import (REPEAT_MIN_TOKENS, SOURCE_COLORS, accepted_figure, bonus_token, chunk_bounds,
                      chunk_overlap_matrix, chunk_size_for, repeated_fraction, color_for, distinct_all,
                      distinct_n, draft_tree_figure, held_strip, kv_figure, repeated_spans, repetition_figure,
                      running_mean, token_label)
from tokenswift.serve.trace import MethodTrace, RunTrace

BYTES_PER_POSITION = 4096
SIZE_LIMIT = 60_000  # bytes of figure JSON


def decode(token: int) -> str:
    return {101: " the", 102: "\n", 104: "cat", 200: " sat"}.get(token, f"t{token}")


def small_tree() -> tuple[list[TreeNode], list[int]]:
    """12 nodes: heads at depths 1-4, two n-gram branches; the path 0-1-2-4 is accepted, bonus 200."""
    spec = [  # token, parent, depth, source, accepted
        (100, -1, 0, "root", True),
        (101, 0, 1, "head", True),
        (102, 1, 2, "head", True),
        (103, 1, 2, "head", False),
        (104, 2, 3, "head", True),
        (105, 2, 3, "head", False),
        (106, 4, 4, "head", False),
        (107, 1, 2, "ngram", False),
        (108, 7, 3, "ngram", False),
        (109, 8, 4, "ngram", False),
        (110, 0, 1, "ngram", False),
        (111, 10, 2, "ngram", False),
    ]
    drew = {0: 101, 1: 102, 2: 104, 4: 200}  # the target's sample at each visited node (4: the bonus)
    nodes = [TreeNode(tok, parent, depth, source, 0.5, accepted,
                      target_prob=0.4 if parent >= 0 else None, target_sample=drew.get(i))
             for i, (tok, parent, depth, source, accepted) in enumerate(spec)]
    return nodes, [101, 102, 104, 200]


def big_tree(rng: random.Random, size: int = 120) -> list[TreeNode]:
    """A random tree of `size` nodes up to depth 4, with an accepted path of length 3."""
    nodes = [TreeNode(1, -1, 0, "root", 1.0, True)]
    while len(nodes) < size:
        parent = rng.randrange(len(nodes))
        if nodes[parent].depth == 4:
            continue
        nodes.append(TreeNode(rng.randrange(5000), parent, nodes[parent].depth + 1,
                              rng.choice(["head", "ngram"]), rng.random(), False, rng.random(), rng.randrange(5000)))
    node = 0
    for _ in range(3):
        kids = [i for i, n in enumerate(nodes) if n.parent == node]
        if not kids:
            break
        node = kids[0]
        nodes[node].accepted = True
    return nodes


def ar_steps(count: int, prompt: int = 500) -> list[Step]:
    return [Step(i, "ar", [AcceptedToken(i % 977, "ar")],
                 CacheState(prompt + i + 1, 65536, (prompt + i + 1) * BYTES_PER_POSITION, "none"),
                 Timings(), i + 1, 0.01 * (i + 1)) for i in range(count)]


def ts_steps(count: int, prompt: int = 500, budget: int = 256, sink: int = 16, seed: int = 0,
             with_trees: bool = True) -> list[Step]:
    """A dynamic partial cache: accepted tokens fill the tail; past the budget it is re-selected."""
    rng = random.Random(seed)
    steps: list[Step] = []
    generated, selected, recent, refreshes = 0, budget - sink - 64, 0, 0
    for i in range(count):
        n_drafted = rng.choice([0, 1, 1, 2, 2, 3, 3, 4])
        source = rng.choice(["head", "head", "ngram"])
        tokens = [AcceptedToken(rng.randrange(900), source, d + 1) for d in range(n_drafted)]
        tokens.append(AcceptedToken(rng.randrange(900), "bonus", n_drafted + 1))
        generated += len(tokens)
        length = prompt + generated
        recent += len(tokens)
        refreshed, held = False, None
        if sink + selected + recent > budget:
            refreshed, refreshes, recent = True, refreshes + 1, 0
            selected = budget - sink - 64
            held = position_runs(list(range(sink)) + sorted(rng.sample(range(sink, length), selected)))
        cache = CacheState(length, 65536, length * BYTES_PER_POSITION, "dynamic", budget, sink, selected, recent,
                           refreshed, refreshes, held)
        tree = []
        if with_trees:
            tree, _ = small_tree()
        steps.append(Step(i, "tokenswift", tokens, cache, Timings(), generated, 0.02 * (i + 1), tree=tree))
    return steps


def traced(steps: list[Step], method: str) -> MethodTrace:
    trace = MethodTrace(method)
    for step in steps:
        trace.add(step)
    return trace


def by_meta(fig: go.Figure, meta: str) -> list:
    return [t for t in fig.data if t.meta == meta]


def annotation_texts(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations]


# ---- style ------------------------------------------------------------------------------------------

def test_colors_one_per_source_and_depth():
    head_shades = [color_for("head", d) for d in (1, 2, 3, 4)]
    assert len(set(head_shades)) == 4
    assert color_for("head", 9) == color_for("head", 4) and color_for("head", 0) == color_for("head", 1)
    others = {color_for(s, 1) for s in ("ngram", "bonus", "ar", "root")}
    assert len(others) == 4 and not others & set(head_shades)
    assert color_for("something else", 1) == SOURCE_COLORS["rejected"]


# ---- draft tree -------------------------------------------------------------------------------------

def test_tree_figure_nodes_edges_bonus():
    nodes, accepted = small_tree()
    fig = draft_tree_figure(nodes, accepted, decode, iteration=12)
    node_traces = by_meta(fig, "nodes")
    assert sum(len(t.x) for t in node_traces) == len(nodes)
    # Every node sits at its depth.
    xs = sorted(x for t in node_traces for x in t.x)
    assert xs == sorted(float(n.depth) for n in nodes)
    (acc,) = by_meta(fig, "edges-accepted")
    assert len(acc.x) // 3 == len(accepted) - 1  # one segment per accepted drafted token
    (rej,) = by_meta(fig, "edges-rejected")
    assert len(rej.x) // 3 == len(nodes) - 1 - (len(accepted) - 1)
    (bonus,) = by_meta(fig, "bonus")
    assert bonus.marker.symbol == "star"
    assert bonus.text == ("␣sat",)
    assert bonus.x == (4.0,)  # one past the last accepted node (depth 3)
    (bonus_edge,) = by_meta(fig, "bonus-edge")
    assert bonus_edge.line.dash == "dash"
    assert fig.layout.title.text == "Draft tree, iteration 12: 12 nodes, 3 accepted + bonus"
    labels = [s for t in node_traces for s in t.text]
    assert "␣the" in labels and "⏎" in labels
    templates = " ".join(t.hovertemplate for t in node_traces)
    assert "accepted" in templates and "rejected" in templates and "%{customdata[2]}" in templates
    data = {row[0]: row for t in node_traces for row in t.customdata}
    assert data[102] == [102, 0.5, 0.4, "cat"] and data[100] == [100, 0.5, "–", "␣the"] and data[103][3] == "–"
    lone_root = draft_tree_figure([TreeNode(5, -1, 0, "root", 1.0, True)], [], lambda t: "<b>")
    assert by_meta(lone_root, "nodes")[0].text == ("&lt;b&gt;",)  # token text is not markup


def test_tree_layout_is_tidy():
    nodes, accepted = small_tree()
    fig = draft_tree_figure(nodes, accepted, decode)
    y_of = {}
    for t in by_meta(fig, "nodes") + by_meta(fig, "bonus"):
        for x, y, label in zip(t.x, t.y, t.text):
            y_of[label] = y
    ys = [y for t in by_meta(fig, "nodes") + by_meta(fig, "bonus") for y in t.y]
    children = {i: [j for j, n in enumerate(nodes) if n.parent == i] for i in range(len(nodes))}
    leaves = [i for i, kids in children.items() if not kids]
    all_points = [(x, y) for t in by_meta(fig, "nodes") + by_meta(fig, "bonus") for x, y in zip(t.x, t.y)]
    assert len(set(all_points)) == len(all_points)  # no two markers on top of each other
    assert len({y for y in ys}) >= len(leaves) + 1  # every leaf (and the bonus) has its own row
    root_y = next(t.y[0] for t in by_meta(fig, "nodes") if t.name == "root token")
    assert min(ys) < root_y < max(ys)


def test_token_label_escapes_and_truncates():
    assert token_label(" a b") == "␣a␣b"
    assert token_label("x\n\ty") == "x⏎⇥y"
    assert token_label("\x00") == "\\x00"
    assert token_label("abcdefghijklmnop") == "abcdefghi…"
    assert len(token_label("abcdefghijklmnop")) == 10
    assert token_label("") == "∅"


def test_bonus_is_the_target_sample_even_when_the_token_limit_cuts_the_step():
    nodes, _ = small_tree()
    assert bonus_token(nodes, [101, 102, 104, 200]) == (200, True)
    # max_new reached after two tokens: the last emitted token (102) is drafted; the bonus 200 was not emitted
    assert bonus_token(nodes, [101, 102]) == (200, False)
    fig = draft_tree_figure(nodes, [101, 102], decode, iteration=5)
    (bonus,) = by_meta(fig, "bonus")
    assert bonus.text == ("␣sat (not emitted)",) and bonus.marker.symbol == "star-open"
    assert "2 emitted, no bonus" in fig.layout.title.text


def test_tree_without_bonus_and_empty():
    root = TreeNode(5, -1, 0, "root", 1.0, True)
    assert bonus_token([root], []) == (None, False)
    fig = draft_tree_figure([root], [], decode)
    assert not by_meta(fig, "bonus")
    empty = draft_tree_figure([], [], decode, iteration=3)
    assert "No draft tree yet" in annotation_texts(empty)
    assert not empty.data


def test_big_tree_is_small_json():
    nodes = big_tree(random.Random(1), 120)
    fig = draft_tree_figure(nodes, [nodes[i].token for i, n in enumerate(nodes) if n.accepted and i] + [7],
                            lambda t: f" w{t}")
    assert sum(len(t.x) for t in by_meta(fig, "nodes")) == 120
    assert len(fig.to_json()) < 30_000


# ---- accepted tokens --------------------------------------------------------------------------------

def test_accepted_figure():
    steps = ts_steps(300, with_trees=False)
    trace = traced(steps, "tokenswift")
    fig = accepted_figure(trace)
    bars = by_meta(fig, "hist")
    assert sum(sum(b.y) for b in bars) == trace.iterations == 300
    assert {b.name for b in bars} <= {"mostly heads", "mostly reused text", "mostly bonus"}
    mean_line = next(t for t in fig.data if t.name == "running mean")
    assert mean_line.y[-1] == pytest.approx(trace.mean_accepted, abs=1e-3)
    assert "AR = 1 token/iteration" in annotation_texts(fig)
    assert f"mean {trace.mean_accepted:.2f}" in fig.layout.title.text
    assert f"bonus {trace.source_totals['bonus']:,}" in fig.layout.title.text


def test_running_mean():
    assert running_mean([1, 3, 2, 6]) == [1, 2, 2, 3]
    assert running_mean([]) == []


def test_accepted_figure_empty():
    fig = accepted_figure(MethodTrace("tokenswift"))
    assert "No iterations yet" in annotation_texts(fig)


# ---- KV cache ---------------------------------------------------------------------------------------

def test_kv_figure_partial_cache():
    steps = ts_steps(200, with_trees=False)
    trace = traced(steps, "tokenswift")
    assert trace.refresh_at
    fig = kv_figure(trace)
    for part in ("sink", "selected", "recent"):
        (area,) = by_meta(fig, f"partial-{part}")
        assert area.stackgroup == "partial"
    (budget,) = by_meta(fig, "budget")
    assert set(budget.y) == {256} and budget.line.dash == "dash"
    (ticks,) = by_meta(fig, "refresh")
    assert list(ticks.x) == trace.refresh_at
    (sink,) = by_meta(fig, "strip-sink")
    (recent,) = by_meta(fig, "strip-recent")
    assert sink.z[0][0] is not None  # the sink starts the cache
    if trace.partial_recent_now():
        assert recent.z[0][-1] is not None  # the recent tail ends it


def test_held_strip_fractions():
    trace = MethodTrace("tokenswift")
    trace.cache_length = 1000
    trace.partial_mode, trace.partial_budget = "dynamic", 200
    trace.held_runs = [(0, 16), (100, 150), (400, 410)]
    trace.partial_sink.append(0, 16)
    trace.partial_recent.append(0, 50)
    strip = held_strip(trace, bins=100)  # 10 positions per bin
    assert len(strip["edges"]) == 101 and strip["edges"][-1] == 1000
    assert strip["sink"][0] == 1.0 and strip["sink"][1] == pytest.approx(0.6) and sum(strip["sink"]) == 1.6
    assert strip["selected"][1] == 0.0 and strip["selected"][10:15] == [1.0] * 5 and strip["selected"][40] == 1.0
    assert sum(strip["selected"]) == 6.0
    assert strip["recent"][-5:] == [1.0] * 5 and sum(strip["recent"]) == 5.0


@pytest.mark.parametrize("mode,note", [("none", "no partial cache (AR)"), ("full", "drafting reads the full cache")])
def test_kv_figure_notes(mode, note):
    trace = traced(ar_steps(50), "ar")
    trace.partial_mode = mode
    fig = kv_figure(trace)
    assert note in annotation_texts(fig)
    assert not by_meta(fig, "strip-recent") and not by_meta(fig, "budget")
    assert len(fig.data) == 2  # cache length and MB


def test_kv_figure_empty():
    assert "No iterations yet" in annotation_texts(kv_figure(MethodTrace("ar")))


# ---- long runs stay small ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_run() -> RunTrace:
    run = RunTrace(prompt_ids=list(range(500)), settings={}, max_new_tokens=20_000)
    for step in ar_steps(20_000):
        run.add(step)
    for step in ts_steps(7_000, with_trees=False):
        run.add(step)
    return run


def test_long_run_figures_are_small(long_run):
    ts_trace = long_run.tokenswift
    for iteration, nodes, accepted in [(7000, *small_tree())]:
        ts_trace.trees.append((iteration, nodes, accepted))
    figures = {
        "accepted ar": lambda: accepted_figure(long_run.ar),
        "accepted ts": lambda: accepted_figure(ts_trace),
        "kv ar": lambda: kv_figure(long_run.ar),
        "kv ts": lambda: kv_figure(ts_trace),
        "tree": lambda: draft_tree_figure(ts_trace.trees[-1][1], ts_trace.trees[-1][2], decode, ts_trace.trees[-1][0]),
        "tree 120": lambda: draft_tree_figure(big_tree(random.Random(2)), [1, 2], str),
        "repetition": lambda: repetition_figure(long_run.ar.token_ids, ts_trace.token_ids),
    }
    sizes = {}
    for name, build in figures.items():
        start = time.perf_counter()
        fig = build()
        size = len(fig.to_json())
        sizes[name] = (size, time.perf_counter() - start)
        for t in fig.data:
            if isinstance(t, go.Scatter):
                assert len(t.x) <= 500, (name, t.name, len(t.x))
            if isinstance(t, go.Heatmap):
                assert len(t.z) <= 40 and all(len(row) <= 200 for row in t.z)
    for trace in (long_run.ar, ts_trace):
        bars = by_meta(accepted_figure(trace), "hist")
        assert sum(sum(b.y) for b in bars) == trace.iterations
    print("\nfigure JSON sizes (bytes, build+serialise s):",
          ", ".join(f"{k} {v[0]:,} ({v[1]:.2f}s)" for k, v in sizes.items()))
    for name, (size, _) in sizes.items():
        assert size < SIZE_LIMIT, (name, size)


# ---- repetition -------------------------------------------------------------------------------------

def test_distinct_n():
    assert distinct_n([1, 2, 1, 2], 1) == 0.5
    assert distinct_n([1, 2, 1, 2], 2) == pytest.approx(2 / 3)
    assert distinct_n([1, 2, 3, 4], 4) == 1.0
    assert distinct_n([], 1) == 0.0 and distinct_n([1, 2], 3) == 0.0
    assert distinct_all([7] * 10) == {1: 0.1, 2: 1 / 9, 3: 1 / 8, 4: 1 / 7}


def test_repeated_spans():
    a, b = list(range(10)), list(range(100, 105))
    assert repeated_spans(a + b + a, min_len=8) == [(15, 25)]
    assert repeated_spans(a + b + a, min_len=8, lookback=5) == []  # the earlier copy starts 15 tokens back
    assert repeated_spans(a + b + a, min_len=8, lookback=15) == [(15, 25)]
    assert repeated_spans(a + b + a, min_len=11) == []
    assert repeated_spans(list(range(40))) == []
    assert repeated_spans([1, 2, 3] * 10, min_len=3) == [(3, 30)]  # a loop repeats itself
    # b + a[:3] repeats positions 10-17 and runs on to a[3:7]; a then repeats positions 0-9.
    assert repeated_spans(a + b + a[:7] + b + a, min_len=8) == [(22, 37)]
    assert repeated_spans([]) == []


def test_repeated_spans_on_a_long_sequence():
    rng = random.Random(0)
    tokens = [rng.randrange(50_000) for _ in range(20_000)]
    tokens[15_000:15_500] = tokens[2_000:2_500]
    start = time.perf_counter()
    spans = repeated_spans(tokens)
    print(f"\nrepeated_spans on 20,000 tokens: {time.perf_counter() - start:.3f}s")
    assert spans == [(15_000, 15_500)]


def test_chunk_overlap_matrix():
    periodic = list(range(50)) * 20
    m = chunk_overlap_matrix(periodic, 100)
    assert len(m) == 10 and all(len(row) == 10 for row in m)
    assert all(v == 1.0 for row in m for v in row)
    rng = random.Random(0)
    noise = [rng.randrange(10_000) for _ in range(1000)]
    m = chunk_overlap_matrix(noise, 100)
    assert all(m[i][i] == 1.0 for i in range(10))
    assert max(m[i][j] for i in range(10) for j in range(10) if i != j) < 0.05
    half = list(range(100)) + list(range(1000, 1100)) + list(range(100))  # chunk 2 repeats chunk 0
    m = chunk_overlap_matrix(half, 100)
    assert m[2][0] == 1.0 and m[0][2] == 1.0 and m[1][0] == 0.0
    short = chunk_overlap_matrix([1, 2, 3, 4, 5, 6], 4)  # the last chunk has no 4-gram
    assert short == [[1.0, 0.0], [0.0, 0.0]]
    assert chunk_overlap_matrix([], 100) == []


def test_one_definition_of_a_repeated_span():
    """Panes and plot titles both call a copy of >= REPEAT_MIN_TOKENS tokens repeated, and nothing shorter."""
    a = list(range(REPEAT_MIN_TOKENS))
    assert repeated_spans(a + [999] + a) == [(REPEAT_MIN_TOKENS + 1, 2 * REPEAT_MIN_TOKENS + 1)]
    assert repeated_spans(a[:-1] + [999] + a[:-1]) == []
    assert repeated_fraction(a + [999] + a) == pytest.approx(REPEAT_MIN_TOKENS / (2 * REPEAT_MIN_TOKENS + 1))


@pytest.mark.parametrize("length,low,high", [(300, 8, 40), (500, 8, 40), (2_000, 8, 40), (20_000, 8, 40),
                                             (50_000, 8, 40)])
def test_chunk_size_adapts_to_the_run(length, low, high):
    size = chunk_size_for(length)
    assert low <= len(chunk_bounds(length, size)) <= high
    assert size >= 25 and str(size).rstrip("0") in {"1", "15", "2", "25", "3", "4", "5", "6", "8"}


def test_repetition_heatmap_at_500_tokens_has_at_least_8x8_chunks():
    rng = random.Random(0)
    fig = repetition_figure([rng.randrange(1000) for _ in range(500)], [rng.randrange(1000) for _ in range(480)])
    for heatmap in by_meta(fig, "overlap"):
        assert len(heatmap.z) >= 8 and all(len(row) >= 8 for row in heatmap.z)
    # both panels use the chunks of the longer run: 2,000 tokens -> chunks of 100, so 1,000 tokens give 10
    fig = repetition_figure([rng.randrange(1000) for _ in range(2000)], [rng.randrange(1000) for _ in range(1000)])
    assert [len(m.z) for m in by_meta(fig, "overlap")] == [20, 10]


def test_chunk_count_is_capped():
    bounds = chunk_bounds(10_000, 100, max_chunks=40)
    assert len(bounds) == 40 and bounds[0] == (0, 250) and bounds[-1] == (9750, 10_000)
    assert len(chunk_overlap_matrix(list(range(10_000)), 100)) == 40
    assert chunk_bounds(1000, 256) == [(0, 256), (256, 512), (512, 768), (768, 1000)]


def test_repetition_figure():
    rng = random.Random(0)
    loop = [rng.randrange(1000) for _ in range(300)] + list(range(40)) * 50
    fig = repetition_figure(loop, [rng.randrange(1000) for _ in range(2300)], chunk_size=100)
    maps = by_meta(fig, "overlap")
    assert len(maps) == 2 and all(m.coloraxis == "coloraxis" for m in maps)
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == 1
    assert len(maps[0].z) == 23
    titles = annotation_texts(fig)
    assert any(t.startswith("AR (2,300 tokens)") and "D1 " in t and "D4 " in t for t in titles)
    assert any(t.startswith("TokenSwift") for t in titles)
    # The looping AR text overlaps itself late on; the random one does not.
    assert maps[0].z[-1][-2] > 0.9 and maps[1].z[-1][-2] < 0.1


def test_repetition_figure_empty():
    assert "No tokens yet" in annotation_texts(repetition_figure([], []))
    fig = repetition_figure([1, 2, 3, 4, 5], [])
    assert len(by_meta(fig, "overlap")) == 1
    assert "no tokens yet" in annotation_texts(fig)
