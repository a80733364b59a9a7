"""The full KV cache: preallocated once per generation, written by index, compacted in place."""
from __future__ import annotations

import torch

from .native.layers import move_slots


class KVCache:
    """Per layer K and V buffers of shape (Hkv, capacity, d), allocated once on the device where that
    layer runs (so models split by accelerate's device_map keep working).

    `length` is the number of committed positions; slots beyond it are scratch space (tree nodes).
    """

    def __init__(self, devices: list[torch.device], capacity: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, native_moves: bool = True) -> None:
        """native_moves: compaction may use the native kernel (the compute backend's `serves("layers")`)."""
        self.capacity = capacity
        self.native_moves = native_moves
        self.length = 0
        shape = (num_kv_heads, capacity, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=d) for d in devices]
        self.v = [torch.empty(shape, dtype=dtype, device=d) for d in devices]
        self.native_pointers = None  # the buffers' addresses for the native kernels (tokenswift.native.layers), once asked

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (Hkv, T, d) written to slots [start, start + T)."""
        end = start + k.shape[1]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: need {end} slots, capacity is {self.capacity}")
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v

    def keys(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of slots [0, end): (Hkv, end, d) each, no copy."""
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def compact(self, src_slots: list[int], dst_start: int) -> None:
        """Move the K/V at `src_slots` (in order) to [dst_start, dst_start + len(src_slots))."""
        if not src_slots or src_slots == list(range(dst_start, dst_start + len(src_slots))):
            return
        if self.native_moves and move_slots(self, src_slots, dst_start):  # one native call instead of four tensor ops per layer
            return
        for layer in range(len(self.k)):
            index = torch.tensor(src_slots, device=self.k[layer].device)
            end = dst_start + len(src_slots)
            self.k[layer][:, dst_start:end] = self.k[layer].index_select(1, index)
            self.v[layer][:, dst_start:end] = self.v[layer].index_select(1, index)

    def bytes_used(self) -> int:
        """Bytes taken by the committed positions across all layers."""
        total = 0
        for k in self.k:
            total += 2 * k.shape[0] * self.length * k.shape[2] * k.element_size()
        return total

    def key_positions(self, layer: int, end: int) -> torch.Tensor:
        """(1, end) positions of slots [0, end): in the full cache a committed slot is its position."""
        return torch.arange(end)[None]
