"""The classroom step view: one TokenSwift iteration explained for a student, as pure functions of a trace.

A caption walks through the iteration's four phases (draft, verify, accept, KV update) as the engine ran them,
and a table gives one row per drafted node in reading order: the node (its token and who proposed it), the
token it follows and what the target drew there, the verdict that draw implies, and why, in one sentence.
The verdict and the draw it depends on are always in the same row. Nodes the walk never reached are counted
in one closing row rather than listed: a 100-node tree would otherwise bury the few rows that decide anything.
"""
from __future__ import annotations

import html
import re
from typing import Callable

from tokenswift.events import TreeNode
from tokenswift.kinds import KVMode, PartialMode, Source
from tokenswift.serve.trace import MethodTrace

from . import plots

DecodeOne = Callable[[int], str]

# The table's columns, in reading order; short headers that wrap only between words.
COLUMNS = ("node", "depth", "token", "proposed by", "after", "the target drew there", "target p of this token",
           "verdict", "why")
VERDICTS = {"start": "start", "accepted": "✓ accepted", "rejected": "✗ rejected", "cut": "✓ not emitted",
            "unreached": "not reached"}
PROPOSERS = {Source.ROOT: "(committed)", Source.HEAD: "a head", Source.NGRAM: "reused text"}
# Under tree="auto" the engine's "ngram" source also covers suffix matches and datastore continuations.
REUSED_TEXT = "reused text (the 4-gram table; under tree=auto also suffix matches and the datastore)"

_CONTROL = str.maketrans({"\n": "⏎", "\r": "␍", "\t": "⇥"})
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~])")


def token_text(decode_one: DecodeOne, token: int) -> str:
    """A token as the step table shows it: line breaks and tabs made visible."""
    return decode_one(token).translate(_CONTROL)


def token_md(decode_one: DecodeOne, token: int) -> str:
    """A token for a Markdown caption: visible line breaks, Markdown characters escaped (model text)."""
    return _MARKDOWN.sub(r"\\\1", token_text(decode_one, token))


def latest_tree(m: MethodTrace, pick: int | None = None) -> tuple[int | None, list[TreeNode], list[int]]:
    """(iteration, nodes, accepted token ids) of iteration `pick` if kept, else of the latest kept one."""
    if not m.trees:
        return None, [], []
    if pick is not None:
        for it, nodes, acc in m.trees:
            if it == pick:
                return it, nodes, acc
    return m.trees[-1]


def kept_iterations(m: MethodTrace) -> list[int]:
    """The iterations whose draft tree the trace keeps (the most recent ones)."""
    return [it for it, _, _ in m.trees]


def accepted_path(nodes: list[TreeNode]) -> list[int]:
    """The accepted drafted nodes (root excluded), shallow to deep."""
    return sorted((i for i, n in enumerate(nodes) if n.accepted and n.parent >= 0), key=lambda i: nodes[i].depth)


# ---- the caption -------------------------------------------------------------------------------------------

def _drafted(nodes: list[TreeNode]) -> str:
    heads = sum(1 for n in nodes if n.source == Source.HEAD)
    reused = len(nodes) - 1 - heads
    parts = [f"{heads} from the heads"] if heads else []
    if reused:
        parts.append(f"{reused} from reused text")
    count = len(nodes) - 1
    return f"the tree holds {count} drafted node{'s' if count != 1 else ''} ({', '.join(parts) or 'none'}; " \
           "equal prefixes merged)"


def _partial_held(m: MethodTrace) -> str:
    """What the partial cache holds now, against its budget ("23 of at most 1,024 positions")."""
    _, sink = m.partial_sink.points()
    _, selected = m.partial_selected.points()
    _, recent = m.partial_recent.points()
    held = int((sink[-1] if sink else 0) + (selected[-1] if selected else 0) + (recent[-1] if recent else 0))
    return f"holding {held:,} of at most {m.partial_budget:,} positions"


