"""Self-distillation data for the heads: text the model itself samples with the paper's settings.

Heads that learn the model's own continuations (rather than the corpus's) draft what the model will
actually sample, which raises acceptance when sampling (Medusa-2's self-distillation idea). Prompts
are random training-split windows (Austen-weighted); generation is batched HF `generate` on the CPU.

    python -m tokenswift.train.selfgen --model DIR --corpus ../shared/corpus --out runs/selfgen
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from .corpus import AUSTEN_SOURCES, load_corpus


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(prog="python -m tokenswift.train.selfgen")
    p.add_argument("--model", required=True)
    p.add_argument("--corpus", default="../shared/corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=960)
    p.add_argument("--austen-weight", type=float, default=0.75)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    splits = load_corpus(args.corpus)
    austen = tok.encode("".join(splits[n].train for n in AUSTEN_SOURCES), add_special_tokens=False)
    kjv = tok.encode(splits["kjv"].train, add_special_tokens=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for b in tqdm(range(args.batches), desc="selfgen"):
        path = out / f"batch{b:03d}.txt"
        if path.exists():
            continue  # resume
        prompts = []
        for _ in range(args.batch_size):
            src = austen if random.random() < args.austen_weight else kjv
            start = random.randrange(0, len(src) - args.prompt_tokens)
            prompts.append(src[start : start + args.prompt_tokens])
        ids = torch.tensor(prompts)
        t = time.time()
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, min_p=0.1,
                                 repetition_penalty=1.2, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=tok.eos_token_id)
        texts = [tok.decode(row[args.prompt_tokens:].tolist(), clean_up_tokenization_spaces=False) for row in gen]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(t_.replace("<|endoftext|>", "") for t_ in texts) + "\n", encoding="utf-8")
        tmp.replace(path)
        tqdm.write(f"batch {b}: {args.batch_size * args.new_tokens / (time.time() - t):.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
