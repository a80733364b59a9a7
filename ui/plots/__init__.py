"""Live plot builders: pure functions from the engine's events / the UI's traces to plotly figures."""
from .accepted_plot import accepted_figure, running_mean
from .kv_plot import held_strip, kv_figure
from .repetition import (REPEAT_MIN_TOKENS, chunk_bounds, chunk_overlap_matrix, chunk_size_for, distinct_all,
                         distinct_n, repeated_fraction, repeated_spans, repetition_figure)
from .style import CACHE_COLORS, REPEAT_COLOR, SOURCE_COLORS, base_layout, color_for, placeholder_figure
from .tree_plot import bonus_token, draft_tree_figure, token_label

__all__ = [
    "CACHE_COLORS", "REPEAT_COLOR", "REPEAT_MIN_TOKENS", "SOURCE_COLORS", "accepted_figure", "base_layout",
    "bonus_token", "chunk_bounds", "chunk_overlap_matrix", "chunk_size_for", "color_for", "distinct_all",
    "distinct_n", "draft_tree_figure", "held_strip", "kv_figure",
    "placeholder_figure", "repeated_fraction", "repeated_spans", "repetition_figure", "running_mean",
    "token_label",
]
