"""Attention of a few query rows over a long key range through the native kernel (`attend_rows.c`).

`attend_rows(...)` returns None where the kernel cannot serve (no compiler, or neither AVX-512 nor AVX2 with
FMA, a head size other than 64 or 128, not float32, keys not laid out as rows of d floats); callers keep their
PyTorch path.
"""
from __future__ import annotations

import ctypes
import threading

import torch

from . import build

_VOID, _INT, _LONG, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_ARGTYPES = [_VOID, _VOID, _VOID, _LONG, _VOID, _INT, _INT, _INT, _INT, _INT, _FLOAT, _VOID, _VOID, _LONG]
# Stacked rows (group size x new tokens) up to which attention.attend routes to this kernel, at any length (the
# measurements are in attention.py); the native decoder stack serves the steps whose rows stay within it.
MAX_ROWS = 48


def _function():
    return build.function("attend_rows", _INT, _ARGTYPES, _self_check, "PyTorch attention")


def available() -> bool:
    return _function() is not None


_local = threading.local()  # per thread: the scores' scratch, grown to the most rows x keys asked


def _scratch(rows: int, s: int) -> torch.Tensor:
    need = rows * ((s + 15) // 16 * 16)  # attend_rows_scratch in attend_rows.c (which checks it)
    buf = getattr(_local, "scores", None)
    if buf is None or buf.numel() < need:
        buf = _local.scores = torch.empty(max(need, 2 * buf.numel() if buf is not None else 0), dtype=torch.float32)
    return buf


def attend_rows(qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, t: int,
                block_mask: torch.Tensor | None, kernel=None) -> torch.Tensor | None:
    """qs: (Hkv, R, d) stacked query rows (row r is new token r % t); k, v: (Hkv, S, d) with the t new
    tokens last; block_mask: (t, t) bool, True = visible (None: all). Returns (Hkv, R, d), or None.
    kernel: the C function to use (the self-check passes the one under test); default: the published one."""
    hkv, rows, d = qs.shape
    s = k.shape[1]
    kernel = kernel or _function()
    if (kernel is None or d not in (64, 128) or qs.dtype != torch.float32 or k.dtype != torch.float32
            or v.dtype != torch.float32 or qs.device.type != "cpu" or k.stride(2) != 1 or k.stride(1) != d
            or v.stride() != k.stride() or s < t):
        return None
    qs = qs.contiguous()
    out = torch.empty(hkv, rows, d, dtype=torch.float32)
    mask_ptr = None
    if block_mask is not None:
        mask = block_mask.to(torch.uint8).contiguous()
        mask_ptr = mask.data_ptr()
    scratch = _scratch(rows, s)
    code = kernel(qs.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), out.data_ptr(), hkv, rows, t, s, d,
                  float(scale), mask_ptr, scratch.data_ptr(), scratch.numel())
    return out if code == 0 else None


def _reference(qs, k, v, scale, t, block_mask):
    scores = torch.matmul(qs, k.transpose(1, 2)) * scale  # (Hkv, R, S)
    if block_mask is not None:
        hkv, rows, s = scores.shape
        allowed = block_mask[torch.arange(rows) % t]  # (R, t)
        scores[..., s - t:] = scores[..., s - t:].masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _self_check(kernel) -> bool:
    gen = torch.Generator().manual_seed(0)
    for d, s, t, g in ((64, 37, 1, 3), (64, 300, 5, 3), (128, 100, 4, 2)):
        k = torch.randn(2, s + 7, d, generator=gen)[:, :s]  # a view with a head stride, as the cache gives
        v = torch.randn(2, s + 7, d, generator=gen)[:, :s]
        qs = torch.randn(2, g * t, d, generator=gen)
        mask = torch.ones(t, t, dtype=torch.bool).tril() if t > 1 else None
        got = attend_rows(qs, k, v, d ** -0.5, t, mask, kernel=kernel)
        if got is None or not torch.allclose(got, _reference(qs, k, v, d ** -0.5, t, mask), rtol=1e-4, atol=1e-5):
            return False
    return True
