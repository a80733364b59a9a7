"""Greedy decoding speed of our AR loop against HF `generate` on a random-init Llama.

    python -m tokenswift.bench ar-vs-hf [--new 256] [--repeats 3] [--dtype float32]

About 25M parameters (8 layers, hidden 512, 8 heads, 2 KV heads, vocab 8192), batch 1, a 64-token prompt. The two
run alternately; the ratio of medians is printed, and the outputs are checked equal.
"""
from __future__ import annotations

import platform
import statistics
import time

import torch

from ..kinds import Method


def random_llama(seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
                      initializer_range=0.05, tie_word_embeddings=True, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def ar_vs_hf(new: int, repeats: int, dtype: torch.dtype) -> dict:
    from ..generator import Generator
    from ..settings import Settings

    model = random_llama(dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    gen = Generator(model)
    prompt = torch.randint(0, 8192, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    ours_tps, hf_tps, same = [], [], True
    for _ in range(repeats):
        t = time.perf_counter()
        ours = gen.generate(prompt, Settings(), new, method=Method.AR).token_ids
        ours_tps.append(new / (time.perf_counter() - t))  # wall time including prefill, like HF's
        t = time.perf_counter()
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 64, dtype=torch.long),
                                max_new_tokens=new, do_sample=False)[0, 64:].tolist()
        hf_tps.append(new / (time.perf_counter() - t))
        same = same and hf == ours
    return {"benchmark": "ar-vs-hf", "params_m": round(params / 1e6, 1), "dtype": str(dtype).replace("torch.", ""),
            "new_tokens": new, "repeats": repeats, "threads": torch.get_num_threads(),
            "ours_tok_s": round(statistics.median(ours_tps), 1), "hf_tok_s": round(statistics.median(hf_tps), 1),
            "ratio": round(statistics.median(ours_tps) / statistics.median(hf_tps), 2), "identical_tokens": same,
            "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
