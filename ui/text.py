"""Token streams -> coloured text segments for the panes (pairs for gr.HighlightedText)."""
from __future__ import annotations

from typing import Callable

SOURCE_LABELS = {"head": "head draft", "ngram": "n-gram reuse", "bonus": "target / bonus", "ar": None}
REPEATED = "repeated"
TS_COLORS = {"head draft": "#4c78a8", "n-gram reuse": "#f58518", "target / bonus": "#e2b007"}
AR_COLORS = {REPEATED: "#e45756"}
LIVE_WINDOW = 1500  # tokens shown while streaming; the whole text is in the export


def segments(token_ids: list[int], labels: list[str | None], decode: Callable[[list[int]], str],
             window: int = LIVE_WINDOW) -> list[tuple[str, str | None]]:
    """Group consecutive tokens with the same label and decode each group; only the last `window`
    tokens, with a leading note when older tokens are hidden."""
    start = max(0, len(token_ids) - window)
    out: list[tuple[str, str | None]] = []
    if start:
        out.append((f"[… {start:,} earlier tokens not shown …] ", None))
    i = start
    while i < len(token_ids):
        j = i
        while j < len(token_ids) and labels[j] == labels[i]:
            j += 1
        out.append((decode(token_ids[i:j]), labels[i]))
        i = j
    return out


def source_labels(sources: list[str]) -> list[str | None]:
    return [SOURCE_LABELS.get(s) for s in sources]


def repeat_labels(token_ids: list[int], spans: list[tuple[int, int]]) -> list[str | None]:
    labels: list[str | None] = [None] * len(token_ids)
    for a, b in spans:
        for k in range(a, min(b, len(labels))):
            labels[k] = REPEATED
    return labels
