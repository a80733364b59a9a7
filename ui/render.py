"""RunTrace -> what each pane shows. Pure functions; the plots come from ui.plots."""
from __future__ import annotations

from typing import Callable

from tokenswift.kinds import Method, Source
from tokenswift.serve.trace import MethodTrace, RunTrace

from . import plots
from .plots import speed
from .plots.repetition import REPEAT_MIN_TOKENS
from .race import Shown, everything
from .step_view import kept_iterations, latest_tree, step_caption, step_rows, table_html
from .text import LIVE_WINDOW, Label, pane_html, placeholder_html, segments, span_class

Decode = Callable[[list[int]], str]
DecodeOne = Callable[[int], str]

SPEED_NOTE = ("Speed: AR and TokenSwift run alternately in one engine process, apart from the web server (one "
              "TokenSwift iteration, then AR until it catches up), so neither competes with the other for the CPU; "
              "each method's tokens/s is its tokens over its own compute time, prefill excluded.")
REPEAT_LOOKBACK = 8192  # tokens before the pane's visible window searched for an earlier occurrence
DISTINCT_TAIL = 2000  # Distinct-n is measured over each pane's last tokens (it falls with length)
PROMPT_TAIL_TOKENS = 40  # step mode: the prompt's last tokens shown before the new ones


def _name(m: MethodTrace) -> str:
    return "AR" if m.method == Method.AR else "TokenSwift"


def pane_stats(m: MethodTrace, max_new: int, shown: Shown | None = None) -> str:
    """A pane's header: tokens shown, and the method's speed over them (own compute, prefill excluded)."""
    label = _name(m)
    shown = shown or Shown(m.generated, m.iterations, m.compute_s)
    if shown.tokens == 0:
        return f"**{label}** · 0 / {max_new:,} tokens · no tokens yet"
    rate = shown.tokens / shown.seconds if shown.seconds > 0 else 0.0
    line = (f"**{label}** · {shown.tokens:,} / {max_new:,} tokens · **{rate:,.1f} tok/s** · "
            f"{shown.seconds:.2f} s compute (+{m.prefill_s:.2f} s prefill)")
    if m.method == Method.TOKENSWIFT and shown.iterations:
        line += f" · {shown.tokens / shown.iterations:.2f} tokens/iteration"
        if shown.tokens == m.generated:
            totals = m.source_totals
            line += (f" (head {totals.get(Source.HEAD, 0):,}, reused text {totals.get(Source.NGRAM, 0):,}, "
                     f"bonus {totals.get(Source.BONUS, 0):,})")
    return line


def step_stats(m: MethodTrace, max_new: int) -> str:
    """The TokenSwift pane's header in step mode: tokens and iterations, no speed (one iteration is no measure)."""
    if not m.iterations:
        return f"**TokenSwift** · step mode · 0 / {max_new:,} tokens"
    return (f"**TokenSwift** · step mode · {m.generated:,} / {max_new:,} tokens in {m.iterations:,} "
            f"iteration{'s' if m.iterations != 1 else ''} (speed is measured by Run, not by single steps)")


def headline(trace: RunTrace) -> str:
    """The speedup, once both methods have run enough iterations to give it meaning, with its uncertainty."""
    ratio = speed.speed_ratio(trace.tokenswift, trace.ar)
    if not ratio.value:
        return ""
    if not ratio.settled:
        done = min(trace.tokenswift.iterations, trace.ar.iterations)
        return (f"**Speedup: measuring** ({done} of the {speed.MIN_RATIO_ITERATIONS} iterations per method it needs "
                "before it means anything)")
    return (f"**Speedup {ratio.value:.2f}x ± {ratio.error:.2f}** (TokenSwift tok/s ÷ AR tok/s, ± one standard "
            "error from the iterations' spread; the speed panel below says why)")


def summary(trace: RunTrace, greedy: bool, shown: dict[str, Shown] | None = None) -> str:
    """The headline and the losslessness check, over the tokens the panes show."""
    parts = [headline(trace)] if headline(trace) else []
    if greedy:
        n = min(trace.ar.generated, trace.tokenswift.generated)
        if shown is not None:
            n = min(n, *(s.tokens for s in shown.values()))
        same = min(trace.identical_prefix(), n)
        mark = "✅" if same == n else "❌"
        parts.append(f"{mark} identical to AR: {same:,} of {n:,} tokens")
    else:
        parts.append("sampling: TokenSwift is distributed exactly as AR (with equal seeds it draws the same tokens)")
    return " · ".join(parts)


