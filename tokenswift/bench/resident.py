"""The process's resident memory while one generation streams (paper sampling settings, seed 0).

    python -m tokenswift.bench memory --model assets/default-model [--method ar] [--tokens 1000] [--every 250]

What a long run costs beyond its KV cache.
"""
from __future__ import annotations

import torch

from ..memory import resident_mb


def memory(model: str, method: str, tokens: int, every: int) -> dict:
    from ..generator import Generator
    from ..settings import PAPER_SAMPLING, Settings

    gen = Generator.from_pretrained(model)
    settings = Settings(**PAPER_SAMPLING)
    before = resident_mb()
    points = []
    for step in gen.stream("It is a truth universally acknowledged, that", settings, tokens, method=method, seed=0):
        if not points or step.generated - points[-1][0] >= every or step.done:
            points.append((step.generated, round(resident_mb(), 1)))
    return {"benchmark": "memory", "model": model, "method": method, "rss_mb_after_load": round(before, 1),
            "rss_mb_by_tokens": points, "kv_cache_mb_end": round(step.cache.bytes / 2**20, 1),
            "threads": torch.get_num_threads(), "torch": torch.__version__}
