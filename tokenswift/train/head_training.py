"""What both heads trainers do alike (`train-heads` on text, tokenswift/train/heads.py, and by self-distillation,
tokenswift/train/distill_heads.py): read the hidden states the heads read, schedule the learning rate, and
update the heads. Kept apart from both so that neither imports the other for it.
"""
from __future__ import annotations

import math

import torch

from ..heads import Heads


def last_layer_hidden(model, ids: torch.Tensor, bf16: bool) -> torch.Tensor:
    """(B, T, H) output of the last decoder layer, before the final norm (what the heads read)."""
    captured = {}

    def hook(_module, _inputs, output):
        captured["h"] = output[0] if isinstance(output, tuple) else output

    handle = model.model.layers[-1].register_forward_hook(hook)
    try:
        with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            model.model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
    return captured["h"].float()


def lr_at(s, step: int, elapsed_s: float = 0.0) -> float:
    """Linear warm-up, then cosine to zero over the run, whose progress is the larger of the step
    fraction and (with a time budget) the elapsed-time fraction. `s` has lr, warmup, steps and minutes."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    if s.minutes:
        progress = max(progress, elapsed_s / (s.minutes * 60))
    return 0.5 * s.lr * (1 + math.cos(math.pi * min(1.0, progress)))


def optimizer_step(opt: torch.optim.Optimizer, heads: Heads, loss: torch.Tensor) -> None:
    """Backward, gradient clipping at norm 1 and one step: the heads trainers' update."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
    opt.step()