def step_summary(trace: RunTrace) -> str:
    """Step mode has no AR pane to compare with: say what guarantees the tokens instead."""
    return ("**Step mode**: TokenSwift only, one iteration per press. Every token shown is one the target itself "
            "drew at the end of the walk (or a draft equal to its draw), which is why the output equals AR's: "
            "**Run** shows both side by side.")


# ---- the panes ---------------------------------------------------------------------------------------------

def _pane_labels(tokens: list[int], kinds: list, sources: bool) -> list[Label]:
    """Per token: (source or None, inside a repeated span?). Repeats are searched from REPEAT_LOOKBACK
    tokens before the visible window on."""
    start = max(0, len(tokens) - LIVE_WINDOW - REPEAT_LOOKBACK)
    repeated = [False] * len(tokens)
    for a, b in plots.repeated_spans(tokens[start:]):
        repeated[start + a : start + b] = [True] * (b - a)
    kinds = kinds if sources else [None] * len(tokens)
    return list(zip(kinds, repeated))


PROMPT_LABEL = "prompt"  # the step mode's prompt tail, in grey


def _class_of(label: Label) -> str:
    if label == PROMPT_LABEL:
        return "prompt"
    return "" if label is None else span_class(*label)


def pane_text(m: MethodTrace, decode: Decode, upto: int | None = None, prompt_tail: str = "") -> str:
    """A pane's HTML: AR text with repeats underlined; TokenSwift text also tinted by source. `upto`: only the
    first tokens (the race display); `prompt_tail`: the prompt's last words before them, in grey (step mode)."""
    n = m.generated if upto is None else min(upto, m.generated)
    if not n:
        return placeholder_html("no tokens yet")
    tokens = m.token_ids[:n]
    labels = _pane_labels(tokens, m.sources[:n], sources=m.method != Method.AR)
    segs = segments(tokens, labels, decode)
    if prompt_tail:
        segs = [(prompt_tail, PROMPT_LABEL)] + segs
    return pane_html(segs, _class_of)


def prompt_tail(prompt_ids: list[int], decode: Decode, tokens: int = PROMPT_TAIL_TOKENS) -> str:
    text = decode(prompt_ids[-tokens:])
    return ("…" if len(prompt_ids) > tokens else "") + text


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

def tree_figure(m: MethodTrace, decode_one: DecodeOne, pick: int | None = None):
    """The draft tree of iteration `pick` (None: the latest kept). An iteration the trace no longer keeps gets a
    figure that says so and names the kept ones, instead of silently showing another."""
    kept = kept_iterations(m)
    if pick is not None and kept and pick not in kept:
        return plots.placeholder_figure(
            f"Iteration {pick:,} is not kept: this run keeps the trees of iterations {kept[0]:,}–{kept[-1]:,}",
            f"Draft tree, iteration {pick:,}", 300)
    it, nodes, acc = latest_tree(m, pick)
    return plots.draft_tree_figure(nodes, acc, decode_one, it)


STEP_TREE_HEIGHT = 560  # the step view's tree: beside the caption, so the table below it starts on screen


def step_tree_figure(m: MethodTrace, decode_one: DecodeOne):
    """The latest iteration's tree for the step view: the same iteration as the caption and the table, with
    labels on the nodes the table lists."""
    it, nodes, acc = latest_tree(m)
    return plots.draft_tree_figure(nodes, acc, decode_one, it, height=STEP_TREE_HEIGHT, visited_labels=True)


def all_plots(trace: RunTrace, decode_one: DecodeOne, ar_tokens: int | None = None) -> tuple:
    ts = trace.tokenswift
    ar_ids = trace.ar.token_ids if ar_tokens is None else trace.ar.token_ids[:ar_tokens]
    return (tree_figure(ts, decode_one), plots.accepted_figure(ts), plots.kv_figure(ts),
            plots.repetition_figure(ar_ids, ts.token_ids))


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
    ratio = speed.speed_ratio(ts, trace.ar)
    early = ("" if ratio.settled else
             f" *Only {min(ts.iterations, trace.ar.iterations)} iterations so far: not yet a measurement.*")
    return (f"**The ratio**: {per_iter:.2f} tokens per iteration ÷ ({ts_step:.2f} ms ÷ {ar_step:.2f} ms = "
            f"{steps:.2f} AR-step costs per iteration) = **{per_iter / steps:.2f}x** "
            f"(TokenSwift {ts.tokens_per_s:,.1f} tok/s ÷ AR {trace.ar.tokens_per_s:,.1f} tok/s). "
            + ("TokenSwift wins where each iteration yields more tokens than it costs AR steps."
               if per_iter > steps else
               "TokenSwift loses here: an iteration costs more AR steps than the tokens it yields.") + early)


