"""Token streams -> the panes' HTML: prose paragraphs, tokens tinted by source, repeats underlined.

The model writes Gutenberg-style hard line breaks (one every ~70 characters); a pane reflows them:
a single line break becomes a space, a blank line a paragraph break. Tokens are inline spans with no
padding, so colours never add a line-break opportunity and words wrap only at spaces. All model text is
escaped (it is untrusted). Colours come from the plots' palette (ui/plots/style.py), one for the page.
"""
from __future__ import annotations

import html
import re
from typing import Callable, Hashable

from tokenswift.kinds import Source

from .plots.style import REPEAT_COLOR, SOURCE_COLORS, blend

LIVE_WINDOW = 1500  # tokens shown while streaming; the whole text is in the export
PARAGRAPH = "\n\n"  # how `soft_wrap` marks a paragraph break
# Sources a pane tints, with their legend names (AR tokens and roots are not tinted), and how far each
# tint moves the source's plot colour towards white: the target's own tokens, often most of the text, faintly.
TINTED = {Source.HEAD: "head draft", Source.NGRAM: "reused text (4-grams, suffix matches, datastore)",
          Source.BONUS: "target / bonus"}
TINT = {Source.HEAD: 0.7, Source.NGRAM: 0.7, Source.BONUS: 0.85}
_BREAKS = re.compile(r"[ \t]*(?:\r?\n[ \t]*)+")  # a run of line breaks with the blanks around it

Label = Hashable  # one segment's label, e.g. (source, repeated)
Segment = tuple[str, Label]


def segments(token_ids: list[int], labels: list[Label], decode: Callable[[list[int]], str],
             window: int = LIVE_WINDOW) -> list[Segment]:
    """Group consecutive tokens with the same label and decode each group; only the last `window`
    tokens, with a leading note when older tokens are hidden."""
    start = max(0, len(token_ids) - window)
    out: list[Segment] = []
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


def soft_wrap(segs: list[Segment]) -> list[Segment]:
    """The same segments with every run of line breaks replaced: one break -> a space, two or more
    (a blank line) -> `PARAGRAPH`. Runs may cross segments; the replacement goes where the run starts.
    Segments left empty are dropped."""
    flat = "".join(text for text, _ in segs)
    chars = list(flat)  # per character of `flat`: what it becomes ("" = dropped)
    for run in _BREAKS.finditer(flat):
        chars[run.start()] = PARAGRAPH if run.group().count("\n") > 1 else " "
        chars[run.start() + 1 : run.end()] = [""] * (run.end() - run.start() - 1)
    out: list[Segment] = []
    offset = 0
    for text, label in segs:
        wrapped = "".join(chars[offset : offset + len(text)])
        offset += len(text)
        if wrapped:
            out.append((wrapped, label))
    return out


def span_class(source: str | None, repeated: bool) -> str:
    """CSS classes of a token span: `src-<source>` for tinted sources, `rep` inside a repeated span."""
    classes = [f"src-{source}"] if source in TINTED else []
    if repeated:
        classes.append("rep")
    return " ".join(classes)


def pane_html(segs: list[Segment], class_of: Callable[[Label], str]) -> str:
    """Segments (label -> CSS classes via `class_of`) as one escaped prose block; no whitespace is added
    between spans, so span borders are never line-break opportunities."""
    parts: list[str] = []
    for text, label in soft_wrap(segs):
        cls = class_of(label)
        for k, piece in enumerate(text.split(PARAGRAPH)):
            if k:
                parts.append('<span class="para"></span>')
            if piece:
                escaped = html.escape(piece)
                parts.append(f'<span class="{cls}">{escaped}</span>' if cls else escaped)
    return f'<div class="prose">{"".join(parts)}</div>'


def placeholder_html(message: str) -> str:
    return f'<div class="prose empty">{html.escape(message)}</div>'


def tint(source: str) -> str:
    return blend(SOURCE_COLORS[source], "#ffffff", TINT[source])


def palette_css() -> str:
    """The panes' colour rules, generated from the plots' palette (appended to ui/style.css)."""
    rules = [f".prose .src-{s}, .legend .src-{s} {{background: {tint(s)};}}" for s in TINTED]  # no padding
    rules.append(f".prose .rep, .legend .rep {{text-decoration: underline wavy {REPEAT_COLOR}; "
                 "text-decoration-thickness: 1.5px; text-underline-offset: 3px;}")
    return "\n".join(rules)


def legend_html(min_repeat: int) -> str:
    """One legend for both panes and the plots: the sources' tints and the repeat underline."""
    keys = [f'<span class="key"><span class="src-{s}">{name}</span> '
            f'<span class="dot" style="background:{SOURCE_COLORS[s]}"></span></span>' for s, name in TINTED.items()]
    keys.append(f'<span class="key"><span class="rep">repeated verbatim</span> (an earlier run of ≥ {min_repeat} '
                f'tokens)</span>')
    return ('<div class="legend">TokenSwift\'s tokens are tinted by where each came from, in the plots\' colours '
            '(dots): ' + "".join(keys) + '</div>')
