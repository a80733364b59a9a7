"""RunTrace -> what each pane shows. Pure functions; the plots come from ui.plots."""
from __future__ import annotations

import re
from typing import Callable

from tokenswift.events import TreeNode
from tokenswift.kinds import KVMode, Method, Source
from tokenswift.serve.trace import MethodTrace, RunTrace

from . import plots
from .plots import speed
from .plots.repetition import REPEAT_MIN_TOKENS
from .text import LIVE_WINDOW, Label, pane_html, placeholder_html, segments, span_class

Decode = Callable[[list[int]], str]
DecodeOne = Callable[[int], str]

SPEED_NOTE = ("Speed: AR and TokenSwift run alternately in one engine process, apart from the web server (one "
              "TokenSwift iteration, then AR until it catches up), so neither competes with the other for the CPU; "
              "each method's tokens/s is its tokens over its own compute time, prefill excluded.")
REPEAT_LOOKBACK = 8192  # tokens before the pane's visible window searched for an earlier occurrence
DISTINCT_TAIL = 2000  # Distinct-n is measured over each pane's last tokens (it falls with length)


def _name(m: MethodTrace) -> str:
    return "AR" if m.method == Method.AR else "TokenSwift"


def pane_stats(m: MethodTrace, max_new: int) -> str:
    label = _name(m)
    if m.generated == 0:
        return f"**{label}** · 0 / {max_new:,} tokens · no tokens yet"
    line = (f"**{label}** · {m.generated:,} / {max_new:,} tokens · **{m.tokens_per_s:,.1f} tok/s** · "
            f"{m.compute_s:.2f} s compute (+{m.prefill_s:.2f} s prefill)")
    if m.method == Method.TOKENSWIFT and m.iterations:
        totals = m.source_totals
        line += (f" · {m.mean_accepted:.2f} tokens/iteration (head {totals.get(Source.HEAD, 0):,}, "
                 f"n-gram {totals.get(Source.NGRAM, 0):,}, bonus {totals.get(Source.BONUS, 0):,})")
    return line


def summary(trace: RunTrace, greedy: bool) -> str:
    parts = []
    if trace.speedup:
        parts.append(f"**Speedup {trace.speedup:.2f}x** (TokenSwift tok/s ÷ AR tok/s; the speed panel below says why)")
    if greedy:
        n = min(trace.ar.generated, trace.tokenswift.generated)
        same = trace.identical_prefix()
        mark = "✅" if same == n else "❌"
        parts.append(f"{mark} identical to AR: {same:,} of {n:,} tokens")
    else:
        parts.append("sampling: TokenSwift is distributed exactly as AR (with equal seeds it draws the same tokens)")
    return " · ".join(parts)


# ---- the panes ---------------------------------------------------------------------------------------------

def _pane_labels(m: MethodTrace, sources: bool) -> list[Label]:
    """Per token: (source or None, inside a repeated span?). Repeats are searched from REPEAT_LOOKBACK
    tokens before the visible window on."""
    start = max(0, len(m.token_ids) - LIVE_WINDOW - REPEAT_LOOKBACK)
    repeated = [False] * len(m.token_ids)
    for a, b in plots.repeated_spans(m.token_ids[start:]):
        repeated[start + a : start + b] = [True] * (b - a)
    kinds = m.sources if sources else [None] * len(m.token_ids)
    return list(zip(kinds, repeated))


def _class_of(label: Label) -> str:
    return "" if label is None else span_class(*label)


def pane_text(m: MethodTrace, decode: Decode) -> str:
    """A pane's HTML: AR text with repeats underlined; TokenSwift text also tinted by source."""
    if not m.generated:
        return placeholder_html("no tokens yet")
    labels = _pane_labels(m, sources=m.method != Method.AR)
    return pane_html(segments(m.token_ids, labels, decode), _class_of)


def distinct_line(trace: RunTrace) -> str:
    """Distinct-1..4 (last DISTINCT_TAIL tokens) and the first verbatim repeat, per pane."""
    rows = []
    for m in (trace.ar, trace.tokenswift):
        d = plots.distinct_all(m.token_ids[-DISTINCT_TAIL:])
        spans = plots.repeated_spans(m.token_ids)
        first = f"first verbatim repeat at token {spans[0][0]:,}" if spans else "no verbatim repeat"
        rows.append(f"**{_name(m)}**: " + " · ".join(f"distinct-{k} {v:.2f}" for k, v in d.items()) + f" · {first}")
    return (f"Last {DISTINCT_TAIL:,} tokens; a verbatim repeat copies an earlier run of ≥ {REPEAT_MIN_TOKENS} tokens "
            "(underlined in the panes) — " + " | ".join(rows))


# ---- plots -------------------------------------------------------------------------------------------------

