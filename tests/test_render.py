"""What the page shows, as pure functions of a trace: prose panes, the speed panel, step captions."""
from __future__ import annotations

import re

import pytest

from tokenswift.events import AcceptedToken, CacheState, Step, Timings, TreeNode
from tokenswift.serve.trace import RunTrace
from ui import render, step_view
from ui.plots import REPEAT_MIN_TOKENS, SOURCE_COLORS, repeated_spans
from ui.plots.style import blend
from ui.text import PARAGRAPH, TINT, pane_html, palette_css, soft_wrap, span_class

WORDS = {1: "The", 2: " cat", 3: " sat", 4: "\n", 5: " on", 6: " the", 7: " mat", 8: ".", 9: "<b>&"}


def decode(ids: list[int]) -> str:
    return "".join(WORDS.get(i, f" w{i}") for i in ids)


def decode_one(token: int) -> str:
    return decode([token])


def step(index: int, method: str, tokens: list[tuple[int, str]], ms: tuple[float, float, float], generated: int,
         elapsed: float, nodes: int = 0, mode: str = "none", tree: list[TreeNode] | None = None,
         plan: str = "") -> Step:
    timings = Timings(*(t / 1e3 for t in ms))
    return Step(index, method, [AcceptedToken(t, s) for t, s in tokens], CacheState(100 + generated, 4096, 0, mode),
                timings, generated, elapsed, tree=tree or [], draft_nodes=nodes, plan=plan)


# ---- prose panes ------------------------------------------------------------------------------------

def test_single_line_breaks_become_spaces_and_blank_lines_paragraphs():
    segs = [("his sister.\nShe had", "a"), ("\n\n", "b"), ("Chapter", "c"), ("  \r\n  next", "d")]
    assert soft_wrap(segs) == [("his sister. She had", "a"), (PARAGRAPH, "b"), ("Chapter", "c"), (" next", "d")]
    # a run of breaks split over segments is replaced once, where it starts; emptied segments are dropped
    assert soft_wrap([("end\n", 1), ("\n", 2), ("\nstart", 3)]) == [("end" + PARAGRAPH, 1), ("start", 3)]
    assert soft_wrap([("a\n", 1), ("b", 2)]) == [("a ", 1), ("b", 2)]


def test_pane_html_escapes_model_text_and_adds_no_break_opportunity_between_tokens():
    html = pane_html([("x <script>alert(1)</script> &", ("head", False)), ("ter\n\nNew", ("bonus", True))],
                     lambda label: span_class(*label))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&amp;" in html
    assert "\n" not in html  # every line break became a space or a paragraph element
    # the word "&ter" spans two tokens: the spans touch, with no whitespace between them
    assert '&amp;</span><span class="src-bonus rep">ter</span><span class="para"></span>' in html
    assert html.startswith('<div class="prose">') and html.endswith("New</span></div>")


def test_ts_pane_tints_sources_and_underlines_the_repeats_the_plot_counts():
    phrase = list(range(100, 100 + REPEAT_MIN_TOKENS))
    ids = [1, 2, 3] + phrase + [4, 5] + phrase
    trace = RunTrace([0], {}, 100)
    srcs = ["head", "ngram", "bonus"]
    trace.tokenswift.add(step(0, "tokenswift", [(t, srcs[i % 3]) for i, t in enumerate(ids)], (1, 1, 1), len(ids), 1))
    html = render.pane_text(trace.tokenswift, decode)
    assert 'class="src-head"' in html and 'class="src-ngram"' in html and 'class="src-bonus"' in html
    underlined = "".join(re.findall(r'<span class="[^"]*\brep\b[^"]*">([^<]*)</span>', html))
    (span,) = repeated_spans(ids)  # the same definition as the repetition plot's
    assert underlined == decode(ids[span[0] : span[1]])
    assert "earlier run of ≥ 12 tokens" in render.distinct_line(trace).replace(str(REPEAT_MIN_TOKENS), "12")
    assert f"first verbatim repeat at token {span[0]}" in render.distinct_line(trace)


def test_ar_pane_is_untinted_and_says_when_empty():
    trace = RunTrace([0], {}, 10)
    assert "no tokens yet" in render.pane_text(trace.ar, decode)
    trace.ar.add(step(0, "ar", [(9, "ar")], (0, 2, 1), 1, 0.003))
    assert render.pane_text(trace.ar, decode) == '<div class="prose">&lt;b&gt;&amp;</div>'


