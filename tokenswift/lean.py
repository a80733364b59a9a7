"""The lean decode step: the same function as the model's own forward, in far fewer torch ops.

At load the weights of each decoder layer are laid out once for the fastest matmul measured on this
machine: q/k/v fused into one matrix, gate/up fused into one, every matrix pre-transposed so that a row
of activations times it is a plain `mm`, the norms' weights and the rotary tables precomputed. The hot
loop calls no nn.Module: about 40 torch ops per layer instead of about 75.

Why (measured on a 2-vCPU Xeon with AVX-512 and AMX, one thread, the default model): an AR step through
the model's modules with bf16 weights took about 12 ms at 1.1K context, most of it in `F.linear` with
bf16 weights at one row and in per-module overhead; the lean step takes about 9 ms.

On CPU every product is float32 arithmetic, even for a bf16 checkpoint. Measured here at one row, float32
was as fast as bf16 or faster for every matrix of the default model through PyTorch (qkv 43 vs 64 us, o 26 vs
46, gate/up 139 vs 163, down 64 vs 86, LM head 487 vs 633, weights streamed from L3), and bf16 products round
their *outputs* to 8 bits: a one-row and a 16-row product then differ by up to 0.4%, enough to flip sampled
tokens between AR and verification (seen: a sample 0.0016 from a CDF boundary). float32 keeps AR and
TokenSwift the same function up to float32 rounding. Where the native kernels serve (tokenswift/native), a
matrix whose weights are exactly bf16 (the default model's) keeps them as bf16 and multiplies on AMX tiles
with every float32 input split into three exact bf16 parts: exact products, float32 sums, half the bytes;
and for up to 16 new tokens the whole decoder stack runs in one native call (layer_rows.c), which removes
the PyTorch ops around the products (measured at 1.1K context: one forward and its logits 7.2 -> 3.4 ms
with float32 panels, then about 2.2 ms with AMX). Both AR and verification use this same step, so the race
between them stays fair. On CUDA the model's dtype is kept.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attend
from .backend import Backend
from .gguf_blocks import Blocks, attached as attached_blocks
from .kv_cache import KVCache
from .model_shape import ModelShape
from .native import layers as native_layers, panels as native_panels

DRAFT_VOCAB = 1024  # token ids the heads rank when drafting on a CPU (see LeanModel.draft_head)
MAX_COPY_BYTES = 2 * 2**30  # lay out copies only for models whose copies fit in this (else: module path)
ROPE_STATIC_TYPES = ("default", "linear", "llama3", "yarn")  # rotary tables independent of sequence length


_dnn_pack = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None) if torch.backends.mkldnn.is_available() else None
_dnn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if _dnn_pack is not None else None
MM_MAX_ROWS = 6  # up to this many rows a plain `mm`; more rows through oneDNN with a pre-packed weight


class Matrix:
    """One weight matrix laid out for the fastest product with a few rows of activations.

    Where the native panel kernel is available (`tokenswift/native/panels.py`: a C compiler and AVX-512 or AVX2),
    float32 products of up to 16 rows go through it: it streams the weights once for up to 12 rows, so
    verifying 12 rows costs about what one row does in the matrices, and a row's result does not depend on
    how many rows are computed with it. Otherwise, and beyond 16 rows, PyTorch as follows.

    Measured here (fp32, one thread, weights streamed from L3, microseconds for 1 / 8 / 16 / 32 rows):
    gate/up 2048x384 `mm` on a pre-transposed weight 110 / 140 / 260 / 461, oneDNN on a pre-packed
    weight 132 / 168 / 206 / 363; LM head 8192x384 434 / 557 / 967 / 1,810 vs 483 / 647 / 803 / 1,376.
    So `mm` up to 6 rows (AR, small trees) and oneDNN beyond (big trees; LM head at 8 rows 1,180 vs 677). float32 on CPU only; elsewhere
    (or without oneDNN) always `mm`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, backend: Backend,
                 blocks: Blocks | None = None) -> None:
        """weight: (out, in) as nn.Linear stores it. blocks: the GGUF blocks the weight was converted from, if known
        (tokenswift.gguf_blocks): streamed instead of the weight where they encode it exactly and a kernel serves."""
        self.bias = bias
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        self.packed = self.panels = None
        use_dnn = backend.switches.lean_matmul == "auto"
        if use_dnn and dtype == torch.float32 and backend.serves("panels"):
            tiles = blocks is not None and backend.serves("amx") and backend.serves(f"amx {blocks.format[:2]} blocks")
            served = blocks is not None and (tiles or (blocks.format == "q4_1" and backend.serves("q4 blocks")))
            groups = blocks.groups() if served else None
            if groups is not None and weight.device.type == "cpu" and blocks.matches(weight):
                self.panels = native_panels.PanelMatrix.from_blocks(groups, *blocks.shape, amx=tiles, fmt=blocks.format)
            if self.panels is None:
                self.panels = native_panels.PanelMatrix.build(weight, backend.serves("amx"), backend.serves("bf16 panels"))
        any_rows = self.panels is not None and self.panels.any_rows  # serves every row count: no other copy needed
        on_cpu = weight.device.type == "cpu"
        if _dnn_linear is not None and use_dnn and dtype == torch.float32 and on_cpu and not any_rows:
            self.packed = _dnn_pack(weight.to(dtype).contiguous(), 16)
        # (in, out) for torch.mm: not needed where panels and oneDNN (or AMX / blocks alone) cover every row count
        covered = any_rows or (self.panels is not None and self.packed is not None)
        self.weight_t = None if covered else weight.t().to(dtype).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, in) -> (T, out) in x's dtype."""
        # AMX tiles and GGUF blocks serve every row count (prefill chunks and big trees too: their rows then match
        # AR's bitwise); float32 panels up to MAX_ROWS, oneDNN beyond
        few = x.shape[0] <= native_panels.MAX_ROWS or (self.panels is not None and self.panels.any_rows)
        if self.panels is not None and few and (x.dtype == torch.float32 or self.weight_t is None):
            # another dtype only where the panels are the one copy of the weights kept
            y = self.panels(x) if x.dtype == torch.float32 else self.panels(x.float()).to(x.dtype)
            return y if self.bias is None else y + self.bias
        if self.packed is not None and (x.shape[0] > MM_MAX_ROWS or self.weight_t is None) and x.dtype == torch.float32:
            return _dnn_linear(x, self.packed, self.bias, "none", [], "")
        y = torch.mm(x if x.dtype == self.dtype else x.to(self.dtype), self.weight_t)
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias


