"""One iteration's draft tree: what was proposed, by whom, and which path the target accepted.

x is the depth (position after the root), y a tidy layout (each leaf its own row, parents centred over
their children). The bonus token, sampled by the target after the accepted path, is laid out as an extra
child of the last accepted node, drawn as a star on a dashed edge.
"""
from __future__ import annotations

from typing import Callable

import plotly.graph_objects as go

from tokenswift.events import TreeNode
from tokenswift.kinds import Source

from .style import SOURCE_COLORS, base_layout, blend, color_for, placeholder_figure, rounded

LABEL_CHARS = 10
HOVER_CHARS = 40
BONUS = -2  # index of the bonus token in the layout (not a tree node)

_VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}


def token_label(text: str, limit: int = LABEL_CHARS) -> str:
    """Token text with whitespace made visible and other control characters escaped, cut to `limit`."""
    shown = "".join(_VISIBLE.get(ch, ch if ch.isprintable() else repr(ch)[1:-1]) for ch in text)
    if not shown:
        shown = "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _children(nodes: list[TreeNode]) -> tuple[list[int], list[list[int]]]:
    """Roots (normally just node 0) and each node's children, in node order."""
    children: list[list[int]] = [[] for _ in nodes]
    roots: list[int] = []
    for i, node in enumerate(nodes):
        if 0 <= node.parent < len(nodes) and node.parent != i:
            children[node.parent].append(i)
        else:
            roots.append(i)
    return roots, children


def _tidy_rows(roots: list[int], children: dict[int, list[int]]) -> dict[int, float]:
    """y of every node: leaves take consecutive rows (top to bottom), parents sit centred over them."""
    y: dict[int, float] = {}
    next_row = 0
    # Iterative post-order: (node, expanded?)
    stack: list[tuple[int, bool]] = [(r, False) for r in reversed(roots)]
    seen: set[int] = set()
    while stack:
        node, expanded = stack.pop()
        kids = children.get(node, [])
        if expanded:
            y[node] = (y[kids[0]] + y[kids[-1]]) / 2
            continue
        if node in seen:  # malformed input (a cycle): lay each node out once
            continue
        seen.add(node)
        kids = [k for k in kids if k not in seen]
        children[node] = kids
        if not kids:
            y[node] = -float(next_row)
            next_row += 1
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in reversed(kids))
    return y


def _hover_data(node: TreeNode, decode: Callable[[int], str]) -> list[object]:
    """[id, draft p, target p, target sample] for the hover template ("–" where unknown)."""
    target_p: object = "–" if node.target_prob is None else round(node.target_prob, 3)
    sample = "–" if node.target_sample is None else _html(token_label(decode(node.target_sample)))
    return [node.token, round(node.draft_prob, 3), target_p, sample]


def _hover_template(source: str, accepted: bool) -> str:
    return ("<b>%{text}</b>  id %{customdata[0]}<br>depth %{x} · " + source +
            "<br>draft p %{customdata[1]} · target p %{customdata[2]}<br>target drew %{customdata[3]}<br>" +
            ("accepted" if accepted else "rejected") + "<extra></extra>")


def _group(node: TreeNode) -> str:
    if node.source == Source.HEAD:
        return f"head{min(max(node.depth, 1), 4)}"
    return node.source


def _judged(nodes: list[TreeNode], i: int) -> bool:
    """Whether the walk judged node i: the root, or a child of a node where the target drew."""
    parent = nodes[i].parent
    return not 0 <= parent < len(nodes) or nodes[parent].target_sample is not None


def bonus_token(nodes: list[TreeNode], accepted_tokens: list[int]) -> tuple[int | None, bool]:
    """The target's own token after the accepted path, and whether the step emitted it.

    It is the target's sample at the deepest accepted node. A step cut short by the run's token limit
    emits fewer tokens than the accepted path plus one: its last emitted token is then a drafted one, not
    the bonus (which was drawn but not emitted)."""
    path = [i for i, n in enumerate(nodes) if n.accepted and n.parent >= 0]
    last = max(path, key=lambda i: nodes[i].depth) if path else 0  # node 0: the root
    if len(accepted_tokens) > len(path):
        return accepted_tokens[len(path)], True
    return (nodes[last].target_sample if nodes else None), False


_GROUP_NAMES = {Source.ROOT: "root token", "head1": "LM head (d1)", "head2": "head d2", "head3": "head d3",
                "head4": "head d4", Source.NGRAM: "reused text"}


