"""The numbers that fix a decoder's shape, read once from a Hugging Face model: what every compute path needs."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ModelShape:
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (fewer than num_heads: grouped-query attention)
    head_dim: int
    scaling: float  # the attention scores' factor (usually head_dim ** -0.5)
    hidden_size: int
    vocab_size: int
    intermediate: int  # the MLP's inner width
    eps: float  # the RMS norms' epsilon

    @classmethod
    def of(cls, model: nn.Module) -> "ModelShape":
        config, layer = model.config, model.model.layers[0]
        attn = layer.self_attn
        return cls(config.num_attention_heads, config.num_key_value_heads, attn.head_dim, attn.scaling,
                   config.hidden_size, config.vocab_size, layer.mlp.down_proj.in_features,
                   float(getattr(config, "rms_norm_eps", 1e-6)))
