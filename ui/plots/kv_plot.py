"""The KV caches: the full cache growing, the partial (drafting) cache's budget split, and which
positions the partial cache holds right now."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokenswift.serve.trace import MethodTrace

from .style import (CACHE_COLORS, SMOOTH_POINTS, add_note, base_layout, blend, bucket, placeholder_figure, rounded,
                    thin)

STRIP_BINS = 200
MAX_TICKS = 200  # refresh markers: more cannot be told apart at this width
NOTES = {"full": "drafting reads the full cache", "none": "no partial cache (AR)",
         "fused": "no partial cache: fused drafting (tree=auto always) reads the verification pass"}


def held_strip(trace: MethodTrace, bins: int = STRIP_BINS) -> dict[str, list[float]]:
    """Per bin of positions 0..trace.cache_length: the fraction held as "sink", "selected" and "recent".

    Sink and selected come from `trace.held_runs` (the last refresh): held positions below the sink
    size are the sink; the recent tail is the last `trace.partial_recent_now()` positions.
    Returns {"edges": bin edges (bins + 1), "sink": [...], "selected": [...], "recent": [...]}.
    """
    length = trace.cache_length
    n_bins = max(1, min(bins, length))
    edges = [round(i * length / n_bins) for i in range(n_bins + 1)]
    _, sinks = trace.partial_sink.points()
    sink_size = int(sinks[-1]) if sinks else 0
    if not sink_size and trace.held_runs and trace.held_runs[0][0] == 0:
        sink_size = trace.held_runs[0][1]
    recent = min(trace.partial_recent_now(), length)
    sink_runs = [(s, min(e, sink_size)) for s, e in trace.held_runs if s < sink_size]
    selected_runs = [(max(s, sink_size), e) for s, e in trace.held_runs if e > sink_size]
    out: dict[str, list[float]] = {"edges": [float(e) for e in edges]}
    for name, runs in (("sink", sink_runs), ("selected", selected_runs), ("recent", [(length - recent, length)])):
        out[name] = _bin_fractions(runs, edges)
    return out


def _bin_fractions(runs: list[tuple[int, int]], edges: list[int]) -> list[float]:
    """The fraction of each bin [edges[i], edges[i+1]) covered by the [start, end) runs."""
    counts = [0] * (len(edges) - 1)
    last = edges[-1]
    for start, end in runs:
        start, end = max(start, 0), min(end, last)
        if end <= start:
            continue
        i = _bin_of(start, edges)
        while i < len(counts) and edges[i] < end:
            counts[i] += min(end, edges[i + 1]) - max(start, edges[i])
            i += 1
    return [c / (edges[i + 1] - edges[i]) if edges[i + 1] > edges[i] else 0.0 for i, c in enumerate(counts)]


def _bin_of(position: int, edges: list[int]) -> int:
    lo, hi = 0, len(edges) - 2
    while lo < hi:  # last bin whose left edge <= position
        mid = (lo + hi + 1) // 2
        if edges[mid] <= position:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _add_strip(fig: go.Figure, trace: MethodTrace, row: int) -> None:
    strip = held_strip(trace)
    edges = strip["edges"]
    n_bins = len(edges) - 1
    width = edges[-1] / n_bins if n_bins else 1.0
    parts = ("sink", "selected", "recent")
    total = [sum(strip[p][i] for p in parts) for i in range(n_bins)]
    # Positions not held show the background; each held bin is drawn in the colour of the part holding
    # most of it, as dark as the fraction held.
    fig.add_shape(type="rect", x0=0, x1=max(edges[-1], 1), y0=-0.5, y1=0.5, layer="below", line_width=0,
                  fillcolor=CACHE_COLORS["empty"], row=row, col=1)
    dominant = [max(parts, key=lambda p: strip[p][i]) if total[i] > 0 else None for i in range(n_bins)]
    for part in parts:
        z = rounded([min(total[i], 1.0) if dominant[i] == part else None for i in range(n_bins)], 2)
        color = CACHE_COLORS[part]
        fig.add_trace(go.Heatmap(x0=round(width / 2, 2), dx=round(width, 3), y=[0], z=[z], zmin=0, zmax=1,
                                 meta=f"strip-{part}", name=part, showscale=False,
                                 colorscale=[[0, blend(color, "#ffffff", 0.8)], [1, color]],
                                 hovertemplate="position ≈%{x:.0f}<br>held %{z:.0%}<extra>" + part + "</extra>"),
                      row=row, col=1)
    fig.update_xaxes(title_text="position in the full cache", range=[0, max(edges[-1], 1)], row=row, col=1)
    fig.update_yaxes(visible=False, range=[-0.5, 0.5], row=row, col=1)


def _strip_title(trace: MethodTrace) -> str:
    held: dict[str, int] = {}
    for part, series in (("sink", trace.partial_sink), ("selected", trace.partial_selected),
                         ("recent", trace.partial_recent)):
        _, ys = series.points()
        held[part] = int(ys[-1]) if ys else 0
    words = " · ".join(f"<span style='color:{CACHE_COLORS[p]}'>{p} {n:,}</span>" for p, n in held.items())
    return f"held now: {words} of {trace.cache_length:,} positions"


def kv_figure(trace: MethodTrace, height: int = 520) -> go.Figure:
    """Full cache length (and MB) over generated tokens; the partial cache's sink / selected / recent
    split against its budget with refresh ticks; a strip of the positions the partial cache holds."""
    if trace.iterations == 0:
        return placeholder_figure("No iterations yet", f"KV cache ({trace.method})", height)
    partial = trace.partial_mode not in NOTES and trace.partial_budget > 0
    budget_title = (f"partial (drafting) cache, {trace.partial_mode}: budget {trace.partial_budget:,}, "
                    "over generated tokens") if partial else ""
    fig = make_subplots(rows=3, cols=1, row_heights=[0.42, 0.42, 0.16], vertical_spacing=0.1,
                        specs=[[{"secondary_y": True}], [{}], [{}]],
                        subplot_titles=("full KV cache (positions, MB) over generated tokens", budget_title,
                                        _strip_title(trace) if partial else ""))
    fig.update_annotations(font_size=12)

    xs, lengths = bucket(*trace.cache_len.points(), max_points=SMOOTH_POINTS)
    mx, mbs = bucket(*trace.cache_mb.points(), max_points=SMOOTH_POINTS)
    fig.add_trace(go.Scatter(x=rounded(xs), y=rounded(lengths, 0), mode="lines", name="cache length",
                             line=dict(color=CACHE_COLORS["full"], width=2),
                             hovertemplate="%{x} generated<br>%{y:,} positions<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=rounded(mx), y=rounded(mbs, 1), mode="lines", name="MB",
                             line=dict(color=CACHE_COLORS["full"], width=1, dash="dot"),
                             hovertemplate="%{x} generated<br>%{y:.1f} MB<extra></extra>"),
                  row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="positions", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="MB", rangemode="tozero", showgrid=False, row=1, col=1, secondary_y=True)

    if partial:
        for part, series in (("sink", trace.partial_sink), ("selected", trace.partial_selected),
                             ("recent", trace.partial_recent)):
            px, py = bucket(*series.points(), max_points=SMOOTH_POINTS)
            fig.add_trace(go.Scatter(x=rounded(px), y=rounded(py, 1), mode="lines", name=part, meta=f"partial-{part}",
                                     stackgroup="partial", line=dict(width=0.5, color=CACHE_COLORS[part]),
                                     hovertemplate="%{x} generated<br>%{y:,.0f} " + part + "<extra></extra>"),
                          row=2, col=1)
        end = xs[-1] if xs else 0
        fig.add_trace(go.Scatter(x=[0, end], y=[trace.partial_budget] * 2, mode="lines", name="budget",
                                 line=dict(color=CACHE_COLORS["budget"], dash="dash", width=1.5), meta="budget",
                                 hoverinfo="skip"), row=2, col=1)
        ticks = thin(trace.refresh_at, MAX_TICKS)
        fig.add_trace(go.Scatter(x=ticks, y=[trace.partial_budget] * len(ticks), mode="markers", meta="refresh",
                                 name=f"refresh ({len(trace.refresh_at):,})",
                                 marker=dict(symbol="line-ns-open", size=12, color="#333333", line=dict(width=1.5)),
                                 hovertemplate="refresh at %{x} generated<extra></extra>"), row=2, col=1)
        fig.update_yaxes(title_text="positions", rangemode="tozero", row=2, col=1)
        fig.update_xaxes(matches="x", row=2, col=1)
        _add_strip(fig, trace, row=3)
    else:
        add_note(fig, NOTES.get(trace.partial_mode, "no partial cache"), row=2)
        add_note(fig, "", row=3)

    _, raw_mbs = trace.cache_mb.points()
    mb_now = raw_mbs[-1] if raw_mbs else 0.0
    title = f"KV cache ({trace.method}): {trace.cache_length:,} positions, {mb_now:.1f} MB"
    held = sum(int(s.points()[1][-1]) if s.points()[1] else 0
               for s in (trace.partial_sink, trace.partial_selected, trace.partial_recent))
    subtitle = (f"drafting reads {held:,} of them (budget {trace.partial_budget:,}) · {len(trace.refresh_at):,} refreshes"
                if partial else NOTES.get(trace.partial_mode, ""))
    fig.update_layout(**base_layout(title, height, subtitle=subtitle, legend_rows=2 if partial else 1,
                                    subplot_title_px=22))
    return fig
