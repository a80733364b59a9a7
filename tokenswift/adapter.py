"""Run a Hugging Face causal LM with our own cache and attention, calling the model's own submodules.

Nothing is copied from the modeling files: projections, norms, MLP, rotary embedding and the rotary
application function all come from the loaded model (so biases, tied embeddings and rope scaling are
whatever the model was configured with). The adapter only knows where those pieces live.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from .attention import attend
from .backend import Backend, current as current_backend
from .lean import LeanModel, eligible
from .model_shape import ModelShape

SUPPORTED_FAMILIES = ("llama", "qwen2", "mistral")


class CacheLike(Protocol):
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None: ...
    def keys(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def key_positions(self, layer: int, end: int) -> torch.Tensor: ...


def module_device(module: nn.Module) -> torch.device:
    """Where a module computes: accelerate's execution device when hooked, else its first real parameter."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


@dataclass(frozen=True)
class Devices:
    """Where a model's parts sit (one device each, or one per decoder layer: accelerate's device_map)."""
    layers: list[torch.device]
    embed: torch.device
    head: torch.device
    norm: torch.device


class ModelAdapter:
    """Forward passes of a supported HF causal LM over a `CacheLike` cache.

    forward(ids, positions, cache, start, block_mask) writes the K/V of the T new tokens at slots
    [start, start + T) and lets them attend to slots [0, start) plus each other through `block_mask`.
    It returns the last decoder layer's output *before* the final norm (what the heads read).
    """

    def __init__(self, model: nn.Module, backend: Backend | None = None) -> None:
        """backend: the compute backend (default: this process's, tokenswift.backend.current())."""
        self.backend = backend if backend is not None else current_backend()
        config = model.config
        family = getattr(config, "model_type", None)
        if family not in SUPPORTED_FAMILIES or not hasattr(model, "model") or not hasattr(model, "lm_head"):
            raise ValueError(
                f"unsupported model type {family!r} ({type(model).__name__}): TokenSwift supports causal LMs of the "
                f"{', '.join(SUPPORTED_FAMILIES)} families (e.g. LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)"
            )
        self.model = model
        self.layers = list(model.model.layers)
        self.shape = ModelShape.of(model)
        self.windows = [self._window_of(i, layer) for i, layer in enumerate(self.layers)]
        self._apply_rope = sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self.devices = Devices([module_device(layer) for layer in self.layers], module_device(model.model.embed_tokens),
                               module_device(model.lm_head), module_device(model.model.norm))
        # The lean step (fused, pre-transposed weights; no module calls) wherever the weights sit on one
        # device; accelerate-offloaded models go through their own modules. TOKENSWIFT_LEAN=0 turns it off.
        self.lean: LeanModel | None = None
        if self.backend.lean and eligible(model):
            self.lean = LeanModel(model, self.shape, self.backend)

    # ---- what the model is (read-only views of its config, shape and placement) --------------------------------
    config = property(lambda self: self.model.config)
    family = property(lambda self: self.model.config.model_type)
    inner = property(lambda self: self.model.model)
    num_heads = property(lambda self: self.shape.num_heads)
    num_kv_heads = property(lambda self: self.shape.num_kv_heads)
    head_dim = property(lambda self: self.shape.head_dim)
    scaling = property(lambda self: self.shape.scaling)
    hidden_size = property(lambda self: self.shape.hidden_size)
    vocab_size = property(lambda self: self.shape.vocab_size)
    layer_devices = property(lambda self: self.devices.layers)
    embed_device = property(lambda self: self.devices.embed)
    head_device = property(lambda self: self.devices.head)
    norm_device = property(lambda self: self.devices.norm)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.embed_tokens.weight.dtype if self.inner.embed_tokens.weight.device.type != "meta" else torch.float32

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's dtype. On CPU, half-precision models keep K/V (and compute attention) in float32:
        CPU bf16 matmuls build and keep a kernel for every new key length, which grows the process by
        about 0.8 MB per generated token (measured), while float32 attention holds memory flat and is
        about as fast. Elsewhere the cache uses the model's dtype."""
        dtype = self.dtype
        on_cpu = all(d.type == "cpu" for d in self.layer_devices)
        return torch.float32 if on_cpu and dtype in (torch.bfloat16, torch.float16) else dtype

    def _window_of(self, index: int, layer: nn.Module) -> int | None:
        if self.family == "mistral":
            return getattr(self.config, "sliding_window", None)
        if self.family == "qwen2":
            return getattr(layer.self_attn, "sliding_window", None)
        return None

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: CacheLike,
        start: int,
        block_mask: torch.Tensor | None = None,
        capture_queries: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids, positions: (T,) int64. block_mask: (T, T) bool, True = may attend (None: all).
        Returns hidden (T, hidden) before the final norm, and per layer the rotated queries (Hq, T, d)
        when `capture_queries`."""
        if self.lean is not None:
            windowed = any(w is not None for w in self.windows)
            window_mask = (lambda i, pos: self._window_mask(i, cache, start, pos)) if windowed else None
            return self.lean.forward(ids, positions, cache, start, block_mask, capture_queries, window_mask)
        t = ids.shape[0]
        h = self.inner.embed_tokens(ids.to(self.embed_device)[None])  # (1, T, H)
        pos = positions.to(h.device)
        cos, sin = self.inner.rotary_emb(h, pos[None])  # (1, T, d) each
        per_device: dict[torch.device, tuple] = {}
        queries: list[torch.Tensor] = []
        hq, hkv, d = self.shape.num_heads, self.shape.num_kv_heads, self.shape.head_dim
        native = self.backend.serves("attention")
        for i, layer in enumerate(self.layers):
            device = self.devices.layers[i]
            if device not in per_device:
                mask = None if block_mask is None else block_mask.to(device)
                per_device[device] = (cos.to(device), sin.to(device), mask, pos.to(device))
            cos_d, sin_d, mask_d, pos_d = per_device[device]
            h = h.to(device)
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, t, hq, d).transpose(1, 2)  # (1, Hq, T, d)
            k = attn.k_proj(x).view(1, t, hkv, d).transpose(1, 2)  # (1, Hkv, T, d)
            v = attn.v_proj(x).view(1, t, hkv, d).transpose(1, 2)
            q, k = self._apply_rope(q, k, cos_d, sin_d)
            cache.write(i, start, k[0], v[0])
            keys, values = cache.keys(i, start + t)  # (Hkv, S, d)
            extra = self._window_mask(i, cache, start, pos_d)
            o = attend(q[0].to(keys.dtype), keys, values, self.shape.scaling, mask_d, extra, native).to(h.dtype)
            o = o.transpose(0, 1).reshape(1, t, hq * d)
            h = h + attn.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if capture_queries:
                queries.append(q[0])
        return h[0], queries

    def _window_mask(self, layer: int, cache: CacheLike, start: int, positions: torch.Tensor) -> torch.Tensor | None:
        """(Hkv or 1, T, S) bool for sliding-window layers, None when every key is inside the window."""
        window = self.windows[layer]
        if window is None or int(positions.max()) < window:
            return None
        prefix = cache.key_positions(layer, start).to(positions.device)  # (Hkv or 1, start)
        block = positions[None].expand(prefix.shape[0], -1)
        keys = torch.cat([prefix, block], dim=1)  # (Hkv or 1, S)
        return (positions[None, :, None] - keys[:, None, :]) < window

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (T, H) before the final norm -> logits (T, V) in float32."""
        if self.lean is not None:
            return self.lean.logits(hidden)
        x = hidden.to(self.norm_device)
        if self._float_head_weight() is not None:
            x = x.float()  # HF RMSNorms keep a float32 input in float32
        return self.logits_from_normed(self.inner.norm(x))

    @torch.inference_mode()
    def logits_from_normed(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, H) already normalised (the heads' post norm) -> LM-head logits (T, V) in float32."""
        if self.lean is not None:
            return self.lean.head(x.to(self.lean.compute_dtype)).float()
        weight = self._float_head_weight()
        if weight is None:
            return self.model.lm_head(x.to(self.head_device)).float()
        return torch.nn.functional.linear(x.to(self.head_device).float(), weight)

    def _float_head_weight(self) -> torch.Tensor | None:
        """A float32 copy of the LM head's weight for half-precision models on CPU, else None.

        bf16 logits have a resolution of 1/16 near 10, so the top two tokens often tie exactly and
        greedy decoding then hangs on rounding noise between a 1-token and an N-token forward; float32
        logits remove those artificial ties. The copy is rebuilt if the weight is modified in place."""
        w = self.model.lm_head.weight
        if w.device.type != "cpu" or w.dtype not in (torch.bfloat16, torch.float16) or self.model.lm_head.bias is not None:
            return None
        key = (w.data_ptr(), w._version, w.dtype)
        kept = getattr(self, "_float_head", None)  # (key, copy)
        if kept is None or kept[0] != key:
            kept = self._float_head = (key, w.detach().float())
        return kept[1]