def _draft_caption(m: MethodTrace, it: int, nodes: list[TreeNode], settings: dict, root: str) -> str:
    """Step 1 as the engine ran it: m.partial_mode is what the engine reported ("fused", "full", "once",
    "dynamic", or "none" without heads); tree="auto" always drafts fused."""
    auto = settings.get("tree") == "auto"
    heads = any(n.source == Source.HEAD for n in nodes)
    if auto and len(nodes) == 1:
        return (f"1. **Draft (tree auto)**: nothing drafted — *{m.plan}*. No candidate was expected to pay for its "
                f"verification, so this iteration is an AR-cost step: one forward of «{root}» and the target's "
                "token.")
    plan = f" tree=auto kept only the candidates that pay on this machine: *{m.plan}*." if auto else ""
    proposed = "proposed the tokens after it" if heads else "proposed nothing this time (none of their guesses was kept)"
    mode = m.partial_mode
    if mode == PartialMode.FUSED and not (it == 0 and not auto):
        how = (f"no draft forward (fused drafting): the heads read the hidden state that the previous "
               f"verification pass left at the token before «{root}» and {proposed}; reused text continues "
               f"«{root}»; no partial KV cache is used")
    elif mode == PartialMode.FUSED:
        how = (f"fused drafting, first iteration: no verification pass yet for the heads to read, so one draft "
               f"forward of «{root}» over the full KV cache (fused drafting uses no partial cache)")
    elif mode == KVMode.FULL:
        how = (f"one draft forward of «{root}» over the full KV cache (kv_mode=full: no partial cache): the base "
               f"LM head (depth 1) and the extra heads (deeper) {proposed}")
    elif mode in (KVMode.ONCE, KVMode.DYNAMIC):
        how = (f"one draft forward of «{root}» over the partial KV cache ({mode}, {_partial_held(m)}): the base "
               f"LM head (depth 1) and the extra heads (deeper) {proposed}")
    else:
        how = f"no heads: only reused text that continues «{root}»"
    return f"1. **Draft**: {how}; {_drafted(nodes)}.{plan}"


def _accept_caption(nodes: list[TreeNode], acc: list[int], greedy: bool, decode_one: DecodeOne) -> str:
    path = accepted_path(nodes)
    bonus, emitted = plots.bonus_token(nodes, acc)
    rule = ("took the target's most likely token (greedy) at each visited node" if greedy else
            "drew one target token at each visited node")
    text = (f"3. **Accept**: the walk {rule} and went down to the child with that token, while there was one: "
            f"{len(path)} drafted token{'s' if len(path) != 1 else ''} accepted")
    shown = token_md(decode_one, bonus) if bonus is not None else "?"
    if emitted:
        return text + f", then the bonus «{shown}» (the target's own draw where the walk stopped)."
    return text + (f"; the run's end (its token limit, or an end-of-text token) cut the output after {len(acc)} of "
                   f"them, so the bonus «{shown}» was drawn but not emitted.")


def _kv_caption(m: MethodTrace) -> str:
    text = (f"4. **KV update**: the accepted path's K/V was moved into place in the full cache (now {m.cache_length:,} "
            "positions); the rest of the tree's slots were discarded")
    if m.partial_budget:
        return text + (f"; the partial cache took the new tokens into its recent tail (now {_partial_held(m)}; "
                       f"{len(m.refresh_at)} refreshes so far).")
    if m.partial_mode == PartialMode.FUSED:
        return text + "; the hidden state at the last accepted token is kept for the next iteration's heads."
    return text + "; there is no partial cache to update."


TABLE_NOTE = ("<em>proposed by</em> names who drafted a node, with its score when the tree was built (a head's "
              "softmax at temperature 1, or reused text's share of its counts: 1 for a suffix match); <em>target p</em> is the "
              "target's probability of the node's token where it was drawn, after the whole sampling chain "
              "(penalty, temperature, top-p, min-p). The two are not on the same scale.")


def step_caption(m: MethodTrace, decode_one: DecodeOne, settings: dict | None = None) -> str:
    """The four phases of the latest kept iteration, as Markdown."""
    settings = settings or {}
    it, nodes, acc = latest_tree(m)
    if not nodes:
        return "Press **Step** to run one TokenSwift iteration."
    greedy = float(settings.get("temperature", 0.0)) == 0.0
    return "\n".join([
        f"**Iteration {it}** (the tree plot beside shows the same iteration).",
        _draft_caption(m, it, nodes, settings, token_md(decode_one, nodes[0].token)),
        f"2. **Verify**: one forward of all {len(nodes)} nodes (the root and its drafts) over the full cache with "
        "tree attention gave the target's distribution at every node.",
        _accept_caption(nodes, acc, greedy, decode_one),
        _kv_caption(m),
    ])


# ---- the table ---------------------------------------------------------------------------------------------

def _verdict(i: int, nodes: list[TreeNode], cut: set[int]) -> str:
    n = nodes[i]
    if n.parent < 0:
        return "start"
    if nodes[n.parent].target_sample is None:
        return "unreached"
    if nodes[n.parent].target_sample == n.token:
        return "cut" if i in cut else "accepted"
    return "rejected"