def _tree_line(trace: RunTrace) -> str:
    ts = trace.tokenswift
    tree = trace.settings.get("tree", "")
    nodes = f"{speed.mean_nodes(ts):.1f} drafted nodes verified per iteration on average"
    if not ts.plan:
        return f"**Tree {tree}**: {nodes}."
    return (f"**Tree auto**: {nodes}. Each iteration it verifies the candidates (suffix matches, the model's "
            "datastore of continuations, fused heads, 4-grams) with the best measured acceptance, as many as "
            "maximise expected tokens per unit of measured cost (cost in one-token steps of this machine); it "
            "drafts fused, so it needs no partial KV cache. The three kinds of reused text are counted together as "
            f"\"reused text\". Latest plan: *{ts.plan}*.")


def _little_drafting_line(trace: RunTrace, ar_median: float) -> str:
    """Where auto verified drafts in few iterations (a settled run): how few, what those cost and yielded, and the
    two measured sides of the trade it weighs. Empty otherwise."""
    ts = trace.tokenswift
    if not ts.plan or min(ts.iterations, trace.ar.iterations) < speed.MIN_RATIO_ITERATIONS:
        return ""
    d = speed.drafting(ts)
    if d.share >= speed.LOW_DRAFTING:
        return ""
    line = (f"**Why auto drafted so little**: it verified drafts in {d.drafted:,} of {d.iterations:,} iterations "
            f"({d.share:.0%}); the rest were one AR-cost step each.")
    if d.drafted and ar_median:
        line += (f" Its drafted iterations took {d.verify_ms / ar_median:.2f} AR steps to verify (median) for "
                 f"{d.tokens:.2f} tokens each.")
    settings = trace.settings
    if float(settings.get("penalty", 1.0)) != 1.0:
        why = ("with the penalty on, a small model's next words are hard to guess; text that repeats itself, as "
               "without the penalty, gives long drafts")
    elif float(settings.get("temperature", 0.0)) > 0.0:
        why = "a sampled token often differs from every draft; greedy decoding accepts more"
    else:
        why = "drafts come mostly from what the text said before, and this text seldom repeats it"
    return line + (" Auto verifies a draft only where it expects the accepted tokens to repay the extra rows, and "
                   "both sides are measured as the run goes: what extra rows cost is this machine's (the table "
                   f"above), and how often a draft is right is the text's ({why}).")


def speed_panel(trace: RunTrace) -> str:
    """Why the speedup is what it is: time per iteration against one AR step, the cost of verifying q
    nodes as this run measured it, tokens per iteration, and the ratio as arithmetic."""
    ts, ar = trace.tokenswift, trace.ar
    split = speed.mean_split(ts)
    if split is None:
        return "**Speed panel**: appears after TokenSwift's first iteration."
    ar_step = speed.step_ms(ar)
    ts_step = speed.step_ms(ts)
    ar_median = speed.median_step_ms(ar)  # one AR step's median: the cost table's and the drafting line's unit
    totals = ts.source_totals
    heads, grams, bonus = (totals.get(s, 0) for s in (Source.HEAD, Source.NGRAM, Source.BONUS))
    tokens = (f"**Tokens per iteration**: {ts.mean_accepted:.2f} = {(heads + grams) / ts.iterations:.2f} drafted "
              f"tokens accepted ({heads:,} from heads and {grams:,} from reused text in {ts.iterations:,} iterations) "
              f"+ {bonus / ts.iterations:.2f} bonus token (the target's own; one per iteration unless the token "
              "limit cut the last one).")
    lines = ["#### Why this speed: one TokenSwift iteration against one AR step",
             *_split_table(split, speed.mean_split(ar), ar_step), "",
             "**Verifying q drafted nodes on this machine** (this run's iterations; the verify forward grows with "
             "the number of rows):", "", *_cost_table(speed.verify_cost(ts), ar_median), "",
             tokens, "", _tree_line(trace), "", _ratio_line(trace, ts_step, ar_step)]
    little = _little_drafting_line(trace, ar_median)
    return "\n".join(lines + (["", little] if little else []))


# ---- what produced the views --------------------------------------------------------------------------------