def test_text_and_plots_share_one_palette():
    css = palette_css()
    for source in ("head", "ngram", "bonus"):
        assert f".src-{source}" in css and blend(SOURCE_COLORS[source], "#ffffff", TINT[source]) in css


# ---- speed panel ------------------------------------------------------------------------------------

def timed_run() -> RunTrace:
    """TokenSwift: 3 tokens per iteration at 6 ms (2 ms draft, 3 verify, 1 bookkeeping); AR: 4 ms a token."""
    trace = RunTrace([0], {"tree": "auto"}, 12)
    for i in range(4):
        nodes = 0 if i == 0 else 6
        trace.tokenswift.add(step(i, "tokenswift", [(1, "head"), (2, "ngram"), (3, "bonus")], (2, 3, 1),
                                  3 * (i + 1), 0.006 * (i + 1), nodes=nodes, mode="fused",
                                  plan="6 nodes: expected 3.00 tokens for 1.50 steps"))
    for i in range(12):
        trace.ar.add(step(i, "ar", [(1, "ar")], (0, 3.5, 0.5), i + 1, 0.004 * (i + 1)))
    return trace


def test_speed_panel_explains_the_ratio_as_arithmetic():
    trace = timed_run()
    panel = render.speed_panel(trace)
    assert trace.speedup == pytest.approx(2.0)
    assert ("3.00 tokens per iteration ÷ (6.00 ms ÷ 4.00 ms = 1.50 AR-step costs per iteration) = **2.00x**"
            in panel)
    assert "| TokenSwift | 2.00 ms | 3.00 ms | 1.00 ms | 6.00 ms | 1.50 |" in panel
    assert "| AR (one step) | – | 3.50 ms | 0.50 ms | 4.00 ms | 1 |" in panel
    assert "| drafted nodes | 0 | 5-8 |" in panel and "| iterations | 1 | 3 |" in panel
    assert "| in AR steps (median 4.00 ms) | 0.75 | 0.75 |" in panel
    assert "3.00 = 2.00 drafted tokens accepted (4 from heads and 4 from reused text in 4 iterations) + 1.00 bonus" in panel
    assert "Tree auto" in panel and "6 nodes: expected 3.00 tokens for 1.50 steps" in panel
    assert "speed" in render.full_update(trace, decode, decode_one, False, "done")


def test_speed_panel_without_ar_or_iterations():
    trace = timed_run()
    trace.ar = RunTrace([0], {}, 1).ar
    assert "no ratio" in render.speed_panel(trace) and "in AR steps" not in render.speed_panel(trace)
    assert "first iteration" in render.speed_panel(RunTrace([0], {}, 1))


def sparse_drafting_run(drafted_every: int, **settings) -> RunTrace:
    """20 auto iterations of which every `drafted_every`-th verified 2 drafted nodes (6 ms, 1.5 tokens on average:
    alternately 1 and 2) and the rest were plain (4 ms, 1 token); AR: 20 steps of 4 ms."""
    trace = RunTrace([0], {"tree": "auto", **settings}, 100)
    generated, elapsed, drafted = 0, 0.0, 0
    for i in range(20):
        nodes = 2 if i % drafted_every == drafted_every - 1 else 0
        if nodes:
            drafted += 1
        tokens = [(1, "bonus")] if not nodes or drafted % 2 else [(1, "head"), (2, "bonus")]
        ms = (0.5, 5.0, 0.5) if nodes else (0.2, 3.6, 0.2)
        generated, elapsed = generated + len(tokens), elapsed + sum(ms) / 1e3
        trace.tokenswift.add(step(i, "tokenswift", tokens, ms, generated, elapsed, nodes=nodes,
                                  plan="0 nodes: no draft paid in the last 3 plans"))
    for i in range(20):
        trace.ar.add(step(i, "ar", [(1, "ar")], (0, 3.6, 0.4), i + 1, 0.004 * (i + 1)))
    return trace