@dataclass
class LeanLayer:
    in_norm: torch.Tensor  # (H,)
    qkv: Matrix  # H -> (Hq + 2 Hkv) d
    o: Matrix  # Hq d -> H
    post_norm: torch.Tensor
    gate_up: Matrix  # H -> 2 I
    down: Matrix  # I -> H
    act: nn.Module


def eligible(model: nn.Module) -> bool:
    """The lean step needs every weight on one real device (no accelerate offload hooks) and copies that fit."""
    if any(getattr(m, "_hf_hook", None) is not None for m in model.modules()):
        return False
    params = list(model.parameters())
    devices = {p.device for p in params}
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return False
    copy_bytes = sum(p.numel() for p in params) * 8  # float32 pre-transposed + packed
    budget = copy_budget()
    if copy_bytes > budget:
        warnings.warn(f"the lean step needs about {copy_bytes / 2**30:.1f} GiB of weight copies and this machine has "
                      f"{budget / 2**30:.1f} GiB to spare for them: running the model's own modules (slower)")
        return False
    return True


def copy_budget() -> int:
    """Bytes the lean step's weight copies may take: MAX_COPY_BYTES, or up to 60% of the memory available now
    where that is more (a 1B-parameter model's copies take about 8 GiB)."""
    try:
        import psutil

        available = psutil.virtual_memory().available
    except Exception:  # no psutil: what the kernel reports as free
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return max(MAX_COPY_BYTES, int(0.6 * available))


