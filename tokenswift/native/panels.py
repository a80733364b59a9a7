"""Few-row float32 matrix products through the native panel kernels, when they are available: `panel_amx`
(Intel AMX tiles over bfloat16 weights, for weights that are exactly bfloat16, as the default model's are; in the
amx library only), `panel_bf16` (bfloat16 panels widened to float32 in registers, for such weights, on AVX-512 or
AVX2 CPUs where AMX does not serve) or `panel_mm` (float32 panels, AVX-512 or AVX2). `describe()` names the
variant in use.

`PanelMatrix.build(weight)` returns None where the kernel cannot serve (no compiler, no AVX2, an
output size that is not a multiple of 32, not float32 on CPU, or a self-check that disagrees with
torch.mm); callers then keep their PyTorch path. Measured on the 2-vCPU Xeon this project targets (one
thread, fp32 weights streamed from L3, microseconds for 1 / 4 / 8 rows): gate/up 2048x384 torch.mm
150 / 312 / 567, panels 151 / 164 / 175; LM head 8192x384 torch.mm 517 / 1,287 / 1,584, panels
503 / 528 / 553.
"""
from __future__ import annotations

import ctypes
import threading

import torch

from . import build, switches
from .switches import AMX_ENV, BF16_ENV, BLOCKS_ENV

MAX_ROWS = 16  # beyond this (big trees, prefill chunks) oneDNN / MKL are as good or better
AMX_MAX_K = 4096
TILE_SPLIT_BYTES = 2**20  # split rows (bfloat16 parts of x: 6.4 bytes per row and input) one tile call streams; more
#                           rows go in calls of this many (every row's result is its own: bitwise the same). Measured
#                           (AMX host, SmolLM2's down 576x1536 on Q4_1 blocks, 256 rows): 2.24 ms in one call, whose
#                           2.5 MB of split rows spill out of L2 and are read again per 32 outputs; 1.66 in two.
TILE_PASS_ROWS = 10  # rows of a pair of tile passes (5 tokens each): calls are cut at multiples of it
# AMX over float32 panels, measured here (one thread, microseconds for 1 / 4 / 9 / 12 rows): q/k/v 640x384
# 11.5 / 16.1 / 28.1 / 39.2 -> 7.2 / 7.6 / 14.5 / 19.6; gate/up 2048x384 137 / 146 / 145 / 147 -> 22 / 24 / 45 / 64;
# down 384x1024 24 / 33 / 62 / 73 -> 14 / 15 / 27 / 39; LM head 8192x384 516 / 516 / 536 / 549 -> 292 / 303 / 348 / 405.
_VOID, _INT, _LONG = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_ARGS = [_VOID, _VOID, _VOID, _INT, _INT, _INT]  # x, panels, y, m, k, n


def _function():
    """The C function, or None."""
    return build.function("panel_mm", _INT, _ARGS, _self_check, "torch.mm")


def _amx_function():
    """The AMX kernel, or None (no AMX, no permission for its tile state, or TOKENSWIFT_AMX=0)."""
    if not switches.current().amx:
        return None
    return build.function("panel_amx", _INT, _ARGS + [_VOID, _LONG], _amx_self_check, "torch.mm")


def _bf16_function():
    """The bfloat16-panel kernel, or None (no native kernels, or TOKENSWIFT_BF16_PANELS=0)."""
    if not switches.current().bf16_panels:
        return None
    return build.function("panel_bf16", _INT, _ARGS, _bf16_self_check, "float32 panels")


_BLOCK_ARGS = _ARGS + [_VOID, _LONG]  # x, blocks, y, m, k, n, scratch, its bytes


def _q4_function():
    """The kernel over GGUF Q4_1 blocks (panel_q4.c), or None (no native kernels, or TOKENSWIFT_BLOCKS=0)."""
    if not switches.current().blocks:
        return None
    return build.function("panel_q4", _INT, _BLOCK_ARGS, _q4_self_check, "the bfloat16 weights the blocks encode")


