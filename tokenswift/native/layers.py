"""The decoder stack for a few new tokens in one native call (`layer_rows.c`), and its element-wise parts.

`NativeStack.build(lean)` returns None where the library cannot serve the model (no compiler, or neither
AVX-512 nor AVX2 with FMA, matrices not on the native panel kernel, an activation other than SiLU, biases other
than q/k/v's, sizes that are not multiples of 16); `rms_norm` and `silu_mul` return None where the library is unavailable.
The lean step then keeps its PyTorch path. Where the library is available the PyTorch path calls the same
element-wise functions, so every forward computes a row the same way, whichever path runs it.
"""
from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import torch

from . import build
from .abi import HeadWeights, LayerWeights
from .panels import MAX_ROWS as PANEL_MAX_ROWS
from .rows_attention import MAX_ROWS as ATTENTION_MAX_ROWS

_P, _INT, _LONG, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_SIGNATURES = {  # name -> (restype, argtypes): the functions of layer_rows.c
    "layer_rows": (_INT, [_P, _INT, _INT, ctypes.POINTER(LayerWeights), _P, _P, ctypes.POINTER(_P), ctypes.POINTER(_P),
                          _LONG, _INT, _P, _INT, _INT, _INT, _INT, _INT, _FLOAT, _FLOAT, _P, _LONG, _P]),
    "rms_norm_rows": (_INT, [_P, _P, _P, _INT, _INT, _FLOAT]),
    "silu_mul_rows": (_INT, [_P, _P, _INT, _INT]),
    "layer_rows_scratch": (_LONG, [_INT] * 7),
    "heads_top": (_INT, [_P, _INT, ctypes.POINTER(HeadWeights), _P, _INT, _INT, _INT, _INT, _P, _P, _P, _LONG]),
    "heads_top_scratch": (_LONG, [_INT, _INT]),
    "move_slots": (_INT, [ctypes.POINTER(_P), ctypes.POINTER(_P), _INT, _INT, _LONG, _INT, _P, _INT, _INT]),
}
_checked: list = []  # [the typed functions] once layer_rows has passed its self-check


def _library():
    """layer_rows.c's functions, typed, as attributes (lib.rms_norm_rows, ...); None where they are not available
    or their self-check failed."""
    if not _checked:
        restype, argtypes = _SIGNATURES["layer_rows"]
        if build.function("layer_rows", restype, argtypes, _self_check, "PyTorch") is None:
            return None
        _checked.append(_typed(build.library()))
    return _checked[0]


def _typed(lib) -> SimpleNamespace:
    """The functions of layer_rows.c in `lib`, with their types (fresh function objects: typed here alone)."""
    functions = {}
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = lib[name]
        fn.restype, fn.argtypes = restype, argtypes
        functions[name] = fn
    return SimpleNamespace(**functions)