class DraftHead:
    """The LM head over the drafting vocabulary (FR-Spec's observation, arXiv 2502.14856): drafts are almost always
    frequent tokens, and a BPE vocabulary lists tokens roughly by frequency (merges in the order they were learned),
    so by default the heads rank only the first DRAFT_VOCAB ids on a CPU. Measured on the default model: the heads'
    top-3 hit rate on their own output unchanged (0.228 vs 0.232 for head 0), and a consult's LM-head product 8x
    smaller (468 -> 22 us for 3 rows). Drafts only: every verified token still comes from the full head. Heads
    trained with a drafting vocabulary of their own (measured coverage, most frequent first; see
    tokenswift.train.distill_heads) bring it: `set`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, full: Matrix, dtype: torch.dtype, on_cpu: bool,
                 backend: Backend) -> None:
        self._weight, self._bias, self._full = weight, bias, full  # (V, H), (V,) or None, the full head's matrix
        self._dtype, self._on_cpu, self._backend = dtype, on_cpu, backend
        self.set(None)

    def set(self, ids: torch.Tensor | None) -> None:
        """The token ids the heads rank: `ids` (distinct, in the order given), or None for the default. `ids` (the
        attribute) maps a row of `matrix` back to its token id (None: row i is id i); `size` counts the rows."""
        vocab = self._weight.shape[0]
        if ids is None:
            self.ids = None
            self.size = DRAFT_VOCAB if self._on_cpu and vocab > 2 * DRAFT_VOCAB else vocab
            rows = slice(0, self.size)
        else:
            ids = ids.to(torch.int64).cpu()
            self.ids = ids.tolist()
            self.size = len(self.ids)
            rows = ids.to(self._weight.device)
        if ids is None and self.size == vocab:
            self.matrix = self._full
        else:
            bias = None if self._bias is None else self._bias[rows]
            self.matrix = Matrix(self._weight[rows], bias, self._dtype, self._backend)


class RotaryTables:
    """cos and sin of the rotary embedding for given positions, (T, 1, d) in the compute dtype: from tables grown on
    demand where the rotary type does not depend on the sequence length, else from the model's rotary module."""

    def __init__(self, rotary: nn.Module, static: bool, dtype: torch.dtype, device: torch.device) -> None:
        self.rotary, self.static, self.dtype, self.device = rotary, static, dtype, device
        self._cos = self._sin = None  # (n, d) tables

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.static:
            x = torch.empty(1, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(x, positions[None])
            return cos[0, :, None].to(self.dtype), sin[0, :, None].to(self.dtype)
        need = int(positions.max()) + 1
        if self._cos is None or self._cos.shape[0] < need:
            size = max(need, 2 * (0 if self._cos is None else self._cos.shape[0]), 4096)
            x = torch.empty(1, dtype=torch.float32, device=self.device)
            cos, sin = self.rotary(x, torch.arange(size, device=self.device)[None])
            self._cos, self._sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        return self._cos[positions][:, None], self._sin[positions][:, None]


class LeanModel:
    """forward(ids, positions, cache, start, block_mask, capture_queries) with the adapter's contract."""

    def __init__(self, model: nn.Module, shape: ModelShape, backend: Backend) -> None:
        self.backend = backend
        inner = model.model
        device = next(model.parameters()).device
        self.device = device
        self.model_dtype = inner.embed_tokens.weight.dtype
        on_cpu = device.type == "cpu"
        self.compute_dtype = torch.float32 if on_cpu else self.model_dtype
        self.shape = shape
        self.dtypes: dict[str, str] = {}  # matrix name -> chosen dtype (for reports)
        cd = self.compute_dtype
        self.layers: list[LeanLayer] = []
        by_name = attached_blocks(model)  # the GGUF blocks the weights were converted from, where known
        by_tensor = {id(p): by_name[n] for n, p in model.named_parameters(remove_duplicate=False) if n in by_name}

        def blocks(*weights: torch.Tensor) -> Blocks | None:
            return Blocks.stack([by_tensor.get(id(w)) for w in weights]) if by_tensor else None

        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
            qkv_b = None
            if a.q_proj.bias is not None:
                qkv_b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach().to(cd)
            gu_w = torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()
            self.layers.append(LeanLayer(
                in_norm=layer.input_layernorm.weight.detach().to(cd),
                qkv=self._matrix("qkv", qkv_w, qkv_b, blocks(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)),
                o=self._matrix("o", a.o_proj.weight.detach(),
                               None if a.o_proj.bias is None else a.o_proj.bias.detach().to(cd), blocks(a.o_proj.weight)),
                post_norm=layer.post_attention_layernorm.weight.detach().to(cd),
                gate_up=self._matrix("gate_up", gu_w, None, blocks(m.gate_proj.weight, m.up_proj.weight)),
                down=self._matrix("down", m.down_proj.weight.detach(), None, blocks(m.down_proj.weight)),
                act=m.act_fn,
            ))
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach().to(cd)
        head = model.lm_head
        # Logits stay float32 on CPU: bf16 logits tie too often for greedy decoding (resolution 1/16 near 10).
        head_b = None if head.bias is None else head.bias.detach().float()
        self.head = Matrix(head.weight.detach(), head_b, cd, backend, blocks(head.weight))
        self.drafting = DraftHead(head.weight.detach(), head_b, self.head, cd, on_cpu, backend)
        # True when the matrices run through the native panel kernel: a few verified rows then cost little more than one
        self.native_rows = all(m.panels is not None for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
        params = getattr(model.config, "rope_parameters", None) or {}
        self.rope = RotaryTables(inner.rotary_emb, params.get("rope_type", "default") in ROPE_STATIC_TYPES, cd, device)
        # The decoder stack for a few new tokens in one native call (tokenswift/native/layer_rows.c), where the
        # library serves this model; where the library is available the PyTorch path below uses its norms and
        # SiLU too, so a row is computed the same way by either path.
        native = backend.serves("layers")
        # the stack attends with the native kernel: only where the PyTorch path does too (the same numbers)
        self.native_stack = native_layers.NativeStack.build(self) if native and backend.serves("attention") else None
        self.native_elementwise = native and device.type == "cpu" and self.compute_dtype == torch.float32
        self.native_silu = self.native_elementwise and all(native_layers.is_silu(layer.act) for layer in self.layers)

    # ---- the drafting vocabulary (DraftHead) --------------------------------------------------------------
    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        self.drafting.set(ids)

    @property
    def draft_ids(self) -> list[int] | None:
        return self.drafting.ids

    @property
    def draft_vocab(self) -> int:
        return self.drafting.size

    @property
    def draft_head(self) -> "Matrix":
        return self.drafting.matrix

    def _matrix(self, name: str, weight: torch.Tensor, bias: torch.Tensor | None, blocks: Blocks | None) -> Matrix:
        dtype = self.compute_dtype
        if self.device.type == "cpu" and self.backend.switches.lean_dtype == "model":
            dtype = self.model_dtype
        self.dtypes[name] = str(dtype).replace("torch.", "")
        return Matrix(weight, bias, dtype, self.backend, blocks)

    # ---- the step ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, start: int,
                block_mask: torch.Tensor | None = None, capture_queries: bool = False,
                window_mask=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids, positions: (T,) int64 -> hidden (T, H) before the final norm, and per layer the rotated
        queries (Hq, T, d) when `capture_queries`. window_mask(layer, positions) -> extra mask or None."""
        dev = self.device
        ids, pos = ids.to(dev), positions.to(dev)
        if block_mask is not None:
            block_mask = block_mask.to(dev)
        t = ids.shape[0]
        shape = self.shape
        hq, hkv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
        h = self.embed[ids].to(self.compute_dtype)  # (T, H)
        cos, sin = self.rope(pos)  # (T, 1, d)
        stack = self.native_stack
        if (stack is not None and not capture_queries and window_mask is None and type(cache) is KVCache
                and stack.serves(t)):
            # h is a fresh tensor (indexing copies): the stack updates it in place
            if stack.run(h, cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous(), cache, start, block_mask):
                return h, []
            h = self.embed[ids].to(self.compute_dtype)  # declined: the PyTorch path from the start
        half = d // 2
        nqk = (hq + hkv) * d
        queries: list[torch.Tensor] = []
        native = self.backend.serves("attention")
        for i, layer in enumerate(self.layers):
            x = self.norm_rows(h, layer.in_norm)
            qkv = layer.qkv(x)  # (T, (Hq + 2 Hkv) d)
            qk = qkv[:, :nqk].view(t, hq + hkv, d)
            rotated = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
            qk = qk * cos + rotated * sin  # (T, Hq + Hkv, d)
            q = qk[:, :hq].transpose(0, 1)  # (Hq, T, d)
            k = qk[:, hq:].transpose(0, 1)  # (Hkv, T, d)
            v = qkv[:, nqk:].view(t, hkv, d).transpose(0, 1)
            cache.write(i, start, k, v)
            keys, values = cache.keys(i, start + t)  # (Hkv, S, d)
            extra = window_mask(i, pos) if window_mask is not None else None
            o = attend(q.to(keys.dtype), keys, values, shape.scaling, block_mask, extra, native)  # (Hq, T, d)
            h = h + layer.o(o.transpose(0, 1).reshape(t, hq * d).to(h.dtype))
            x = self.norm_rows(h, layer.post_norm)
            gate_up = layer.gate_up(x)
            act = native_layers.silu_mul(gate_up) if self.native_silu else None
            if act is None:
                gate, up = gate_up.split(shape.intermediate, dim=-1)
                act = layer.act(gate) * up
            h = h + layer.down(act)
            if capture_queries:
                queries.append(q)
        return h, queries

    def norm_rows(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMS norm of each row (the native function where the library is available, see __init__)."""
        if self.native_elementwise:
            y = native_layers.rms_norm(x, weight, self.shape.eps)
            if y is not None:
                return y
        return F.rms_norm(x, (x.shape[-1],), weight, self.shape.eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (T, H) before the final norm -> logits (T, V) float32."""
        return self.head(self.norm_rows(hidden.to(self.compute_dtype), self.norm)).float()


class LeanHeads:
    """The multi-token heads in the lean layout: float32 (on CPU) pre-laid-out matrices and norm weights,
    no module calls (measured: 3 heads over one row took about 1.2 ms through their modules in bf16)."""

    def __init__(self, heads: nn.Module, compute_dtype: torch.dtype, backend: Backend) -> None:
        self.blocks = []
        for block in heads.layers:
            eps = float(getattr(block.input_layernorm, "variance_epsilon", getattr(block.input_layernorm, "eps", 1e-6)))
            self.blocks.append((block.input_layernorm.weight.detach().to(compute_dtype),
                                Matrix(block.linear.weight.detach(), None, compute_dtype, backend),
                                block.post_layernorm.weight.detach().to(compute_dtype), eps))
        self.compute_dtype = compute_dtype

    @torch.inference_mode()
    def __call__(self, h0: torch.Tensor, levels: int) -> torch.Tensor:
        """h0: (T, H) -> the first `levels` heads' outputs after their post norms, (levels, T, H)."""
        h = h0.to(self.compute_dtype)
        outs = []
        for in_norm, linear, post_norm, eps in self.blocks[:levels]:
            h = h + linear(F.rms_norm(h, (h.shape[-1],), in_norm, eps))
            outs.append(F.rms_norm(h, (h.shape[-1],), post_norm, eps))
        return torch.stack(outs)