def _why(i: int, nodes: list[TreeNode], verdict: str, greedy: bool, decode_one: DecodeOne, bonus_at: int) -> str:
    n = nodes[i]
    tok = f"«{token_text(decode_one, n.token)}»"
    drew = "took its most likely token" if greedy else "drew"
    if verdict == "start":
        there = ("" if n.target_sample is None else
                 f"; the target {drew} «{token_text(decode_one, n.target_sample)}» here")
        return f"The last committed token: the tree grows from it and the walk starts here{there}."
    parent = nodes[n.parent]
    at = f"At «{token_text(decode_one, parent.token)}» (node {n.parent})"
    sample = f"«{token_text(decode_one, parent.target_sample)}»" if parent.target_sample is not None else "?"
    if verdict == "accepted":
        return f"{at} the target {drew} {sample}, which is this node's token: accepted, and the walk goes on from here."
    if verdict == "cut":
        return (f"{at} the target {drew} {sample}, this node's token, but the run's token limit (or an end-of-text "
                "token) ended the output first.")
    if verdict == "rejected":
        end = (f" No child of node {n.parent} matched, so {sample} is the bonus token and the iteration ends there."
               if n.parent == bonus_at else " The walk follows the child that matches the draw instead.")
        return f"{at} the target {drew} {sample}, not {tok}: rejected.{end}"
    return "Not reached: an ancestor was rejected, so the walk never came here."


def _proposer(n: TreeNode) -> str:
    if n.source == Source.ROOT:
        return PROPOSERS[Source.ROOT]
    name = PROPOSERS.get(n.source, str(n.source))
    if n.source == Source.HEAD:
        name = "LM head" if n.depth == 1 else f"head {n.depth - 1}"
    return f"{name} ({n.draft_prob:.2f})"


def step_rows(m: MethodTrace, decode_one: DecodeOne, settings: dict | None = None) -> list[list]:
    """One row per node in reading order (root, then by depth, accepted first), each as COLUMNS; nodes the walk
    never reached are summed up in one closing row."""
    settings = settings or {}
    _, nodes, acc = latest_tree(m)
    if not nodes:
        return []
    greedy = float(settings.get("temperature", 0.0)) == 0.0
    path = accepted_path(nodes)
    cut = set(path[len(acc):])  # accepted, but past the run's token limit
    bonus_at = path[-1] if path else 0  # the deepest accepted node (or the root): the bonus is drawn there
    verdicts = [_verdict(i, nodes, cut) for i in range(len(nodes))]
    order = sorted(range(len(nodes)), key=lambda i: (nodes[i].depth, verdicts[i] not in ("accepted", "cut"), i))
    rows, unreached = [], 0
    for i in order:
        n, verdict = nodes[i], verdicts[i]
        if verdict == "unreached":
            unreached += 1
            continue
        parent = nodes[n.parent] if n.parent >= 0 else None
        draw = parent.target_sample if parent is not None else None
        rows.append([i, n.depth, token_text(decode_one, n.token), _proposer(n),
                     "" if parent is None else f"«{token_text(decode_one, parent.token)}» (node {n.parent})",
                     "" if draw is None else token_text(decode_one, draw),
                     "" if n.target_prob is None else f"{n.target_prob:.3f}",
                     VERDICTS[verdict], _why(i, nodes, verdict, greedy, decode_one, bonus_at)])
    if unreached:
        rows.append(["…", "", "", "", "", "", "", VERDICTS["unreached"],
                     f"{unreached} more node{'s' if unreached != 1 else ''} not reached: each has a rejected "
                     "ancestor, so the walk never came to them (the tree plot shows them in grey)."])
    return rows


def step_explanation(m: MethodTrace, decode_one: DecodeOne, settings: dict | None = None) -> tuple[str, list[list]]:
    """The caption (Markdown) and the table's rows for the latest kept iteration."""
    return step_caption(m, decode_one, settings), step_rows(m, decode_one, settings)


def table_html(rows: list[list]) -> str:
    """The rows as an HTML table (escaped: tokens are model text); verdicts classed for their colour."""
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = []
    for row in rows:
        verdict = next((k for k, v in VERDICTS.items() if v == row[7]), "")
        cells = "".join(f'<td class="c-{k}">{html.escape(str(v))}</td>' for k, v in enumerate(row))
        body.append(f'<tr class="v-{verdict}">{cells}</tr>')
    return (f'<table class="step-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            f'<p class="table-note">{TABLE_NOTE}</p>')  # our own text