def available() -> bool:
    return _library() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """x (T, n) and weight (n,) float32 on CPU, n a multiple of 16 -> x / sqrt(mean(x^2) + eps) * weight, or None."""
    lib = _library()
    n = x.shape[-1]
    if lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or n % 16 or x.dim() != 2:
        return None
    x = x.contiguous()
    y = torch.empty_like(x)
    code = lib.rms_norm_rows(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.shape[0], n, eps)
    return y if code == 0 else None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """gate_up (T, 2 I) float32 on CPU, I a multiple of 16 -> silu(gate) * up (T, I), or None."""
    lib = _library()
    t, two_i = gate_up.shape
    if lib is None or gate_up.dtype != torch.float32 or gate_up.device.type != "cpu" or two_i % 32:
        return None
    gate_up = gate_up.contiguous()
    y = torch.empty(t, two_i // 2, dtype=torch.float32)
    code = lib.silu_mul_rows(gate_up.data_ptr(), y.data_ptr(), t, two_i // 2)
    return y if code == 0 else None


def cache_pointers(cache):
    """The (k, v) arrays of a KVCache's per-layer buffer addresses, or None where the kernels cannot use its buffers
    (not float32 contiguous buffers on the CPU). Kept on the cache: its buffers are allocated once."""
    if cache.native_pointers is None:
        buffers = cache.k + cache.v
        if all(x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous() for x in buffers):
            layers = len(cache.k)
            cache.native_pointers = ((_P * layers)(*[x.data_ptr() for x in cache.k]),
                                     (_P * layers)(*[x.data_ptr() for x in cache.v]))
        else:
            cache.native_pointers = False
    return cache.native_pointers or None


def move_slots(cache, src_slots: list[int], dst_start: int) -> bool:
    """KVCache.compact in one native call (ascending slots with src[i] >= dst + i, as an accepted path gives them);
    False where it cannot serve (the caller then moves them with PyTorch)."""
    lib = _library()
    pointers = cache_pointers(cache) if lib is not None else None
    if pointers is None or any(s < dst_start + i or (i and s <= src_slots[i - 1]) for i, s in enumerate(src_slots)):
        return False
    k0 = cache.k[0]
    src = (ctypes.c_long * len(src_slots))(*src_slots)
    return lib.move_slots(*pointers, len(cache.k), k0.shape[0], k0.shape[1] * k0.shape[2], k0.shape[2], src,
                          len(src_slots), dst_start) == 0


class NativeHeads:
    """The multi-token heads' drafts for one hidden row in one native call (`heads_top` in layer_rows.c): per head,
    its most likely ids over the drafting LM head's rows and their softmax probabilities. Built from the lean heads
    (`tokenswift.lean.LeanHeads`) and the lean model's drafting head where every matrix is on the panel kernels."""

    MAX_TOP = 16

    def __init__(self, lean_heads, draft_head, lib) -> None:
        self._run = lib.heads_top
        self.levels = len(lean_heads.blocks)
        self.weights = (HeadWeights * self.levels)()
        for i, (in_norm, linear, post_norm, eps) in enumerate(lean_heads.blocks):
            self.weights[i] = HeadWeights(in_norm.data_ptr(), post_norm.data_ptr(), linear.panels.panels.data_ptr(),
                                           linear.panels.kind, eps)
        self._owners = (lean_heads, draft_head)  # the tensors behind the addresses above stay alive
        self.hidden, self.vocab = draft_head.in_features, draft_head.out_features
        self._lm, self._lm_kind = draft_head.panels.panels.data_ptr(), draft_head.panels.kind
        self._scratch_floats = lib.heads_top_scratch(self.hidden, self.vocab)
        self._local = threading.local()

    @classmethod
    def build(cls, lean_heads, draft_head) -> "NativeHeads | None":
        lib = _library()
        if lib is None or lean_heads is None or lean_heads.compute_dtype != torch.float32:
            return None
        matrices = [b[1] for b in lean_heads.blocks] + [draft_head]
        if any(m.panels is None or m.bias is not None for m in matrices) or draft_head.in_features % 16:
            return None
        norms = [w for b in lean_heads.blocks for w in (b[0], b[2])]
        if any(w.device.type != "cpu" or not w.is_contiguous() for w in norms):  # float32: the compute dtype
            return None
        return cls(lean_heads, draft_head, lib)

    def top(self, hidden: torch.Tensor, levels: int, k: int) -> tuple[list[list[int]], list[list[float]]] | None:
        """hidden (1, H) float32 on CPU -> per head (the first `levels`), its k most likely drafting ids and their
        probabilities, most likely first; None where this call cannot serve."""
        if (levels > self.levels or not 1 <= k <= self.MAX_TOP or hidden.dtype != torch.float32
                or hidden.device.type != "cpu" or hidden.numel() != self.hidden):
            return None
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = (torch.empty(self._scratch_floats, dtype=torch.float32),
                                       torch.empty(self.levels * self.MAX_TOP, dtype=torch.int64),
                                       torch.empty(self.levels * self.MAX_TOP, dtype=torch.float32))
        scratch, ids, probs = bufs
        hidden = hidden.contiguous()
        code = self._run(hidden.data_ptr(), levels, self.weights, self._lm, self._lm_kind, self.vocab, self.hidden, k,
                         ids.data_ptr(), probs.data_ptr(), scratch.data_ptr(), scratch.numel())
        if code != 0:
            return None
        flat_ids, flat_p = ids[: levels * k].tolist(), probs[: levels * k].tolist()
        return ([flat_ids[i * k : (i + 1) * k] for i in range(levels)],
                [flat_p[i * k : (i + 1) * k] for i in range(levels)])


def is_silu(act) -> bool:
    return type(act).__name__ in ("SiLU", "SiLUActivation")


class NativeStack:
    """Every decoder layer of a lean model for up to 16 new tokens in one call (see layer_rows.c)."""

    def __init__(self, lean, lib) -> None:
        self._run = lib.layer_rows
        layers = lean.layers
        self.weights = (LayerWeights * len(layers))()
        for i, layer in enumerate(layers):
            bias = layer.qkv.bias
            matrices = (layer.qkv.panels, layer.o.panels, layer.gate_up.panels, layer.down.panels)
            self.weights[i] = LayerWeights(layer.in_norm.data_ptr(), layer.post_norm.data_ptr(),
                                            *[m.panels.data_ptr() for m in matrices],
                                            None if bias is None else bias.data_ptr(),
                                            (_INT * 4)(*[m.kind for m in matrices]))
        self.num_layers = len(layers)
        shape = lean.shape
        self.hidden, self.hq, self.hkv, self.d = layers[0].qkv.in_features, shape.num_heads, shape.num_kv_heads, shape.head_dim
        self.inter, self.eps, self.scale = shape.intermediate, shape.eps, float(shape.scaling)
        self._scratch_size = lib.layer_rows_scratch
        self._local = threading.local()  # a scratch buffer per thread: generations may run in several threads
        self.parts = None  # a (c_double * 2): seconds in attention and in weight products are added to it (benchmarks)

    def scratch(self, capacity: int) -> torch.Tensor:
        """This thread's scratch for up to PANEL_MAX_ROWS new tokens over a cache of `capacity` slots (made once per
        thread, and again only for a larger cache)."""
        buf = getattr(self._local, "scratch", None)
        if buf is None or self._local.capacity < capacity:
            floats = self._scratch_size(PANEL_MAX_ROWS, self.hidden, self.hq, self.hkv, self.d, self.inter, capacity)
            buf = self._local.scratch = torch.empty(floats, dtype=torch.float32)
            self._local.capacity = capacity
        return buf

    @classmethod
    def build(cls, lean) -> "NativeStack | None":
        lib = _library()
        if lib is None or lean.device.type != "cpu" or lean.compute_dtype != torch.float32 or not lean.native_rows:
            return None
        for layer in lean.layers:
            if (not is_silu(layer.act) or layer.o.bias is not None or layer.gate_up.bias is not None
                    or layer.down.bias is not None):
                return None
        shape = lean.shape
        if shape.head_dim not in (64, 128) or shape.num_heads % shape.num_kv_heads or shape.intermediate % 16:
            return None
        if lean.layers[0].qkv.in_features % 16:
            return None
        return cls(lean, lib)

    def serves(self, t: int) -> bool:
        """True for t new tokens where the attention would take the native kernel too (attention.attend's routing,
        at any context length): then this call computes exactly what the PyTorch path would."""
        return t <= PANEL_MAX_ROWS and t * (self.hq // self.hkv) <= ATTENTION_MAX_ROWS

    @property
    def max_tokens(self) -> int:
        """The most new tokens one call serves (16 for the default model): beyond, a step takes the PyTorch path,
        measured 1.7x the time of 16 rows at 17 rows (1.1K context, 2-vCPU AVX2 host)."""
        return max(t for t in range(1, PANEL_MAX_ROWS + 1) if self.serves(t))

    def run(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, start: int,
            block_mask: torch.Tensor | None) -> bool:
        """h (T, hidden) float32 contiguous, updated in place; cos, sin (T, d) contiguous; cache a KVCache of
        float32 CPU buffers (Hkv, capacity, d). False where the kernels declined (then h and the new tokens' cache
        slots may be partly written: the caller runs the PyTorch path from the start)."""
        t = h.shape[0]
        if start + t > cache.capacity:
            raise RuntimeError(f"KV cache overflow: need {start + t} slots, capacity is {cache.capacity}")
        pointers = cache_pointers(cache)
        if pointers is None:
            return False
        k_ptrs, v_ptrs = pointers
        mask = None
        if block_mask is not None:  # bool is one byte: a contiguous bool mask is read as bytes without a copy
            mask = block_mask.contiguous()
            mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)
        scratch = self.scratch(cache.capacity)
        code = self._run(h.data_ptr(), t, self.num_layers, self.weights, cos.data_ptr(), sin.data_ptr(), k_ptrs, v_ptrs,
                         cache.capacity * self.d, start, None if mask is None else mask.data_ptr(), self.hidden,
                         self.hq, self.hkv, self.d, self.inter, self.eps, self.scale, scratch.data_ptr(), scratch.numel(),
                         self.parts)
        return code == 0


def _self_check(layer_rows) -> bool:
    """The element-wise functions agree with PyTorch's (to float32 rounding), row by row."""
    lib = _typed(build.library())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen) * 3
    w = torch.randn(64, generator=gen)
    y = torch.empty_like(x)
    lib.rms_norm_rows(x.data_ptr(), w.data_ptr(), y.data_ptr(), 5, 64, 1e-6)
    ref = torch.nn.functional.rms_norm(x, (64,), w, 1e-6)
    if not torch.allclose(y, ref, rtol=1e-5, atol=1e-6):
        return False
    gu = torch.randn(5, 64, generator=gen) * 6
    out = torch.empty(5, 32)
    lib.silu_mul_rows(gu.data_ptr(), out.data_ptr(), 5, 32)
    ref = torch.nn.functional.silu(gu[:, :32]) * gu[:, 32:]
    if not torch.allclose(out, ref, rtol=1e-5, atol=1e-6):
        return False
    one = torch.empty(1, 64)
    lib.rms_norm_rows(x[3:4].contiguous().data_ptr(), w.data_ptr(), one.data_ptr(), 1, 64, 1e-6)
    return bool(torch.equal(one[0], y[3]))
