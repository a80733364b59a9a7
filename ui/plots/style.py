"""Shared look of every plot: one colour per token source, a compact layout, and small helpers.

Every figure is resent to the browser as JSON on each update, so the helpers here keep figures small:
a slim copy of the `plotly_white` template (its per-trace-type defaults alone are ~4 KB per figure),
rounded numbers and bucketed series of at most `MAX_POINTS` points.
"""
from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from tokenswift.kinds import Source

MAX_POINTS = 500  # per trace
SMOOTH_POINTS = 300  # for slowly varying curves (cache sizes), where more points show nothing new

# One colour per source, used everywhere in the app (text highlighting, legends, trees, bars).
SOURCE_COLORS: dict[str, str] = {
    Source.ROOT: "#2b2d42",  # the last accepted token a tree grows from
    Source.HEAD: "#1d4e89",  # depth 1: the base LM head of the draft pass
    "head2": "#3a75c4",  # extra heads (depth 2..4): lighter shades of the same blue
    "head3": "#6b9bd8",
    "head4": "#9dbfe8",
    Source.NGRAM: "#9b3fa6",  # reused n-gram branches
    Source.BONUS: "#d4a017",  # the target's own sample at the end of the accepted path
    Source.AR: "#7a8ca3",  # plain autoregressive step
    "rejected": "#c8c8c8",
}
REPEAT_COLOR = "#d62728"  # verbatim repeated spans (the panes' underline; see repetition.REPEAT_MIN_TOKENS)
# The partial KV cache's parts.
CACHE_COLORS: dict[str, str] = {
    "full": "#4a5568",
    "sink": "#c0392b",
    "selected": "#2a7f62",
    "recent": "#e67e22",
    "budget": "#555555",
    "empty": "#eeeeee",
}
SOURCE_LABELS: dict[str, str] = {
    Source.ROOT: Source.ROOT,
    Source.HEAD: "heads",
    Source.NGRAM: "reused text",
    Source.BONUS: Source.BONUS,
    Source.AR: "AR",
}


def color_for(source: str, depth: int = 1) -> str:
    """The colour of a token from `source` at tree `depth` ("head" gets a shade per depth, 1..4)."""
    if source == Source.HEAD:
        depth = min(max(depth, 1), 4)
        return SOURCE_COLORS[Source.HEAD] if depth == 1 else SOURCE_COLORS[f"head{depth}"]
    return SOURCE_COLORS.get(source, SOURCE_COLORS["rejected"])


def blend(color: str, other: str = "#ffffff", amount: float = 0.5) -> str:
    """`color` moved `amount` of the way towards `other` (both "#rrggbb")."""
    a = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(x + (y - x) * amount) for x, y in zip(a, b)]
    return "#" + "".join(f"{v:02x}" for v in mixed)


def _slim_template() -> go.layout.Template:
    """plotly_white's layout without the parts these 2-D plots never use."""
    layout = pio.templates["plotly_white"].layout.to_plotly_json()
    for key in ("polar", "ternary", "scene", "geo", "colorscale"):
        layout.pop(key, None)
    return go.layout.Template(layout=layout)


TEMPLATE = _slim_template()


def base_layout(title: str, height: int = 360, *, subtitle: str = "", legend_rows: int = 1,
                subplot_title_px: int = 0) -> dict[str, Any]:
    """Layout settings shared by every figure: `fig.update_layout(**base_layout(title, height))`.

    The top margin stacks, from the top: the title (and an optional smaller subtitle line), the legend
    (`legend_rows` rows, horizontal) and room for subplot titles (`subplot_title_px`, e.g. 22 per line).
    """
    text = title if not subtitle else f"{title}<br><span style='font-size:11px;color:#666666'>{subtitle}</span>"
    title_px = 26 + (22 if subtitle else 0)
    gap = subplot_title_px + 6
    top = title_px + 20 * legend_rows + gap
    bottom = 40
    plot_px = max(height - top - bottom, 60)
    return dict(
        # plotly.js anchors a two-line title by its first line: move it down by one line.
        title=dict(text=text, x=0.01, xanchor="left", y=1 - (18 if subtitle else 6) / height, yanchor="top",
                   font=dict(size=14)),
        height=height,
        template=TEMPLATE,
        margin=dict(l=55, r=20, t=top, b=bottom),
        legend=dict(orientation="h", yanchor="bottom", y=1 + gap / plot_px, xanchor="left", x=0,
                    font=dict(size=11), traceorder="normal"),
        font=dict(size=11),
        hoverlabel=dict(font=dict(size=11)),
    )


def placeholder_figure(message: str, title: str = "", height: int = 300) -> go.Figure:
    """An empty figure with `message` centred in it."""
    fig = go.Figure()
    fig.update_layout(**base_layout(title, height))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#888888"))
    return fig


def add_note(fig: go.Figure, message: str, row: int, col: int = 1) -> None:
    """A centred note in one subplot of `fig` (a `make_subplots` figure), whose axes are hidden."""
    fig.update_xaxes(visible=False, row=row, col=col)
    fig.update_yaxes(visible=False, row=row, col=col)
    if not message:
        return
    subplot = fig.get_subplot(row, col)  # paper coordinates: an empty subplot's axes may not be drawn
    x0, x1 = subplot.xaxis.domain
    y0, y1 = subplot.yaxis.domain
    fig.add_annotation(text=message, x=(x0 + x1) / 2, y=(y0 + y1) / 2, xref="paper", yref="paper",
                       showarrow=False, font=dict(size=12, color="#888888"))


def rounded(values: list[float | None], digits: int = 3) -> list[float | None]:
    """Values rounded for compact JSON (whole numbers written as integers; None kept)."""
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        r = round(float(v), digits)
        out.append(int(r) if r.is_integer() else r)
    return out


def bucket(xs: list[float], ys: list[float], max_points: int = MAX_POINTS,
           reduce: str = "mean") -> tuple[list[float], list[float]]:
    """At most `max_points` points: consecutive points merged (x: the bucket's last x; y: mean or max)."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    size = math.ceil(n / max_points)
    bx: list[float] = []
    by: list[float] = []
    for start in range(0, n, size):
        chunk = ys[start : start + size]
        bx.append(xs[min(start + size, n) - 1])
        by.append(max(chunk) if reduce == "max" else sum(chunk) / len(chunk))
    return bx, by


def thin(values: list[float], max_points: int = MAX_POINTS) -> list[float]:
    """Every k-th value so that at most `max_points` remain (the last one always kept)."""
    if len(values) <= max_points:
        return list(values)
    step = math.ceil(len(values) / max_points)
    picked = list(values[::step])
    if picked[-1] != values[-1]:
        picked[-1] = values[-1]
    return picked
