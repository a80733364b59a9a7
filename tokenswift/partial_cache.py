"""The dynamic partial KV cache used for drafting (the paper's scheme).

Per layer and KV head it holds at most `budget` positions copied from the full cache: the first `sink`
positions, the positions whose keys score highest against the latest query (summed over the GQA group),
and a tail of recently committed positions. When the tail has used its room:
  dynamic  re-select by importance over everything so far (the paper's dynamic update);
  once     keep the prefill selection and let the tail roll (oldest recent position evicted).
(The third mode, "full", drafts from the full cache and needs no object of this class.)
The K/V copied here were computed by the verification pass over the full cache, so they are exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import KVCache


def select_positions(query: torch.Tensor, keys: torch.Tensor, sink: int, keep: int) -> torch.Tensor:
    """query: (Hq, d) of the latest token; keys: (Hkv, n, d). Returns (Hkv, min(n, sink) + keep) sorted
    positions: the sink plus the `keep` positions after it with the largest q·k summed over each group."""
    hkv, n, d = keys.shape
    g = query.shape[0] // hkv
    first = min(sink, n)
    sink_pos = torch.arange(first, device=keys.device).expand(hkv, first)
    if keep <= 0 or n <= first:
        return sink_pos
    q = query.reshape(hkv, g, d).float()
    scores = torch.matmul(q, keys[:, first:].float().transpose(1, 2)).sum(dim=1)  # (Hkv, n - first)
    top = torch.topk(scores, min(keep, n - first), dim=-1).indices + first
    return torch.cat([sink_pos, torch.sort(top, dim=-1).values], dim=1)


@dataclass
class PartialState:
    budget: int
    sink: int
    selected: int
    recent: int
    refreshed: bool
    refreshes: int


class PartialKVCache:
    """Buffers per layer: K, V (Hkv, budget + 1, d), the last slot being scratch for the draft token;
    positions (Hkv, budget) int64. `count` slots are valid (the same for every layer and head)."""

    def __init__(self, full: KVCache, budget: int, sink: int, recent: int, mode: str, report_layer: int = 0) -> None:
        if mode not in ("once", "dynamic"):
            raise ValueError(f"partial cache mode must be 'once' or 'dynamic', got {mode!r}")
        self.budget, self.sink, self.recent, self.mode = budget, sink, recent, mode
        self.report_layer = report_layer
        self.k = [torch.empty(k.shape[0], budget + 1, k.shape[2], dtype=k.dtype, device=k.device) for k in full.k]
        self.v = [torch.empty_like(k) for k in self.k]
        self.pos = [torch.zeros(k.shape[0], budget + 1, dtype=torch.long, device=k.device) for k in self.k]
        self.count = 0  # valid slots
        self.kept = 0  # sink + selected slots (the rest, up to count, is the recent tail)
        self.ring = 0  # next tail slot to overwrite in "once" mode
        self.refreshes = 0
        self.refreshed = False  # did the last update refresh?

    # ---- the draft pass sees this object as a cache --------------------------------------------------
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer][:, start : start + k.shape[1]] = k
        self.v[layer][:, start : start + k.shape[1]] = v

    def keys(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def key_positions(self, layer: int, end: int) -> torch.Tensor:
        return self.pos[layer][:, :end]

    # ---- maintenance ----------------------------------------------------------------------------------
    def refresh(self, full: KVCache, queries: list[torch.Tensor]) -> None:
        """Re-select from the full cache's committed positions. queries: per layer (Hq, d) of the latest
        committed token."""
        n = full.length
        room = self.budget - self.recent
        keep = max(0, min(n, room) - min(self.sink, n))
        for layer in range(len(self.k)):
            keys, values = full.keys(layer, n)  # (Hkv, n, d)
            if n <= room:
                chosen = torch.arange(n, device=keys.device).expand(keys.shape[0], n)
            else:
                chosen = select_positions(queries[layer].to(keys.device), keys, self.sink, keep)
            index = chosen[..., None].expand(-1, -1, keys.shape[2])
            m = chosen.shape[1]
            self.k[layer][:, :m] = keys.gather(1, index)
            self.v[layer][:, :m] = values.gather(1, index)
            self.pos[layer][:, :m] = chosen
        self.count = self.kept = min(n, self.sink) + keep if n > room else n
        self.ring = self.kept
        self.refreshes += 1
        self.refreshed = True

    def append(self, full: KVCache, slots: list[int], queries: list[torch.Tensor]) -> None:
        """Add newly committed full-cache slots to the tail (refreshing or rolling when it is full)."""
        self.refreshed = False
        if self.mode == "dynamic" and self.count + len(slots) > self.budget:
            self.refresh(full, queries)
            return
        for slot in slots:
            if self.count < self.budget:
                target = self.count
                self.count += 1
            else:  # "once": overwrite the oldest tail entry
                target = self.ring
                self.ring = self.kept + (self.ring + 1 - self.kept) % (self.budget - self.kept)
            for layer in range(len(self.k)):
                self.k[layer][:, target] = full.k[layer][:, slot]
                self.v[layer][:, target] = full.v[layer][:, slot]
                self.pos[layer][:, target] = slot

    def state(self) -> PartialState:
        return PartialState(self.budget, min(self.sink, self.kept), max(0, self.kept - self.sink),
                            self.count - self.kept, self.refreshed, self.refreshes)

    def held_positions(self) -> list[int]:
        """Positions held by the report layer's first KV head (sorted)."""
        pos = self.pos[self.report_layer]
        return sorted(pos[0, : self.count].tolist())