def test_speed_panel_says_why_auto_drafted_little_with_this_runs_figures():
    panel = render.speed_panel(sparse_drafting_run(drafted_every=10))
    assert "**Why auto drafted so little**: it verified drafts in 2 of 20 iterations (10%)" in panel
    assert "Its drafted iterations took 1.25 AR steps to verify (median) for 1.50 tokens each." in panel
    # the acceptance side is told for the run's own sampling
    assert "seldom repeats" in panel
    assert "with the penalty on" in render.speed_panel(sparse_drafting_run(10, penalty=1.2, temperature=0.0))
    sampled = render.speed_panel(sparse_drafting_run(10, penalty=1.0, temperature=1.0))
    assert "a sampled token often differs" in sampled and "with the penalty on" not in sampled
    # a run that drafts often, an unsettled run and a fixed tree get no such line
    assert "Why auto drafted so little" not in render.speed_panel(sparse_drafting_run(drafted_every=2))
    assert "Why auto drafted so little" not in render.speed_panel(timed_run())
    fixed = sparse_drafting_run(drafted_every=10)
    fixed.tokenswift.plan = ""
    assert "Why auto drafted so little" not in render.speed_panel(fixed)


# ---- classroom step view ----------------------------------------------------------------------------

def tree(cut: bool = False) -> tuple[list[TreeNode], list[tuple[int, str]]]:
    """Root 1 -> head 2 (accepted) -> head 3 (accepted); n-gram 5 rejected; the target drew 7 after 3."""
    nodes = [TreeNode(1, -1, 0, "root", 1.0, True, None, 2), TreeNode(2, 0, 1, "head", 0.6, True, 0.5, 3),
             TreeNode(3, 1, 2, "head", 0.4, True, 0.7, 7), TreeNode(5, 0, 1, "ngram", 1.0, False, 0.1, None)]
    tokens = [(2, "head"), (3, "head"), (7, "bonus")]
    return nodes, tokens[:1] if cut else tokens


def stepped(mode: str, settings: dict, index: int = 3, cut: bool = False, budget: int = 0) -> RunTrace:
    trace = RunTrace([0], settings, 100)
    nodes, tokens = tree(cut)
    s = step(index, "tokenswift", tokens, (1, 2, 1), len(tokens), 0.004, nodes=3, mode=mode, tree=nodes)
    s.cache.partial_budget = budget
    trace.tokenswift.add(s)
    return trace


def caption(trace: RunTrace) -> str:
    return step_view.step_explanation(trace.tokenswift, decode_one, trace.settings)[0]


def test_caption_paper_mode_with_a_partial_cache():
    text = caption(stepped("dynamic", {"tree": "1x3x3x3", "draft": "paper", "temperature": 1.0}, budget=1024))
    assert "one draft forward of «The» over the partial KV cache (dynamic, holding 0 of at most 1,024 positions)" in text
    assert "fused" not in text and "drew one target token" in text
    assert "then the bonus « mat» (the target's own draw where the walk stopped)" in text
    assert "2 from the heads, 1 from reused text" in text and "proposed the tokens after it" in text


def test_caption_fused_mode_says_there_is_no_draft_forward():
    text = caption(stepped("fused", {"tree": "1x3x3x3", "draft": "fused", "temperature": 0.0}))
    assert "no draft forward (fused drafting)" in text and "no partial KV cache" in text
    assert "partial cache took" not in text and "most likely token (greedy)" in text
    first = caption(stepped("fused", {"tree": "1x3x3x3", "draft": "fused"}, index=0))
    assert "first iteration" in first and "over the full KV cache" in first


def test_caption_never_says_the_heads_proposed_what_they_did_not():
    trace = RunTrace([0], {"tree": "1x3x3x3"}, 100)
    nodes = [TreeNode(1, -1, 0, "root", 1.0, True, None, 5), TreeNode(5, 0, 1, "ngram", 1.0, True, 0.9, 7)]
    trace.tokenswift.add(step(2, "tokenswift", [(5, "ngram"), (7, "bonus")], (1, 2, 1), 2, 0.004, nodes=1,
                              mode="dynamic", tree=nodes))
    text = caption(trace)
    assert "proposed nothing this time" in text and "0 from the heads" not in text and "1 from reused text" in text