def _q4_amx_function():
    """The kernel over GGUF Q4_1 blocks on AMX tiles (panel_amx.c), or None."""
    if not switches.current().blocks or _amx_function() is None:
        return None
    return build.function("panel_q4_amx", _INT, _BLOCK_ARGS, _q4_amx_self_check, "panel_amx")


def _q8_amx_function():
    """The kernel over GGUF Q8_0 blocks on AMX tiles (panel_amx.c), or None. Off AMX no kernel streams Q8_0 blocks:
    rebuilding them in float32 lanes cost more than streaming their bfloat16 (docs/performance.md)."""
    if not switches.current().blocks or _amx_function() is None:
        return None
    return build.function("panel_q8_amx", _INT, _BLOCK_ARGS, _q8_amx_self_check, "panel_amx")


_local = threading.local()  # per thread: the kernels' scratch (grown to the most rows and columns asked)


def _amx_scratch(rows: int, k: int) -> tuple[int, int]:
    """(address, bytes) of this thread's scratch for panel_amx, panel_q4 or panel_q4_amx over `rows` rows of `k`
    columns."""
    have = getattr(_local, "amx", None)
    if have is None or rows > have[0] or k > have[1]:
        rows, k = max(rows, have[0] if have else 0), max(k, have[1] if have else 0)
        size = build.library().product_scratch  # the decoder stack's rule (layer_rows.c): every kernel's need
        size.restype, size.argtypes = _LONG, [_INT, _INT]
        buf = torch.empty(size(rows, k), dtype=torch.uint8)
        have = _local.amx = (rows, k, buf, buf.data_ptr(), buf.numel())
    return have[3], have[4]


def available() -> bool:
    return _function() is not None


def amx_available() -> bool:
    return _amx_function() is not None


def bf16_available() -> bool:
    return _bf16_function() is not None


def q4_available() -> bool:
    return _q4_function() is not None


def q4_amx_available() -> bool:
    return _q4_amx_function() is not None


def q8_amx_available() -> bool:
    return _q8_amx_function() is not None


def why_unavailable() -> str:
    return "" if available() else build.why_not("panel_mm")


def isa() -> str | None:
    """The variant of the library the panel kernels come from ("amx", "avx512bf16", "avx512" or "avx2"), or None
    without them."""
    return build.loaded_variant().name if available() else None


def describe() -> str:
    """The native kernel variant this process runs, as one line for a benchmark's conditions, e.g.
    "native kernels: amx build (this CPU's best: -mavx2 ... -mamx-bf16), AMX on, bf16 panels on, Q4_1 blocks on (on
    AMX tiles)". AMX tiles serve the bfloat16-exact matrices they fit; bf16 panels the other bfloat16-exact ones
    (all of them where AMX is off); Q4_1 blocks the matrices of a model converted from them (tokenswift.gguf_blocks);
    float32 panels the rest."""
    if not available():
        return f"native kernels: none ({why_unavailable()})"
    chosen = build.loaded_variant()
    switch = " ".join(chosen.flags)
    how = f"this CPU's best: {switch}" if build.variant() == "native" else f"{build.ISA_ENV}={chosen.name}: {switch}"
    passed = "".join(f"; {line}" for line in build.passed_over())

    def state(on: bool, switched_on: bool, env: str, otherwise: str) -> str:
        if on:
            return "on"
        return f"off ({otherwise})" if switched_on else f"off ({env}=0)"

    no_amx = build.why_not("panel_amx") or "not in this build"
    no_q4 = build.why_not("panel_q4") or "unavailable"
    chosen_switches = switches.current()
    return (f"native kernels: {chosen.name} build ({how}{passed}), "
            f"AMX {state(amx_available(), chosen_switches.amx, AMX_ENV, no_amx)}, "
            f"bf16 panels {state(bf16_available(), chosen_switches.bf16_panels, BF16_ENV, build.why_not('panel_bf16') or 'unavailable')}, "
            f"Q4_1 blocks {state(q4_available(), chosen_switches.blocks, BLOCKS_ENV, no_q4)}"
            + (" (on AMX tiles, Q8_0 too)" if q4_amx_available() and q8_amx_available() else
               " (on AMX tiles)" if q4_amx_available() else ""))