def latest_tree(m: MethodTrace, pick: int | None = None) -> tuple[int | None, list[TreeNode], list[int]]:
    if not m.trees:
        return None, [], []
    if pick is not None:
        for it, nodes, acc in m.trees:
            if it == pick:
                return it, nodes, acc
    return m.trees[-1]


def tree_figure(m: MethodTrace, decode_one: DecodeOne, pick: int | None = None):
    it, nodes, acc = latest_tree(m, pick)
    return plots.draft_tree_figure(nodes, acc, decode_one, it)


def all_plots(trace: RunTrace, decode_one: DecodeOne) -> tuple:
    ts = trace.tokenswift
    return (tree_figure(ts, decode_one), plots.accepted_figure(ts), plots.kv_figure(ts),
            plots.repetition_figure(trace.ar.token_ids, ts.token_ids))


# ---- the speed panel ---------------------------------------------------------------------------------------

def _split_table(ts: speed.Split, ar: speed.Split | None, ar_step: float) -> list[str]:
    """Mean ms per iteration; with AR, also one AR step and the iteration's cost in AR steps."""
    rows = ["| mean per iteration | draft | verify | bookkeeping | total |" + (" in AR steps |" if ar else ""),
            "|---|---|---|---|---|" + ("---|" if ar else ""),
            f"| TokenSwift | {ts.draft:.2f} ms | {ts.verify:.2f} ms | {ts.bookkeeping:.2f} ms | {ts.total:.2f} ms |"
            + (f" {ts.total / ar_step:.2f} |" if ar else "")]
    if ar:
        rows.append(f"| AR (one step) | – | {ar.verify:.2f} ms | {ar.bookkeeping:.2f} ms | {ar.total:.2f} ms | 1 |")
    return rows


def _cost_table(buckets: list[speed.CostBucket], ar_median: float) -> list[str]:
    """Median verify ms per drafted-node bucket; with AR, also in median AR steps (medians: robust to the
    odd slow iteration)."""
    rows = ["| drafted nodes | " + " | ".join(b.label for b in buckets) + " |",
            "|---|" + "---|" * len(buckets),
            "| iterations | " + " | ".join(f"{b.iterations:,}" for b in buckets) + " |",
            "| median verify | " + " | ".join(f"{b.verify_ms:.2f} ms" for b in buckets) + " |"]
    if ar_median:
        rows.append(f"| in AR steps (median {ar_median:.2f} ms) | "
                    + " | ".join(f"{b.verify_ms / ar_median:.2f}" for b in buckets) + " |")
    return rows


def _ratio_line(trace: RunTrace, ts_step: float, ar_step: float) -> str:
    ts = trace.tokenswift
    per_iter = ts.mean_accepted
    if not ar_step:
        return f"**{per_iter:.2f} tokens per iteration**; AR has not run, so there is no ratio to explain."
    steps = ts_step / ar_step
    return (f"**The ratio**: {per_iter:.2f} tokens per iteration ÷ ({ts_step:.2f} ms ÷ {ar_step:.2f} ms = "
            f"{steps:.2f} AR-step costs per iteration) = **{per_iter / steps:.2f}x** "
            f"(TokenSwift {ts.tokens_per_s:,.1f} tok/s ÷ AR {trace.ar.tokens_per_s:,.1f} tok/s). "
            + ("TokenSwift wins where each iteration yields more tokens than it costs AR steps."
               if per_iter > steps else
               "TokenSwift loses here: an iteration costs more AR steps than the tokens it yields."))


def _tree_line(trace: RunTrace) -> str:
    ts = trace.tokenswift
    tree = trace.settings.get("tree", "")
    nodes = f"{speed.mean_nodes(ts):.1f} drafted nodes verified per iteration on average"
    if not ts.plan:
        return f"**Tree {tree}**: {nodes}."
    return (f"**Tree auto**: {nodes}. Each iteration it verifies the candidates (suffix matches, the model's "
            "datastore of continuations, fused heads, 4-grams) with the best measured acceptance, as many as maximise expected tokens per unit of measured "
            f"cost (cost in one-token steps of this machine). Latest plan: *{ts.plan}*.")


