"""AR and TokenSwift after long prompts: where long-context verification on a CPU spends its time.

    python -m tokenswift.bench context --model assets/default-model --text ../shared/corpus/emma.txt \
            [--contexts 8000 16000] [--tokens 120]

Paper sampling settings, seed 0, after a prompt of each length cut from --text: tokens/s over the methods' own
compute, and per iteration the draft and verification times, the tree size and the accepted tokens.
"""
from __future__ import annotations

import torch

from ..kinds import Method


def context(model: str, text_path: str, contexts: list[int], tokens: int) -> dict:
    from ..generator import Generator
    from ..settings import PAPER_SAMPLING, Settings

    gen = Generator.from_pretrained(model)
    with open(text_path, encoding="utf-8") as f:
        ids = gen.encode(f.read()[: 20 * max(contexts)])  # about 4-5 characters per token: plenty
    settings = Settings(**PAPER_SAMPLING)
    rows = []
    for length in contexts:
        if len(ids) < length:
            raise ValueError(f"--text has {len(ids):,} tokens, fewer than the {length:,} asked for")
        for method in Method:
            steps = [s for s in gen.stream(ids[:length], settings, tokens, method=method, seed=0) if s.index > 0]
            made = sum(s.accepted_length for s in steps)
            draft = sum(s.timings.draft_s for s in steps)
            verify = sum(s.timings.verify_s for s in steps)
            total = sum(s.timings.total_s for s in steps)
            n = len(steps)
            rows.append({"context": length, "method": method, "tok_s": round(made / total, 1),
                         "tokens_per_iteration": round(made / n, 2), "draft_ms": round(1e3 * draft / n, 1),
                         "verify_ms": round(1e3 * verify / n, 1), "tree_nodes": round(sum(len(s.tree) for s in steps) / n, 1)})
    return {"benchmark": "context", "model": model, "text": text_path, "new_tokens": tokens, "rows": rows,
            "threads": torch.get_num_threads(), "torch": torch.__version__}