def test_caption_full_cache_mode_has_no_partial_cache():
    text = caption(stepped("full", {"tree": "1x3x3x3", "draft": "paper", "kv_mode": "full"}))
    assert "over the full KV cache (kv_mode=full: no partial cache)" in text
    assert "there is no partial cache to update" in text


def test_caption_auto_names_the_plan():
    trace = stepped("fused", {"tree": "auto", "draft": "paper"})
    trace.tokenswift.plan = "3 nodes: expected 2.10 tokens for 1.20 steps"
    assert "tree=auto kept only the candidates that pay" in caption(trace) and "fused" in caption(trace)
    plain = RunTrace([0], {"tree": "auto"}, 100)
    plain.tokenswift.add(step(0, "tokenswift", [(2, "bonus")], (1, 2, 1), 1, 0.004, mode="fused",
                              tree=[TreeNode(1, -1, 0, "root", 1.0, True, None, 2)],
                              plan="0 nodes: measuring this machine's step"))
    assert "nothing drafted" in caption(plain) and "AR-cost step" in caption(plain)


def test_step_rows_read_in_order_and_each_verdict_agrees_with_the_draw_in_its_row():
    trace = stepped("dynamic", {"tree": "1x3x3x3", "temperature": 0.0}, budget=1024)
    rows = step_view.step_rows(trace.tokenswift, decode_one, trace.settings)
    col = {name: k for k, name in enumerate(step_view.COLUMNS)}
    assert [r[col["node"]] for r in rows] == [0, 1, 3, 2]  # root, depth 1 (accepted first), depth 2
    assert [r[col["verdict"]] for r in rows] == ["start", "✓ accepted", "✗ rejected", "✓ accepted"]
    for r in rows[1:]:
        drew, token, verdict = r[col["the target drew there"]], r[col["token"]], r[col["verdict"]]
        assert (drew == token) == (verdict == "✓ accepted"), r
        assert r[col["why"]].count(f"«{drew}»") >= 1  # the sentence names the same draw
    assert rows[2][col["after"]] == "«The» (node 0)" and rows[2][col["the target drew there"]] == " cat"
    assert "No child of node" not in rows[2][col["why"]]  # the walk went on through node 1
    assert rows[0][col["why"]].startswith("The last committed token")


def test_step_rows_mark_what_the_token_limit_cut_and_sum_up_unreached_nodes():
    trace = stepped("dynamic", {"tree": "1x3x3x3"}, cut=True, budget=1024)
    text, rows = step_view.step_explanation(trace.tokenswift, decode_one, trace.settings)
    assert "cut the output after 1 of them, so the bonus « mat» was drawn but not emitted" in text
    assert rows[-1][7] == "✓ not emitted" and "token limit" in rows[-1][8]
    nodes, tokens = tree()
    nodes.append(TreeNode(8, 3, 2, "ngram", 1.0, False, None, None))  # under the rejected n-gram: never reached
    nodes.append(TreeNode(9, 3, 2, "ngram", 1.0, False, None, None))
    deep = RunTrace([0], {}, 100)
    deep.tokenswift.add(step(1, "tokenswift", tokens, (1, 2, 1), 3, 0.004, nodes=5, mode="dynamic", tree=nodes))
    rows = step_view.step_rows(deep.tokenswift, decode_one)
    assert rows[-1][7] == "not reached" and rows[-1][8].startswith("2 more nodes not reached")
    assert len(rows) == 5  # root, three visited drafts, one summary row
    html = step_view.table_html(rows)
    assert "<th>the target drew there</th>" in html and "not on the same scale" in html


def test_tokens_in_captions_are_visible_and_cannot_inject_markdown():
    trace = stepped("dynamic", {"tree": "1x3x3x3"}, budget=1024)
    weird = {1: "\n", 2: " *bold* <b>", 3: "[x](y)", 5: "_", 7: "\t"}
    text, rows = step_view.step_explanation(trace.tokenswift, lambda t: weird[t], trace.settings)
    assert "«⏎»" in text and "bonus «⇥»" in text and "*bold*" not in text and "<b>" not in text
    assert [r[2] for r in rows] == ["⏎", " *bold* <b>", "_", "[x](y)"]  # the table shows text as it is
    assert "<b>" not in step_view.table_html(rows) and "&lt;b&gt;" in step_view.table_html(rows)
