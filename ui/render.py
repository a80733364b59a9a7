"""RunTrace -> what each pane shows. Pure functions; the plots come from ui.plots."""
from __future__ import annotations

from typing import Callable

from tokenswift.events import TreeNode

from . import plots
from .text import LIVE_WINDOW, repeat_labels, segments, source_labels
from tokenswift.serve.trace import MethodTrace, RunTrace

Decode = Callable[[list[int]], str]

SPEED_NOTE = ("Speed: AR and TokenSwift run alternately in one engine process, apart from the web server (one "
              "TokenSwift iteration, then AR until it catches up), so neither competes with the other for the CPU; "
              "each method's tokens/s is its tokens over its own compute time, prefill excluded.")


def pane_stats(m: MethodTrace, max_new: int) -> str:
    label = "AR" if m.method == "ar" else "TokenSwift"
    if m.generated == 0:
        return f"**{label}** · 0 / {max_new:,} tokens · no tokens yet"
    line = (f"**{label}** · {m.generated:,} / {max_new:,} tokens · **{m.tokens_per_s:,.1f} tok/s** · "
            f"{m.compute_s:.2f} s compute (+{m.prefill_s:.2f} s prefill)")
    if m.method == "tokenswift" and m.iterations:
        totals = m.source_totals
        line += (f" · {m.mean_accepted:.2f} tokens/iteration (head {totals.get('head', 0):,}, "
                 f"n-gram {totals.get('ngram', 0):,}, bonus {totals.get('bonus', 0):,})")
    return line


def summary(trace: RunTrace, greedy: bool) -> str:
    parts = []
    if trace.speedup:
        parts.append(f"**Speedup {trace.speedup:.2f}x** (TokenSwift tok/s ÷ AR tok/s)")
    ts_trace = trace.tokenswift
    if ts_trace.plan and ts_trace.iterations:
        mean_nodes = sum(ts_trace.per_iteration_nodes) / ts_trace.iterations
        parts.append(f"tree auto: {mean_nodes:.1f} nodes per iteration on average; "
                     f"latest {ts_trace.plan}")
    if greedy:
        n = min(trace.ar.generated, trace.tokenswift.generated)
        same = trace.identical_prefix()
        mark = "✅" if same == n else "❌"
        parts.append(f"{mark} identical to AR: {same:,} of {n:,} tokens")
    else:
        parts.append("sampling: TokenSwift is distributed exactly as AR (with equal seeds it draws the same tokens)")
    return " · ".join(parts)


def ts_segments(m: MethodTrace, decode: Decode) -> list[tuple[str, str | None]]:
    return segments(m.token_ids, source_labels(m.sources), decode)


REPEAT_LOOKBACK = 8192  # tokens searched for an earlier occurrence of what the pane shows


def ar_segments(m: MethodTrace, decode: Decode, min_repeat: int = 12) -> list[tuple[str, str | None]]:
    """The AR pane's visible tail with verbatim repeats (of >= min_repeat tokens) highlighted."""
    start = max(0, len(m.token_ids) - LIVE_WINDOW - REPEAT_LOOKBACK)
    recent = m.token_ids[start:]
    labels = [None] * start + repeat_labels(recent, plots.repeated_spans(recent, min_len=min_repeat))
    return segments(m.token_ids, labels, decode)


def latest_tree(m: MethodTrace, pick: int | None = None) -> tuple[int | None, list[TreeNode], list[int]]:
    if not m.trees:
        return None, [], []
    if pick is not None:
        for it, nodes, acc in m.trees:
            if it == pick:
                return it, nodes, acc
    return m.trees[-1]


def tree_figure(m: MethodTrace, decode_one: Callable[[int], str], pick: int | None = None):
    it, nodes, acc = latest_tree(m, pick)
    return plots.draft_tree_figure(nodes, acc, decode_one, it)


def all_plots(trace: RunTrace, decode_one: Callable[[int], str]) -> tuple:
    ts = trace.tokenswift
    return (tree_figure(ts, decode_one), plots.accepted_figure(ts), plots.kv_figure(ts),
            plots.repetition_figure(trace.ar.token_ids, ts.token_ids))


