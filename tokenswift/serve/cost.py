"""What a request is expected to cost the engine, in engine-seconds, before it is admitted.

A step streams the weights once and attends over the cache: on one core of this kind of machine an AR
step of the default model (17M parameters) takes about 12 ms at a 1K context, and verifying q rows
costs about q**0.3 steps (REFERENCE.md: 4 rows 1.34-1.57x, 8 rows 1.7-2x, 32 rows 2.8-3x) plus attention
that grows with rows x context. A TokenSwift iteration is assumed to yield 1.5 tokens (the paper's
sampling on small models: 1.2-1.7). The estimate errs on the high side for wide trees and long contexts,
which is where a request can hold the engine far longer than its token count suggests.
"""
from __future__ import annotations

from tokenswift.kinds import Method
from tokenswift.settings import Settings
from tokenswift.tree import AUTO, product_nodes, spec_widths
from tokenswift.validate import NGRAM_NODES

REFERENCE_PARAMETERS = 17_301_504  # the default model, for which STEP_S was measured
STEP_S = 0.012  # one AR step of the default model at a 1K context, one core
ROW_EXPONENT = 0.3  # verifying q rows costs about q**0.3 steps (weights streamed once for all rows)
ATTENTION_S = 1e-7  # per verified row per cached position, for the default model's width
PREFILL_SHARE = 0.125  # a prompt token in a 256-token prefill chunk costs about this share of a step
TOKENS_PER_ITERATION = 1.5
AUTO_ROWS = 8  # tree="auto" plans rarely verify more rows than this on a CPU


def verify_rows(settings: Settings) -> int:
    """Rows one TokenSwift iteration verifies: the root, the tree's nodes and the n-gram branches."""
    if settings.tree == AUTO:
        return AUTO_ROWS
    widths = spec_widths(settings.tree)
    rows = 1 + product_nodes(widths)
    if settings.ngram_reuse:
        rows += ((widths[0] if widths else 0) + 1) * settings.ngram_topk * NGRAM_NODES
    return rows


def engine_seconds(prompt_tokens: int, max_new_tokens: int, settings: Settings, methods: tuple[str, ...],
                   parameters: int = REFERENCE_PARAMETERS) -> float:
    """Expected engine-seconds to finish the request (each method prefills and generates on its own)."""
    scale = max(parameters, 1) / REFERENCE_PARAMETERS
    step = STEP_S * scale
    context = prompt_tokens + max_new_tokens / 2  # the mean context over the run
    total = 0.0
    for method in methods:
        total += prompt_tokens * PREFILL_SHARE * step
        if method == Method.AR:
            total += max_new_tokens * (step + ATTENTION_S * scale ** 0.5 * context)
        else:
            rows = verify_rows(settings)
            iteration = step * rows ** ROW_EXPONENT + ATTENTION_S * scale ** 0.5 * rows * context
            total += max_new_tokens / TOKENS_PER_ITERATION * iteration
    return total
