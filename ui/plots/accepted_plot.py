"""Tokens accepted per iteration: over time (left) and as a histogram split by source (right)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokenswift.kinds import Method, Source
from tokenswift.serve.trace import MethodTrace

from .style import SOURCE_COLORS, SOURCE_LABELS, base_layout, bucket, placeholder_figure, rounded

HIST_SOURCES = (Source.HEAD, Source.NGRAM, Source.BONUS, Source.AR)  # stacking order; anything else is appended


def running_mean(values: list[float]) -> list[float]:
    """Cumulative mean: element i is the mean of values[: i + 1]."""
    out: list[float] = []
    total = 0.0
    for i, v in enumerate(values, start=1):
        total += v
        out.append(total / i)
    return out


def _titles(trace: MethodTrace) -> tuple[str, str]:
    """Title (with the overall mean) and subtitle (iterations and tokens per source)."""
    parts = [f"{SOURCE_LABELS.get(s, s)} {n:,}" for s, n in sorted(trace.source_totals.items(),
                                                                   key=lambda item: -item[1])]
    title = f"Accepted per iteration ({trace.method}): mean {trace.mean_accepted:.2f}"
    return title, f"{trace.iterations:,} iterations, {trace.generated:,} tokens: " + " · ".join(parts)


def accepted_figure(trace: MethodTrace, height: int = 340) -> go.Figure:
    """Accepted tokens per iteration with its running mean, and the histogram of accepted lengths."""
    if trace.iterations == 0:
        return placeholder_figure("No iterations yet", f"Accepted per iteration ({trace.method})", height)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.08,
                        subplot_titles=("tokens per iteration", "accepted length histogram"))
    fig.update_annotations(font_size=12)
    xs, ys = trace.accepted.points()
    mean_ys = running_mean(ys)
    bx, by = bucket(xs, ys)
    _, bmean = bucket(xs, mean_ys)
    color = SOURCE_COLORS[Source.AR] if trace.method == Method.AR else SOURCE_COLORS[Source.HEAD]
    fig.add_trace(go.Scatter(x=rounded(bx), y=rounded(by), mode="lines+markers", name="accepted",
                             line=dict(width=0.6, color=color), marker=dict(size=3, color=color), opacity=0.7,
                             hovertemplate="iteration %{x}<br>%{y:.2f} tokens<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=rounded(bx), y=rounded(bmean), mode="lines", name="running mean",
                             line=dict(width=2.5, color=SOURCE_COLORS[Source.BONUS]),
                             hovertemplate="iteration %{x}<br>mean %{y:.2f}<extra></extra>"), row=1, col=1)
    fig.add_hline(y=1.0, line=dict(color=SOURCE_COLORS[Source.AR], dash="dot", width=1.5), row=1, col=1,
                  annotation_text="AR = 1 token/iteration", annotation_position="bottom right",
                  annotation_font=dict(size=10, color=SOURCE_COLORS[Source.AR]))

    lengths = sorted(trace.length_hist)
    sources = [s for s in HIST_SOURCES if any(s in trace.length_hist[n] for n in lengths)]
    sources += sorted({s for n in lengths for s in trace.length_hist[n]} - set(sources))
    for source in sources:
        fig.add_trace(go.Bar(x=lengths, y=[trace.length_hist[n].get(source, 0) for n in lengths],
                             name=f"mostly {SOURCE_LABELS.get(source, source)}", meta="hist",
                             marker=dict(color=SOURCE_COLORS.get(source, SOURCE_COLORS["rejected"])),
                             hovertemplate="%{y} iterations accepted %{x}<extra>" + source + "</extra>"),
                      row=1, col=2)
    title, subtitle = _titles(trace)
    fig.update_layout(**base_layout(title, height, subtitle=subtitle, legend_rows=2, subplot_title_px=22))
    fig.update_layout(barmode="stack", bargap=0.15)
    fig.update_xaxes(title_text="iteration", row=1, col=1)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="tokens accepted (incl. bonus)", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="iterations", row=1, col=2)
    return fig