def distinct_line(trace: RunTrace) -> str:
    rows = []
    for m in (trace.ar, trace.tokenswift):
        d = plots.distinct_all(m.token_ids[-2000:])
        rows.append(f"{'AR' if m.method == 'ar' else 'TokenSwift'}: " + " · ".join(f"distinct-{k} {v:.2f}" for k, v in d.items()))
    return "Last 2,000 tokens — " + " | ".join(rows)


def step_explanation(m: MethodTrace, decode_one: Callable[[int], str]) -> tuple[str, list[list]]:
    """Captions and the per-node table for the classroom step view."""
    it, nodes, acc = latest_tree(m)
    if not nodes:
        return "Press **Step** to run one TokenSwift iteration.", []
    heads = sum(1 for n in nodes if n.source == "head")
    grams = sum(1 for n in nodes if n.source == "ngram")
    accepted_path = [n for n in nodes[1:] if n.accepted]
    bonus = acc[-1] if acc else None
    lines = [
        f"**Iteration {it}.**",
        f"1. **Draft**: one forward of the last token «{decode_one(nodes[0].token)}» over the partial KV cache gave the "
        f"base and head distributions; the tree holds {len(nodes) - 1} drafted nodes ({heads} from the heads, "
        f"{grams} from reused n-grams, equal prefixes merged).",
        f"2. **Verify**: one forward of all {len(nodes)} nodes over the full cache with tree attention gave the target's "
        f"distribution at every node.",
        f"3. **Accept**: the target drew one token at each visited node and walked down while a child matched: "
        f"{len(accepted_path)} drafted token(s) accepted, then the bonus «{decode_one(bonus) if bonus is not None else ''}».",
        f"4. **KV update**: the accepted path's K/V was moved into place in the full cache (now {m.cache_length:,} "
        f"positions); the rest of the tree's slots were discarded; the partial cache "
        + (f"holds {m.partial_budget:,} positions at most ({len(m.refresh_at)} refreshes so far)." if m.partial_budget
           else "is not used (drafting reads the full cache)."),
    ]
    rows = []
    for i, n in enumerate(nodes):
        if i == 0:
            why = "root: the last accepted token"
        else:
            parent = nodes[n.parent]
            if parent.target_sample is None:
                why = "not reached (an ancestor was rejected)"
            elif parent.target_sample == n.token:
                why = "accepted: the target drew this token at its parent"
            else:
                why = f"rejected: the target drew «{decode_one(parent.target_sample)}» at its parent"
        rows.append([i, n.depth, decode_one(n.token), n.source, round(n.draft_prob, 3),
                     None if n.target_prob is None else round(n.target_prob, 3),
                     None if n.target_sample is None else decode_one(n.target_sample), why])
    return "\n".join(lines), rows


def text_update(trace: RunTrace, decode: Decode, greedy: bool, status: str) -> dict:
    """The cheap part of a live update: both panes' text and stats, the summary and the status line."""
    return {
        "ar_text": ar_segments(trace.ar, decode), "ts_text": ts_segments(trace.tokenswift, decode),
        "ar_stats": pane_stats(trace.ar, trace.max_new_tokens),
        "ts_stats": pane_stats(trace.tokenswift, trace.max_new_tokens),
        "summary": summary(trace, greedy), "status": status,
    }


def full_update(trace: RunTrace, decode: Decode, decode_one: Callable[[int], str], greedy: bool, status: str) -> dict:
    """Everything the page shows for `trace`, keyed by output name (the layout maps names to components)."""
    out = text_update(trace, decode, greedy, status)
    tree, accepted, kv, repetition = all_plots(trace, decode_one)
    out.update(tree_plot=tree, accepted_plot=accepted, kv_plot=kv, repetition_plot=repetition,
               distinct=distinct_line(trace))
    return out


def step_update(trace: RunTrace, decode: Decode, decode_one: Callable[[int], str], greedy: bool, status: str) -> dict:
    """After one classroom Step: the full update plus the step caption and the table of draft nodes."""
    caption, rows = step_explanation(trace.tokenswift, decode_one)
    out = full_update(trace, decode, decode_one, greedy, status)
    out.update(step_caption=caption, step_table=rows)
    if trace.ar.generated == 0:
        out["ar_stats"] = "**AR** · not run in step mode (Step runs one TokenSwift iteration; Run compares both)"
    return out