def speed_panel(trace: RunTrace) -> str:
    """Why the speedup is what it is: time per iteration against one AR step, the cost of verifying q
    nodes as this run measured it, tokens per iteration, and the ratio as arithmetic."""
    ts, ar = trace.tokenswift, trace.ar
    split = speed.mean_split(ts)
    if split is None:
        return "**Speed panel**: appears after TokenSwift's first iteration."
    ar_step = speed.step_ms(ar)
    ts_step = speed.step_ms(ts)
    totals = ts.source_totals
    heads, grams, bonus = (totals.get(s, 0) for s in (Source.HEAD, Source.NGRAM, Source.BONUS))
    tokens = (f"**Tokens per iteration**: {ts.mean_accepted:.2f} = {(heads + grams) / ts.iterations:.2f} drafted "
              f"tokens accepted ({heads:,} from heads and {grams:,} from n-grams in {ts.iterations:,} iterations) "
              f"+ {bonus / ts.iterations:.2f} bonus token (the target's own; one per iteration unless the token "
              "limit cut the last one).")
    lines = ["#### Why this speed: one TokenSwift iteration against one AR step",
             *_split_table(split, speed.mean_split(ar), ar_step), "",
             "**Verifying q drafted nodes on this machine** (this run's iterations; the verify forward grows with "
             "the number of rows):", "", *_cost_table(speed.verify_cost(ts), speed.median_step_ms(ar)), "",
             tokens, "", _tree_line(trace), "", _ratio_line(trace, ts_step, ar_step)]
    return "\n".join(lines)


# ---- the classroom step view -------------------------------------------------------------------------------

_CONTROL = str.maketrans({"\n": "⏎", "\r": "␍", "\t": "⇥"})
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~])")


def token_text(decode_one: DecodeOne, token: int) -> str:
    """A token as the step table shows it: line breaks and tabs made visible."""
    return decode_one(token).translate(_CONTROL)


def token_md(decode_one: DecodeOne, token: int) -> str:
    """A token for a Markdown caption: visible line breaks, Markdown characters escaped (model text)."""
    return _MARKDOWN.sub(r"\\\1", token_text(decode_one, token))


def _accepted_path(nodes: list[TreeNode]) -> list[int]:
    """The accepted drafted nodes (root excluded), shallow to deep."""
    return sorted((i for i, n in enumerate(nodes) if n.accepted and n.parent >= 0), key=lambda i: nodes[i].depth)


def _draft_caption(m: MethodTrace, it: int, nodes: list[TreeNode], settings: dict, root: str) -> str:
    """Step 1 as the engine ran it: m.partial_mode is what the engine reported ("fused", "full", "once",
    "dynamic", or "none" without heads); tree="auto" always drafts fused."""
    heads = sum(1 for n in nodes if n.source == Source.HEAD)
    grams = len(nodes) - 1 - heads
    held = f"the tree holds {len(nodes) - 1} drafted nodes ({heads} from the heads, {grams} from reused text, " \
           "equal prefixes merged)"
    auto = settings.get("tree") == "auto"
    if auto and len(nodes) == 1:
        return (f"1. **Draft (tree auto)**: nothing drafted — *{m.plan}*. No candidate was expected to pay for its "
                f"verification, so this iteration is an AR-cost step: one forward of «{root}» and the target's "
                "token.")
    plan = f" tree=auto kept only the candidates that pay on this machine: *{m.plan}*." if auto else ""
    mode = m.partial_mode
    if mode == "fused" and not (it == 0 and not auto):
        how = (f"no draft forward (fused drafting): the heads read the hidden state that the previous "
               f"verification pass left at the token before «{root}», and proposed the tokens after it; "
               f"reused n-grams continue «{root}»; no partial KV cache is used")
    elif mode == "fused":
        how = (f"fused drafting, first iteration: no verification pass yet for the heads to read, so one draft "
               f"forward of «{root}» over the full KV cache (fused drafting uses no partial cache)")
    elif mode == KVMode.FULL:
        how = (f"one draft forward of «{root}» over the full KV cache (kv_mode=full: no partial cache) gave the base "
               "LM head's distribution (depth 1) and the extra heads' (deeper)")
    elif mode in (KVMode.ONCE, KVMode.DYNAMIC):
        how = (f"one draft forward of «{root}» over the partial KV cache ({mode}, {m.partial_budget:,} positions) "
               "gave the base LM head's distribution (depth 1) and the extra heads' (deeper)")
    else:
        how = f"no heads: only reused n-grams that continue «{root}»"
    return f"1. **Draft**: {how}; {held}.{plan}"


def _accept_caption(nodes: list[TreeNode], acc: list[int], greedy: bool, decode_one: DecodeOne) -> str:
    path = _accepted_path(nodes)
    bonus, emitted = plots.bonus_token(nodes, acc)
    rule = ("took the target's argmax at each visited node" if greedy else
            "drew one target token at each visited node")
    text = f"3. **Accept**: the walk {rule} and went down while a child matched: {len(path)} drafted token(s) accepted"
    shown = token_md(decode_one, bonus) if bonus is not None else "?"
    if emitted:
        return text + f", then the bonus «{shown}» (the target's own token)."
    return text + (f"; the run's end (its token limit, or an end-of-text token) cut the output after {len(acc)} of "
                   f"them, so the bonus «{shown}» was drawn but not emitted.")


