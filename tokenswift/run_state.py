"""The state one generation shares between its phases: the committed tokens, the full KV cache, the random stream.

Drafters (tokenswift/drafters.py, tokenswift/auto.py) read it to propose, the verifier (tokenswift/verifier.py)
writes the accepted tokens into it, and the decode loop (tokenswift/decode_loop.py) reports it in every Step.
"""
from __future__ import annotations

import threading

import torch

from . import events as ev
from .adapter import ModelAdapter
from .kinds import PartialMode
from .kv_cache import KVCache
from .partial_cache import PartialKVCache
from .sampling import UniformStream, seen_rows
from .settings import Settings

PREFILL_CHUNK = 256  # prompt tokens per prefill forward


class RunState:
    """Committed tokens (a list, and a preallocated id tensor the penalty window and the native walk read), the full
    KV cache sized for the whole run, the uniforms of sampled decisions, and the iteration number."""

    def __init__(self, adapter: ModelAdapter, ids: list[int], settings: Settings, capacity: int, seed: int,
                 eos: int | None, detail: bool) -> None:
        self.a, self.s, self.detail, self.eos = adapter, settings, detail, eos
        self.ids = list(ids)
        self.seq = torch.zeros(capacity, dtype=torch.long)  # (capacity,) token history for the penalty window
        self.seq[: len(ids)] = torch.tensor(ids)
        self._seq_view = self.seq.numpy()  # the same memory: writing a few ids through it skips a tensor's creation
        self.seq_ptr = self.seq.data_ptr()  # its address, for the native walk
        self.full = KVCache(adapter.layer_devices, capacity, adapter.num_kv_heads, adapter.head_dim, adapter.cache_dtype,
                            adapter.backend.serves("layers"))
        self.uniforms = UniformStream(seed)
        self.iteration = 0

    def commit(self, tokens: list[int]) -> None:
        n = len(self.ids)
        self.ids.extend(tokens)
        self._seq_view[n : n + len(tokens)] = tokens

    def seen(self, extras: list[list[int]] | None) -> torch.Tensor | None:
        """(N, V) penalty windows of N rows whose drafted ancestors are `extras` (None: no penalty)."""
        if self.s.penalty == 1.0:
            return None
        return seen_rows(self.seq, len(self.ids), self.s.penalty_window, extras, self.a.vocab_size)

    def sync(self) -> None:
        if self.full.k and self.full.k[0].device.type == "cuda":
            torch.cuda.synchronize(self.full.k[0].device)

    def prefill(self, stop: threading.Event | None, capture_queries: bool) -> list[torch.Tensor] | None:
        """Run every prompt token but the last through the full cache. Returns per layer the query of the last
        prefilled token (Hq, d) when `capture_queries` (the partial cache's first selection), else an empty list;
        None when `stop` was set (checked between chunks, so Stop also ends a long prefill)."""
        body = self.ids[:-1]
        queries: list[torch.Tensor] = []
        for start in range(0, len(body), PREFILL_CHUNK):
            if stop is not None and stop.is_set():
                return None
            chunk = body[start : start + PREFILL_CHUNK]
            t = len(chunk)
            causal = torch.ones(t, t, dtype=torch.bool).tril_()
            _, q = self.a.forward(torch.tensor(chunk), torch.arange(start, start + t), self.full, start, causal,
                                  capture_queries=capture_queries)
            queries = [x[:, -1] for x in q]
            self.full.length = start + t
        return queries

    def cache_state(self, mode: PartialMode, partial: PartialKVCache | None, with_positions: bool) -> ev.CacheState:
        """The full cache's occupancy and, where drafting reads a partial cache, what it holds."""
        f = self.full
        state = ev.CacheState(f.length, f.capacity, f.bytes_used(), mode)
        if partial is not None:
            ps = partial.state()
            state.partial_budget, state.partial_sink = ps.budget, ps.sink
            state.partial_selected, state.partial_recent = ps.selected, ps.recent
            state.refreshed, state.refreshes = ps.refreshed, ps.refreshes
            if with_positions or ps.refreshed:
                state.held_positions = ev.position_runs(partial.held_positions()[: partial.kept])
        return state