def _bf16_order() -> torch.Tensor:
    """The column each slot of a bfloat16 panel's k row holds (panel_mm.c, weights32_bf16): slots 2j and 2j + 1 (the
    low and high half of 32-bit pair j) hold columns c and c + 8, c = j for j < 8 and 8 + j for j >= 8."""
    pair = torch.arange(16)
    low = torch.where(pair < 8, pair, pair + 8)
    return torch.stack([low, low + 8], dim=1).reshape(32)


BF16_ORDER = _bf16_order()  # (32,): [0, 8, 1, 9, ..., 7, 15, 16, 24, ..., 23, 31]


class PanelMatrix:
    """W (N, K) laid out for a native kernel; `(x)` computes x @ W^T for x (T, K) float32 (T <= MAX_ROWS on panels).

    kind 0: N / 32 float32 panels of (K, 32) for panel_mm.c. kind 1: bfloat16 B tiles for panel_amx.c, where
    W is exactly bfloat16 (then the product is the same to float32 rounding, from half the bytes). kind 2: the
    panels of kind 0 in bfloat16, each k row interleaved (BF16_ORDER), for panel_bf16 (panel_mm.c), where W is
    exactly bfloat16 and AMX does not serve it (bitwise kind 0's products, from half the bytes). Kind 3: W as the
    GGUF Q4_1 blocks it was converted from (`from_blocks`), for panel_q4.c; kind 4 the same on AMX tiles
    (panel_q4_amx, bitwise kind 1's products); kind 5 Q8_0 blocks on AMX tiles (panel_q8_amx, the same)."""

    WIDTH = 32

    def __init__(self, weight: torch.Tensor, amx: bool = False, bf16: bool = False, kernel=None) -> None:
        """kernel: the C function to use (a self-check passes the one under test); default: the published one."""
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        self.kind = 1 if amx else 2 if bf16 else 0
        self._kernel = kernel or (_amx_function() if amx else _bf16_function() if bf16 else _function())
        if self._kernel is None:
            raise RuntimeError(f"the native panel kernel is not available: {why_unavailable()}")
        if bf16:
            w = weight.detach().to(torch.bfloat16).view(torch.int16)
            panels = w.reshape(n // self.WIDTH, self.WIDTH, k).transpose(1, 2)  # (N/32, K, 32) in column order
            self.panels = panels[..., BF16_ORDER].contiguous()  # each k row interleaved as panel_mm.c loads it
        elif amx:
            w = weight.detach().to(torch.bfloat16).view(torch.int16)  # (N, K): [n / 16][16][k / 32][16 pairs][2]
            self.panels = w.reshape(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()
        else:
            w = weight.detach().to(torch.float32)
            self.panels = w.reshape(n // self.WIDTH, self.WIDTH, k).transpose(1, 2).contiguous()  # (N/32, K, 32)

    @classmethod
    def build(cls, weight: torch.Tensor, amx: bool = True, bf16: bool = True) -> "PanelMatrix | None":
        """amx, bf16: whether AMX tiles / bfloat16 panels may serve (the compute backend's choice) where they can."""
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[0] % cls.WIDTH or _function() is None:
            return None
        n, k = weight.shape
        # the bfloat16 test reads the whole weight: only where a kernel could use its answer
        amx_fits = amx and k % 32 == 0 and k <= AMX_MAX_K and _amx_function() is not None
        exact = (amx_fits or (bf16 and _bf16_function() is not None)) and _exactly_bfloat16(weight)
        return cls(weight, amx=amx_fits and exact, bf16=exact and not amx_fits)

    @classmethod
    def from_blocks(cls, groups: torch.Tensor, n: int, k: int, amx: bool = True, kernel=None,
                    fmt: str = "q4_1") -> "PanelMatrix | None":
        """W (n, k) from its GGUF blocks (fmt "q4_1" or "q8_0") in the kernels' layout
        (`tokenswift.gguf_blocks.Blocks.groups()`; blocks already matched to the weight bit for bit): on AMX tiles
        where they serve and fit (amx: the backend's choice), else (Q4_1 only) panel_q4; None where neither serves
        the shape. kernel: the C function to use (a self-check passes the one under test, amx saying which)."""
        if k % 32 or n % 16:
            return None
        tiled = _q8_amx_function if fmt == "q8_0" else _q4_amx_function
        tiles = amx and n % 32 == 0 and k <= AMX_MAX_K and (kernel is not None or tiled() is not None)
        if not tiles and fmt == "q8_0":
            return None
        kernel = kernel or (tiled() if tiles else _q4_function())
        if kernel is None:
            return None
        m = cls.__new__(cls)
        m.out_features, m.in_features = n, k
        m.kind = (5 if fmt == "q8_0" else 4) if tiles else 3
        m._kernel, m.panels = kernel, groups.contiguous()
        return m

    @property
    def any_rows(self) -> bool:
        """Whether the kernel serves any number of rows (AMX tiles, GGUF blocks), not only up to MAX_ROWS."""
        return self.kind != 0 and self.kind != 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, K) float32 on CPU -> (T, N) float32; T <= MAX_ROWS for float32 and bfloat16 panels, any T on AMX
        tiles and GGUF blocks (`any_rows`)."""
        x = x.contiguous()
        t = x.shape[0]
        y = torch.empty(t, self.out_features, dtype=torch.float32)
        if self.kind in (1, 3, 4, 5):
            k, n = self.in_features, self.out_features
            step = t
            if t > MAX_ROWS and self.kind != 3:  # many rows on AMX tiles: in calls whose split rows stay in L2
                step = max(TILE_PASS_ROWS, int(TILE_SPLIT_BYTES / (6.4 * k)) // TILE_PASS_ROWS * TILE_PASS_ROWS)
            code = 0
            for r0 in range(0, t, step):
                r = min(step, t - r0)
                code = code or self._kernel(x.data_ptr() + r0 * 4 * k, self.panels.data_ptr(),
                                            y.data_ptr() + r0 * 4 * n, r, k, n, *_amx_scratch(r, k))
        else:
            code = self._kernel(x.data_ptr(), self.panels.data_ptr(), y.data_ptr(), t, self.in_features,
                                self.out_features)
        if code:
            raise RuntimeError(f"the native panel kernel (kind {self.kind}) refused {tuple(x.shape)} x "
                               f"{self.out_features}: code {code} (see kernels.h)")
        return y


def _exactly_bfloat16(weight: torch.Tensor) -> bool:
    if weight.dtype == torch.bfloat16:
        return True
    w = weight.detach().float()
    return bool(torch.equal(w.to(torch.bfloat16).float(), w))


def _amx_self_check(kernel) -> bool:
    """The tile state can be had, and the AMX product agrees with torch.mm to float32 rounding for 1-16 rows,
    a row of a many-row product bitwise the one-row product."""
    lib = build.library()
    lib.amx_ready.restype, lib.amx_ready.argtypes = _INT, []
    if not lib.amx_ready():
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=gen).to(torch.bfloat16).float()
    x = torch.randn(MAX_ROWS, 96, generator=gen)
    m = PanelMatrix(w, amx=True, kernel=kernel)
    ref = x.double() @ w.double().t()
    for rows in range(1, MAX_ROWS + 1):
        got = m(x[:rows])
        if not torch.allclose(got.double(), ref[:rows], rtol=1e-5, atol=1e-4):
            return False
    one = m(x[:1])
    return bool(torch.equal(one[0], m(x[:8])[0]) and torch.equal(m(x[5:6])[0], m(x[:13])[5]))


def _bf16_self_check(kernel) -> bool:
    """bfloat16 panels give bitwise the float32 panels' (checked) products of the same (bfloat16-exact) weights,
    for every row count."""
    if _function() is None:
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 200, generator=gen).to(torch.bfloat16).float()
    x = torch.randn(MAX_ROWS, 200, generator=gen)
    wide, narrow = PanelMatrix(w), PanelMatrix(w, bf16=True, kernel=kernel)
    return all(torch.equal(narrow(x[:rows]), wide(x[:rows])) for rows in range(1, MAX_ROWS + 1))


def _random_blocks(gen: torch.Generator, n: int, k: int, fmt: str = "q4_1"):
    """GGUF blocks of a random (n, k) weight: float16 d (and m) of a model's size, random codes."""
    from ..gguf_blocks import BLOCK_BYTES, Blocks

    raw = torch.randint(0, 256, (n, k // 32, BLOCK_BYTES[fmt]), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, k // 32, 2, generator=gen) * 0.02 - 0.01).half().view(torch.uint8)  # d, m
    raw[..., : 4 if fmt == "q4_1" else 2] = scales[..., : 4 if fmt == "q4_1" else 2]
    return Blocks(raw, fmt)


def _q4_product_check(kernel, tiles: bool, reference, fmt: str = "q4_1") -> bool:
    """The kernel's products of 1-16 rows are reference(values, x, got) over the bfloat16 values the blocks encode
    (`tokenswift.gguf_blocks.Blocks.values`), and a row of a many-row product is bitwise the one-row product."""
    gen = torch.Generator().manual_seed(0)
    blocks = _random_blocks(gen, 64, 96, fmt)
    values = blocks.values().float()
    m = PanelMatrix.from_blocks(blocks.groups(), 64, 96, amx=tiles, kernel=kernel, fmt=fmt)
    x = torch.randn(MAX_ROWS, 96, generator=gen)
    if not all(reference(values, x[:rows], m(x[:rows])) for rows in range(1, MAX_ROWS + 1)):
        return False
    one = m(x[:1])
    return bool(torch.equal(one[0], m(x[:8])[0]) and torch.equal(m(x[5:6])[0], m(x[:13])[5]))


def _q4_self_check(kernel) -> bool:
    """The values rebuilt in registers are bitwise what `Blocks.values` computes (gguf's dequantization rounded to
    bfloat16), and the products agree with float64 ones over them to float32 rounding, row by row."""
    dequantize = build.library().q4_dequantize
    dequantize.restype, dequantize.argtypes = _INT, [_VOID, _INT, _INT, _VOID]
    blocks, out = _random_blocks(torch.Generator().manual_seed(1), 48, 160), torch.empty(48, 160)
    groups = blocks.groups()  # alive through the call
    if dequantize(groups.data_ptr(), 48, 160, out.data_ptr()) or not torch.equal(out, blocks.values().float()):
        return False

    def close(values, x, got):
        return torch.allclose(got.double(), x.double() @ values.double().t(), rtol=1e-5, atol=1e-4)
    return _q4_product_check(kernel, False, close)


def _q4_amx_self_check(kernel) -> bool:
    """Bitwise panel_amx's products over the bfloat16 values the blocks encode, for every row count."""
    if _amx_function() is None:
        return False

    return _q4_product_check(kernel, True, _same_as_amx)


def _q8_amx_self_check(kernel) -> bool:
    """Bitwise panel_amx's products over the bfloat16 values Q8_0 blocks encode, for every row count."""
    if _amx_function() is None:
        return False
    return _q4_product_check(kernel, True, _same_as_amx, "q8_0")


def _same_as_amx(values, x, got) -> bool:
    return torch.equal(got, PanelMatrix(values, amx=True)(x))


def _self_check(kernel) -> bool:
    """The kernel agrees with torch.mm (to float32 rounding) for every group size, and a row of a
    many-row product is bitwise the one-row product."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 200, generator=gen)
    x = torch.randn(MAX_ROWS, 200, generator=gen)
    m = PanelMatrix(w, kernel=kernel)
    ref = x @ w.t()
    for rows in range(1, MAX_ROWS + 1):
        got = m(x[:rows])
        if not torch.allclose(got, ref[:rows], rtol=1e-4, atol=1e-4):
            return False
    one = m(x[:1])
    return bool(torch.equal(one[0], m(x[:8])[0]) and torch.equal(m(x[5:6])[0], m(x[:13])[5]))