def _kv_caption(m: MethodTrace) -> str:
    text = (f"4. **KV update**: the accepted path's K/V was moved into place in the full cache (now {m.cache_length:,} "
            "positions); the rest of the tree's slots were discarded")
    if m.partial_budget:
        return text + (f"; the partial cache took the new tokens into its recent tail ({m.partial_budget:,} "
                       f"positions at most, {len(m.refresh_at)} refreshes so far).")
    if m.partial_mode == "fused":
        return text + "; the hidden state at the last accepted token is kept for the next iteration's heads."
    return text + "; there is no partial cache to update."


TABLE_NOTE = ("Table: *proposer score* is what ranked a node when the tree was built — a head's softmax at "
              "temperature 1 without truncation, or a reused n-gram's share of the table's counts (1 for a suffix "
              "match; for a datastore continuation, its share of what followed that context in the datastore); *target p* is the target's probability of the node's token at its parent after the whole "
              "sampling chain (penalty, temperature, top-p, min-p). They are not on the same scale.")


def step_explanation(m: MethodTrace, decode_one: DecodeOne, settings: dict | None = None) -> tuple[str, list[list]]:
    """Captions and the per-node table for the classroom step view; `settings`: the run's
    tokenswift.Settings fields (RunTrace.settings)."""
    settings = settings or {}
    it, nodes, acc = latest_tree(m)
    if not nodes:
        return "Press **Step** to run one TokenSwift iteration.", []
    greedy = float(settings.get("temperature", 0.0)) == 0.0
    lines = [
        f"**Iteration {it}.**",
        _draft_caption(m, it, nodes, settings, token_md(decode_one, nodes[0].token)),
        f"2. **Verify**: one forward of all {len(nodes)} nodes (the root and its drafts) over the full cache with "
        "tree attention gave the target's distribution at every node.",
        _accept_caption(nodes, acc, greedy, decode_one),
        _kv_caption(m),
        "",
        TABLE_NOTE,
    ]
    cut = set(_accepted_path(nodes)[len(acc):])  # accepted, but past the run's token limit
    return "\n".join(lines), [_node_row(i, n, nodes, decode_one, i in cut) for i, n in enumerate(nodes)]


def _node_row(i: int, n: TreeNode, nodes: list[TreeNode], decode_one: DecodeOne, cut: bool) -> list:
    if n.parent < 0:
        why = "root: the last accepted token"
    elif cut:
        why = "accepted, but not emitted: the run ended first (token limit or end of text)"
    else:
        parent = nodes[n.parent]
        if parent.target_sample is None:
            why = "not reached (an ancestor was rejected)"
        elif parent.target_sample == n.token:
            why = "accepted: the target drew this token at its parent"
        else:
            why = f"rejected: the target drew «{token_text(decode_one, parent.target_sample)}» at its parent"
    return [i, n.depth, token_text(decode_one, n.token), n.source, round(n.draft_prob, 3),
            None if n.target_prob is None else round(n.target_prob, 3),
            None if n.target_sample is None else token_text(decode_one, n.target_sample), why]


# ---- updates by output name --------------------------------------------------------------------------------

def text_update(trace: RunTrace, decode: Decode, greedy: bool, status: str) -> dict:
    """The cheap part of a live update: both panes' text and stats, the summary and the status line."""
    return {
        "ar_text": pane_text(trace.ar, decode), "ts_text": pane_text(trace.tokenswift, decode),
        "ar_stats": pane_stats(trace.ar, trace.max_new_tokens),
        "ts_stats": pane_stats(trace.tokenswift, trace.max_new_tokens),
        "summary": summary(trace, greedy), "status": status,
    }


def full_update(trace: RunTrace, decode: Decode, decode_one: DecodeOne, greedy: bool, status: str) -> dict:
    """Everything the page shows for `trace`, keyed by output name (the layout maps names to components)."""
    out = text_update(trace, decode, greedy, status)
    tree, accepted, kv, repetition = all_plots(trace, decode_one)
    out.update(tree_plot=tree, accepted_plot=accepted, kv_plot=kv, repetition_plot=repetition,
               distinct=distinct_line(trace), speed=speed_panel(trace))
    return out


def step_update(trace: RunTrace, decode: Decode, decode_one: DecodeOne, greedy: bool, status: str) -> dict:
    """After one classroom Step: the full update plus the step caption and the table of draft nodes."""
    caption, rows = step_explanation(trace.tokenswift, decode_one, trace.settings)
    out = full_update(trace, decode, decode_one, greedy, status)
    out.update(step_caption=caption, step_table=rows)
    if trace.ar.generated == 0:
        out["ar_stats"] = "**AR** · not run in step mode (Step runs one TokenSwift iteration; Run compares both)"
    return out