def describe_run(settings: dict, max_new: int, model: str) -> str:
    """The settings that shape what the panes show, in a few words."""
    temperature = float(settings.get("temperature", 0.0))
    sampling = "greedy" if temperature == 0.0 else (
        f"sampling at T {temperature:g}, top-p {float(settings.get('top_p', 1.0)):g}, "
        f"min-p {float(settings.get('min_p', 0.0)):g}")
    penalty = float(settings.get("penalty", 1.0))
    parts = [f"model {model}", f"{max_new:,} new tokens", sampling,
             f"penalty θ {penalty:g} over {int(settings.get('penalty_window', 0)):,} tokens" if penalty != 1.0
             else "no penalty", f"tree {settings.get('tree', '')}"]
    if settings.get("tree") != "auto":
        parts.append(f"drafting {settings.get('draft', '')}, KV {settings.get('kv_mode', '')}")
    parts.append("token reuse on" if settings.get("ngram_reuse", True) else "token reuse off")
    return " · ".join(parts)


# ---- updates by output name --------------------------------------------------------------------------------

def text_update(trace: RunTrace, decode: Decode, greedy: bool, status: str,
                shown: dict[str, Shown] | None = None) -> dict:
    """The cheap part of a live update: both panes' text and stats, the summary and the status line. `shown`: how
    much of each pane the race display shows (default: everything)."""
    shown = shown or everything(trace)
    ar, ts = shown[Method.AR], shown[Method.TOKENSWIFT]
    return {
        "ar_text": pane_text(trace.ar, decode, ar.tokens), "ts_text": pane_text(trace.tokenswift, decode, ts.tokens),
        "ar_stats": pane_stats(trace.ar, trace.max_new_tokens, ar),
        "ts_stats": pane_stats(trace.tokenswift, trace.max_new_tokens, ts),
        "summary": summary(trace, greedy, shown), "status": status,
    }


def full_update(trace: RunTrace, decode: Decode, decode_one: DecodeOne, greedy: bool, status: str,
                shown: dict[str, Shown] | None = None) -> dict:
    """Everything the page shows for `trace`, keyed by output name (the layout maps names to components)."""
    out = text_update(trace, decode, greedy, status, shown)
    ar_tokens = None if shown is None else shown[Method.AR].tokens
    tree, accepted, kv, repetition = all_plots(trace, decode_one, ar_tokens)
    out.update(tree_plot=tree, accepted_plot=accepted, kv_plot=kv, repetition_plot=repetition,
               distinct=distinct_line(trace), speed=speed_panel(trace))
    return out


def cleared_step() -> dict:
    """The step view emptied and hidden (a Run, a replay or a lesson replaces what a Step showed)."""
    return {"step_view": STEP_VIEW_HIDDEN, "step_caption": "", "step_table": "",
            "step_tree": plots.placeholder_figure("Press Step", "Draft tree", 300)}


STEP_VIEW_HIDDEN = "hidden"  # the layout turns these two into the step view's visibility
STEP_VIEW_SHOWN = "shown"


def step_update(trace: RunTrace, decode: Decode, decode_one: DecodeOne, status: str) -> dict:
    """After one classroom Step: every view, with the step caption, its tree and the table of draft nodes; the
    TokenSwift pane shows the prompt's last words before the new tokens; AR says it does not run."""
    ts = trace.tokenswift
    out = full_update(trace, decode, decode_one, True, status)
    out.update(step_view=STEP_VIEW_SHOWN, step_caption=step_caption(ts, decode_one, trace.settings),
               step_table=table_html(step_rows(ts, decode_one, trace.settings)), step_tree=step_tree_figure(ts, decode_one),
               ts_text=pane_text(ts, decode, prompt_tail=prompt_tail(trace.prompt_ids, decode)),
               ts_stats=step_stats(ts, trace.max_new_tokens), summary=step_summary(trace),
               ar_stats="**AR** · not run in step mode (Step runs one TokenSwift iteration; Run compares both)",
               ar_text=placeholder_html("AR does not run in step mode: press Run to race both."))
    return out


def empty_update(message: str = "press Run (or Step)") -> dict:
    """Every view emptied: what a lesson or a case study shows until it runs (nothing from before it)."""
    return {"ar_text": placeholder_html(f"no tokens yet: {message}"), "ts_text": placeholder_html(f"no tokens yet: {message}"),
            "ar_stats": "**AR**", "ts_stats": "**TokenSwift**", "summary": "", "distinct": "", "speed": "",
            "tree_plot": plots.placeholder_figure("Run or Step to draw a draft tree", "Draft tree", 300),
            "accepted_plot": plots.placeholder_figure("No iterations yet", "Accepted per iteration", 300),
            "kv_plot": plots.placeholder_figure("No iterations yet", "KV cache", 300),
            "repetition_plot": plots.placeholder_figure("No tokens yet", "Repetition: 4-gram overlap between chunks", 300),
            **cleared_step()}
