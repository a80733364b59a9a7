"""Where a verified row's time goes: one lean forward (plus the logits) of 1, 2, ... new tokens over a cache
filled by a held-out prompt, split into attention, the weight matrices and everything else.

    python -m tokenswift.bench rows [--context 1024] [--rows 1 2 4 9 12] [--repeats 60]

This is the cost curve `tree="auto"` prices drafts with (forward and logits of q rows against one row), taken
apart. The parts are timed by wrapping the lean step's attention call and its matrix products for the duration
of the benchmark (one clock read on each side of every call, about 1 us in a step of several ms), and, where the
native decoder stack runs the forward (tokenswift/native/layer_rows.c), by its own clock reads around the same
kernels. Row counts run
interleaved, one forward each in turn, so that the machine's drift falls on all of them alike; medians.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict

import torch

from .. import lean as lean_module

WARMUP = 3  # rounds not counted


@contextlib.contextmanager
def _timed_parts(totals: dict[str, float]):
    """Adds the seconds spent in the lean step's attention and matrix products to totals while active."""
    import ctypes

    attend, matrix_call = lean_module.attend, lean_module.Matrix.__call__
    stack_run = lean_module.native_layers.NativeStack.run

    def timed_stack(self, *args, **kwargs):
        self.parts = (ctypes.c_double * 2)()
        try:
            return stack_run(self, *args, **kwargs)
        finally:
            totals["attention"] += self.parts[0]
            totals["matrices"] += self.parts[1]
            self.parts = None

    def timed_attend(*args, **kwargs):
        t = time.perf_counter()
        out = attend(*args, **kwargs)
        totals["attention"] += time.perf_counter() - t
        return out

    def timed_matrix(self, x):
        t = time.perf_counter()
        out = matrix_call(self, x)
        totals["matrices"] += time.perf_counter() - t
        return out

    lean_module.attend, lean_module.Matrix.__call__ = timed_attend, timed_matrix
    lean_module.native_layers.NativeStack.run = timed_stack
    try:
        yield
    finally:
        lean_module.attend, lean_module.Matrix.__call__ = attend, matrix_call
        lean_module.native_layers.NativeStack.run = stack_run


def rows(model: str, text_path: str, context: int, row_counts: list[int], repeats: int, threads: int = 1) -> dict:
    """Median milliseconds per part for each number of new tokens, and each total relative to one row, on
    `threads` torch threads (1: as the app's engine and the speed benchmark run; restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _rows(model, text_path, context, row_counts, repeats)
    finally:
        torch.set_num_threads(before)


def _rows(model: str, text_path: str, context: int, row_counts: list[int], repeats: int) -> dict:
    from ..generator import Generator
    from ..run_state import PREFILL_CHUNK
    from ..kv_cache import KVCache
    from ..train.corpus import split_text

    gen = Generator.from_pretrained(model)
    lean, a = gen.adapter.lean, gen.adapter
    if lean is None:
        raise SystemExit("this model does not run through the lean step (see tokenswift/lean.py)")
    with open(text_path, encoding="utf-8") as f:
        ids = gen.encode(split_text(f.read())[1])[:context]
    n = len(ids)
    cache = KVCache(a.layer_devices, n + max(row_counts), a.num_kv_heads, a.head_dim, a.cache_dtype)
    for start in range(0, n, PREFILL_CHUNK):  # the prompt's keys and values, as a prefill leaves them
        chunk = torch.tensor(ids[start : start + PREFILL_CHUNK])
        t = chunk.shape[0]
        lean.forward(chunk, torch.arange(start, start + t), cache, start, torch.ones(t, t, dtype=torch.bool).tril())
    samples: dict[int, dict[str, list[float]]] = {q: defaultdict(list) for q in row_counts}
    for i in range(repeats + WARMUP):
        for q in row_counts:
            tokens = torch.tensor(ids[n - q :])  # any tokens: the cost does not depend on them
            mask = torch.ones(q, q, dtype=torch.bool).tril() if q > 1 else None
            totals = dict.fromkeys(("attention", "matrices"), 0.0)
            with _timed_parts(totals):
                t0 = time.perf_counter()
                hidden, _ = lean.forward(tokens, torch.arange(n, n + q), cache, n, mask)
                t1 = time.perf_counter()
                attention, matrices = totals["attention"], totals["matrices"]
                lean.logits(hidden)
                t2 = time.perf_counter()
            if i < WARMUP:
                continue
            s = samples[q]
            s["total"].append(t2 - t0)
            s["attention"].append(attention)
            s["matrices"].append(matrices)
            s["logits"].append(t2 - t1)
            s["rest"].append(t1 - t0 - attention - matrices)
    table = {}
    for q in row_counts:
        table[q] = {part: round(statistics.median(v) * 1e3, 3) for part, v in samples[q].items()}
    one = table[row_counts[0]]["total"]
    for q in row_counts:
        table[q]["relative_to_first"] = round(table[q]["total"] / one, 3)
    return {"benchmark": "rows", "model": model, "context": n, "repeats": repeats, "threads": torch.get_num_threads(),
            "milliseconds": {str(q): table[q] for q in row_counts},
            "parts": "attention: the lean step's attend calls; matrices: its weight products (q/k/v, o, gate/up, "
                     "down); logits: final norm and LM head; rest: everything else in the forward"}