def draft_tree_figure(nodes: list[TreeNode], accepted_tokens: list[int], decode: Callable[[int], str],
                      iteration: int | None = None, height: int | None = None, visited_labels: bool = False) -> go.Figure:
    """The draft tree of one iteration (`Step.tree`) with its accepted path and bonus token.

    `accepted_tokens` is the step's accepted token ids; its last element is the bonus token. `decode`
    turns one token id into text. `height` defaults to one that gives every leaf row room for a label.
    `visited_labels`: label only the nodes the walk judged (the root and the children of visited nodes), the
    rows of the step table; the rest stay unlabelled dots, so a big tree fits a smaller height.
    """
    title_prefix = "Draft tree" if iteration is None else f"Draft tree, iteration {iteration}"
    if not nodes:
        return placeholder_figure("No draft tree yet", title_prefix, height or 300)

    roots, children_lists = _children(nodes)
    children = {i: list(kids) for i, kids in enumerate(children_lists)}
    accepted_nodes = [i for i, n in enumerate(nodes) if n.accepted and i not in roots]
    last = max(accepted_nodes, key=lambda i: nodes[i].depth) if accepted_nodes else (roots[0] if roots else 0)
    bonus, emitted = bonus_token(nodes, accepted_tokens)
    has_bonus = bonus is not None
    if has_bonus:  # the bonus is the first child of the last accepted node, so it gets its own row
        children[last] = [BONUS] + children[last]
    y = _tidy_rows(roots, children)
    x = {i: n.depth for i, n in enumerate(nodes)}
    if has_bonus:
        x[BONUS] = x.get(last, 0) + 1

    # Edges: rejected (thin grey), accepted path (thick), bonus (dashed).
    rej_x: list[int | None] = []
    rej_y: list[float | None] = []
    acc_x: list[int | None] = []
    acc_y: list[float | None] = []
    for i, node in enumerate(nodes):
        if i in roots or i not in y or node.parent not in y:
            continue
        seg_x, seg_y = [x[node.parent], x[i], None], [y[node.parent], y[i], None]
        if node.accepted and nodes[node.parent].accepted:
            acc_x += seg_x
            acc_y += seg_y
        else:
            rej_x += seg_x
            rej_y += seg_y
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=rej_x, y=rounded(rej_y, 2), mode="lines", name="rejected edges", meta="edges-rejected",
                             line=dict(color=SOURCE_COLORS["rejected"], width=1), hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Scatter(x=acc_x, y=rounded(acc_y, 2), mode="lines", name="accepted path", meta="edges-accepted",
                             line=dict(color=SOURCE_COLORS[Source.HEAD], width=4), hoverinfo="skip", showlegend=False))

    # Nodes: one trace per source group and status (accepted / rejected), so styles stay scalars.
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, node in enumerate(nodes):
        if i in y:
            groups.setdefault((_group(node), node.accepted), []).append(i)
    order = [Source.ROOT, "head1", "head2", "head3", "head4", Source.NGRAM]
    legend_done: set[str] = set()
    rank = {group: i for i, group in enumerate(order)}
    # Rejected nodes first, the accepted path last: its labels are drawn on top of any they would overlap.
    for group, accepted in sorted(groups, key=lambda key: (key[1], rank.get(key[0], len(order)))):
        idx = groups[(group, accepted)]
        color = SOURCE_COLORS[Source.ROOT] if group == Source.ROOT else color_for(nodes[idx[0]].source, nodes[idx[0]].depth)
        if group not in legend_done:  # one legend entry per group, in its full colour
            legend_done.add(group)
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=_GROUP_NAMES.get(group, group),
                                     legendgroup=group, marker=dict(size=10, color=color), meta="legend"))
        fig.add_trace(go.Scatter(
            x=[x[i] for i in idx], y=rounded([y[i] for i in idx], 2), mode="markers+text", meta="nodes",
            name=_GROUP_NAMES.get(group, group), legendgroup=group, showlegend=False,
            marker=dict(size=13, color=color, line=dict(width=3, color="#111111")) if accepted else
            dict(size=9, color=blend(color, SOURCE_COLORS["rejected"], 0.5), opacity=0.6,
                 line=dict(width=0.5, color="#ffffff")),
            text=[_html(token_label(decode(nodes[i].token))) if not visited_labels or _judged(nodes, i) else ""
                  for i in idx], textposition="middle right",
            textfont=dict(size=13, color="#111111", weight="bold", shadow="auto") if accepted else
            dict(size=11, color="#555555"),
            customdata=[_hover_data(nodes[i], decode) for i in idx],
            hovertemplate=_hover_template(nodes[idx[0]].source, accepted),
        ))

    if has_bonus:
        fig.add_trace(go.Scatter(x=[x[last], x[BONUS]], y=rounded([y[last], y[BONUS]], 2), mode="lines",
                                 line=dict(color=SOURCE_COLORS[Source.BONUS], width=2, dash="dash"),
                                 hoverinfo="skip", showlegend=False, name="bonus edge", meta="bonus-edge"))
        fig.add_trace(go.Scatter(
            x=[x[BONUS]], y=rounded([y[BONUS]], 2), mode="markers+text", name="bonus (target sample)",
            meta=Source.BONUS, marker=dict(symbol="star" if emitted else "star-open", size=18, color=SOURCE_COLORS[Source.BONUS],
                                      line=dict(width=1, color="#111111")),
            text=[_html(token_label(decode(bonus))) + ("" if emitted else " (not emitted)")],
            textposition="middle right", textfont=dict(size=13, color="#111111", weight="bold", shadow="auto"),
            hovertext=[f"<b>{_html(token_label(decode(bonus), HOVER_CHARS))}</b>  id {bonus}<br>"
                       "bonus: the target's own sample after the accepted path" +
                       ("" if emitted else "<br>not emitted: the run's token limit came first")], hoverinfo="text",
        ))

    drafted_accepted = len(accepted_nodes)
    title = f"{title_prefix}: {len(nodes)} nodes, {drafted_accepted} accepted"
    if has_bonus:
        title += " + bonus" if emitted else f" (token limit: {len(accepted_tokens)} emitted, no bonus)"
    leaves = sum(1 for kids in children.values() if not kids)
    fig.update_layout(**base_layout(title, height or max(320, min(1600, 130 + 17 * leaves)), legend_rows=1))
    max_x = max(x.values())
    fig.update_xaxes(title_text="depth", range=[-0.3, max_x + 0.9], dtick=1, showgrid=False, zeroline=False)
    fig.update_yaxes(visible=False, range=[min(y.values()) - 0.8, max(y.values()) + 0.8])
    return fig
