"""Repetition in long generations: Distinct-n, chunk-by-chunk n-gram overlap (the paper's case study)
and verbatim repeated spans. The metrics are pure functions of token-id lists."""
from __future__ import annotations

import math
from collections import Counter

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import add_note, base_layout, placeholder_figure, rounded

NGRAM_ORDERS = (1, 2, 3, 4)
OVERLAP_COLORSCALE = "Viridis"
# A "repeated span", for the panes and the plots alike: a verbatim copy of an earlier run of at least this
# many tokens (about 8-9 words: common phrases stay unmarked, copied sentences do not).
REPEAT_MIN_TOKENS = 12
TARGET_CHUNKS = 20  # the heatmap's chunks per side, about (fewer for long runs, more below 500 tokens)
MIN_CHUNK = 25  # tokens: a chunk still holds ~20 4-grams
_NICE = (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8)  # chunk sizes are these x 10^k, so the axis reads well


def _ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)] if n > 0 else []


def distinct_n(tokens: list[int], n: int) -> float:
    """Unique n-grams / total n-grams (0.0 when the sequence has no n-gram)."""
    grams = _ngrams(tokens, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def distinct_all(tokens: list[int]) -> dict[int, float]:
    """Distinct-n for n = 1..4."""
    return {n: distinct_n(tokens, n) for n in NGRAM_ORDERS}


def chunk_size_for(length: int) -> int:
    """Chunk size for a run of `length` tokens: a round number >= MIN_CHUNK giving about TARGET_CHUNKS
    chunks (300 tokens: 12 chunks of 25; 500: 20 of 25; 20,000: 20 of 1,000)."""
    wanted = max(MIN_CHUNK, length / TARGET_CHUNKS)
    scale = 10 ** math.floor(math.log10(wanted))
    return next(round(m * scale) for m in (*_NICE, 10) if round(m * scale) >= wanted)


def chunk_bounds(length: int, chunk_size: int, max_chunks: int = 40) -> list[tuple[int, int]]:
    """[start, end) of consecutive chunks of `chunk_size` tokens (the last one may be shorter); the chunk
    size grows when needed so that there are at most `max_chunks` chunks."""
    if length <= 0:
        return []
    size = max(1, chunk_size, math.ceil(length / max(1, max_chunks)))
    return [(start, min(start + size, length)) for start in range(0, length, size)]


def chunk_overlap_matrix(tokens: list[int], chunk_size: int, n: int = 4, max_chunks: int = 40) -> list[list[float]]:
    """M[i][j]: the fraction of chunk i's n-grams (occurrences) that also occur in chunk j.

    Chunks as in `chunk_bounds`; n-grams do not cross chunk borders. The diagonal is 1.0 for every chunk
    with at least one n-gram; a chunk shorter than n has a row of 0.0.
    """
    bounds = chunk_bounds(len(tokens), chunk_size, max_chunks)
    counts = [Counter(_ngrams(tokens[start:end], n)) for start, end in bounds]
    matrix: list[list[float]] = []
    for counts_i in counts:
        total = sum(counts_i.values())
        row = []
        for counts_j in counts:
            if not total:
                row.append(0.0)
                continue
            smaller, larger = (counts_i, counts_j) if len(counts_i) <= len(counts_j) else (counts_j, counts_i)
            shared = sum(counts_i[g] for g in smaller if g in larger)
            row.append(shared / total)
        matrix.append(row)
    return matrix


def repeated_spans(tokens: list[int], min_len: int = REPEAT_MIN_TOKENS,
                   lookback: int | None = None) -> list[tuple[int, int]]:
    """[start, end) spans of `tokens` that repeat verbatim an earlier occurrence of >= `min_len` tokens.

    The earlier occurrence starts before the span (it may overlap it, as in a loop) and, when `lookback`
    is given, at most `lookback` tokens before it. Found by hashing `min_len`-grams and extending the
    match greedily; overlapping and adjacent spans are merged. Linear time in practice.
    """
    if min_len < 1 or len(tokens) <= min_len:
        return []
    candidates_kept = 4  # earlier starts remembered per min_len-gram; the longest extension wins
    seen: dict[tuple[int, ...], list[int]] = {}
    spans: list[tuple[int, int]] = []
    inserted = 0  # starts < inserted are in `seen`
    last_start = len(tokens) - min_len
    i = 0
    while i <= last_start:
        while inserted < i:
            starts = seen.setdefault(tuple(tokens[inserted : inserted + min_len]), [])
            starts.append(inserted)
            if len(starts) > candidates_kept:
                del starts[0]
            inserted += 1
        best = 0
        for j in seen.get(tuple(tokens[i : i + min_len]), ()):
            if lookback is not None and i - j > lookback:
                continue
            k = min_len
            while i + k < len(tokens) and tokens[j + k] == tokens[i + k]:
                k += 1
            best = max(best, k)
        if not best:
            i += 1
            continue
        end = i + best
        if spans and spans[-1][1] >= i:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((i, end))
        # Resume where a match could still reach past `end` (another earlier copy may run longer).
        i = max(i + 1, end - min_len + 1)
    return spans


def repeated_fraction(tokens: list[int], spans: list[tuple[int, int]] | None = None) -> float:
    """The share of tokens inside verbatim repeated spans (`spans`: `repeated_spans(tokens)` if known)."""
    if not tokens:
        return 0.0
    spans = repeated_spans(tokens) if spans is None else spans
    return sum(end - start for start, end in spans) / len(tokens)


def _panel_title(name: str, tokens: list[int]) -> str:
    if not tokens:
        return f"{name}: no tokens yet"
    d = distinct_all(tokens)
    dist = " ".join(f"D{n} {d[n]:.2f}" for n in NGRAM_ORDERS)
    # three short lines: two panels' titles side by side must not run into each other on a narrow plot
    return f"{name} ({len(tokens):,} tokens)<br>{dist}<br>repeated verbatim {repeated_fraction(tokens):.0%}"


def repetition_figure(ar_tokens: list[int], ts_tokens: list[int], chunk_size: int | None = None,
                      height: int = 420) -> go.Figure:
    """Two heatmaps (AR, TokenSwift) of chunk-by-chunk 4-gram overlap on a shared 0..1 colour scale,
    with Distinct-1..4 and the share of verbatim repeats (spans of >= REPEAT_MIN_TOKENS) in the titles.
    `chunk_size` defaults to `chunk_size_for` the longer run, so both panels use the same chunks."""
    title = "Repetition: 4-gram overlap between chunks"
    subtitle = "cell (i, j): the share of chunk i's 4-grams that also occur in chunk j; bright off the diagonal = reuse"
    if not ar_tokens and not ts_tokens:
        return placeholder_figure("No tokens yet", title, height)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=(_panel_title("AR", ar_tokens), _panel_title("TokenSwift", ts_tokens)))
    fig.update_annotations(font_size=11)
    chunk_size = chunk_size or chunk_size_for(max(len(ar_tokens), len(ts_tokens)))
    for col, tokens in ((1, ar_tokens), (2, ts_tokens)):
        if not tokens:
            add_note(fig, "no tokens yet", row=1, col=col)
            continue
        bounds = chunk_bounds(len(tokens), chunk_size)
        matrix = chunk_overlap_matrix(tokens, chunk_size)
        size = bounds[0][1] - bounds[0][0]
        fig.add_trace(go.Heatmap(z=[rounded(row, 2) for row in matrix], coloraxis="coloraxis",
                                 meta="overlap", name="AR" if col == 1 else "TokenSwift",
                                 hovertemplate="chunk %{y} vs chunk %{x}<br>%{z:.0%} of its 4-grams<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text=f"chunk j ({size} tokens each)", constrain="domain", row=1, col=col)
        fig.update_yaxes(title_text="chunk i", autorange="reversed", scaleanchor=f"x{'' if col == 1 else col}",
                         constrain="domain", row=1, col=col)
    fig.update_layout(**base_layout(title, height, subtitle=subtitle, legend_rows=0, subplot_title_px=50))
    fig.update_layout(coloraxis=dict(colorscale=OVERLAP_COLORSCALE, cmin=0, cmax=1,
                                     colorbar=dict(title=dict(text="shared"), thickness=12, len=0.8)))
    return fig
