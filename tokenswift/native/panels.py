"""Few-row float32 matrix products through the native panel kernel (`panel_mm.c`), when it is available.

`PanelMatrix.build(weight)` returns None where the kernel cannot serve (no compiler, no AVX-512, an
output size that is not a multiple of 32, not float32 on CPU, or a self-check that disagrees with
torch.mm); callers then keep their PyTorch path. Measured on the 2-vCPU Xeon this project targets (one
thread, fp32 weights streamed from L3, microseconds for 1 / 4 / 8 rows): gate/up 2048x384 torch.mm
150 / 312 / 567, panels 151 / 164 / 175; LM head 8192x384 torch.mm 517 / 1,287 / 1,584, panels
503 / 528 / 553.
"""
from __future__ import annotations

import ctypes

import torch

from . import build

MAX_ROWS = 16  # beyond this (big trees, prefill chunks) oneDNN / MKL are as good or better
_VOID = ctypes.c_void_p
_INT = ctypes.c_int


def _function():
    """The C function, or None."""
    return build.function("panel_mm", None, [_VOID, _VOID, _VOID, _INT, _INT, _INT], _self_check, "torch.mm")


def available() -> bool:
    return _function() is not None


def why_unavailable() -> str:
    return "" if available() else build.why_not("panel_mm")


class PanelMatrix:
    """W (N, K) as N / 32 panels of (K, 32); `(x)` computes x @ W^T for x (T <= MAX_ROWS, K) float32."""

    WIDTH = 32

    def __init__(self, weight: torch.Tensor) -> None:
        self._kernel = _function()
        if self._kernel is None:
            raise RuntimeError(f"the native panel kernel is not available: {why_unavailable()}")
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        w = weight.detach().to(torch.float32)
        self.panels = w.reshape(n // self.WIDTH, self.WIDTH, k).transpose(1, 2).contiguous()  # (N/32, K, 32)

    @classmethod
    def build(cls, weight: torch.Tensor) -> "PanelMatrix | None":
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[0] % cls.WIDTH or _function() is None:
            return None
        return cls(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, K) float32 on CPU, T <= MAX_ROWS -> (T, N) float32."""
        x = x.contiguous()
        t = x.shape[0]
        y = torch.empty(t, self.out_features, dtype=torch.float32)
        self._kernel(x.data_ptr(), self.panels.data_ptr(), y.data_ptr(), t, self.in_features, self.out_features)
        return y


def _self_check() -> bool:
    """The kernel agrees with torch.mm (to float32 rounding) for every group size, and a row of a
    many-row product is bitwise the one-row product."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 200, generator=gen)
    x = torch.randn(MAX_ROWS, 200, generator=gen)
    m = PanelMatrix(w)
    ref = x @ w.t()
    for rows in range(1, MAX_ROWS + 1):
        got = m(x[:rows])
        if not torch.allclose(got, ref[:rows], rtol=1e-4, atol=1e-4):
            return False
    one = m(x[:1])
    return bool(torch.equal(one[0], m(x[:8])[0]) and torch.equal(m(x[5:6])[0], m(x[:13])[5]))
