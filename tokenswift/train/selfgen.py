"""Self-distillation data for the heads: text the model itself produces (by default sampled with the paper's settings).

Heads that learn the model's own continuations (rather than the corpus's) draft what the model will
actually sample, which raises acceptance when sampling (Medusa-2's self-distillation idea). Prompts
are random training-split windows (Austen-weighted); generation is batched HF `generate` on the CPU.

    python -m tokenswift.train.selfgen --model DIR --corpus ../shared/corpus --out runs/selfgen

--mode picks what the heads will be verified against: "sample" (the paper's T=1, min-p 0.1, penalty 1.2),
"greedy" (argmax, no penalty) or "greedy-penalty" (argmax with repetition penalty 1.2; HF applies it over
the whole context rather than the engine's last-1024-token window, close enough for training data).
--prompt-tokens-max > --prompt-tokens draws each batch's prompt length uniformly in that range.
--save-ids also writes batchNNN.pt (prompt length and the full token rows) for exact evaluation.
--prompts FILE draws prompts from FILE's paragraphs (blank-line separated; e.g. tokenswift/train/data/
general_prompts.txt) instead of corpus windows; rows are then left-padded to the batch's longest prompt and
batchNNN.pt records each row's padding ("left_pad").
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from .corpus import AUSTEN_SOURCES, load_corpus

MODES = {
    "sample": dict(do_sample=True, temperature=1.0, min_p=0.1, repetition_penalty=1.2),
    "greedy": dict(do_sample=False),
    "greedy-penalty": dict(do_sample=False, repetition_penalty=1.2),
}


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(prog="python -m tokenswift.train.selfgen")
    p.add_argument("--model", required=True, help="a model folder, or a built-in model's name (smollm2-135m)")
    p.add_argument("--corpus", default="../shared/corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=960)
    p.add_argument("--austen-weight", type=float, default=0.75)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=MODES, default="sample")
    p.add_argument("--prompt-tokens-max", type=int, default=0, help="0: every prompt is --prompt-tokens long")
    p.add_argument("--first-batch", type=int, default=0, help="number of the first batch file (to extend a run)")
    p.add_argument("--save-ids", action="store_true", help="also save the token rows as batchNNN.pt")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--prompts", default=None, help="a text file of prompts (paragraphs) instead of corpus windows")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    from ..builtin import resolve_model

    args.model = resolve_model(args.model)  # a built-in name -> its fetched folder (never the Hub)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    if args.prompts:
        return generate_from_prompts(args, tok, model)
    splits = load_corpus(args.corpus)
    austen = tok.encode("".join(splits[n].train for n in AUSTEN_SOURCES), add_special_tokens=False)
    kjv = tok.encode(splits["kjv"].train, add_special_tokens=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen_kwargs = dict(MODES[args.mode])
    for b in tqdm(range(args.first_batch, args.first_batch + args.batches), desc=f"selfgen {args.mode}"):
        path = out / f"batch{b:03d}.txt"
        # prompt choices are drawn even for finished batches, so a resumed run reproduces the same prompts
        plen = args.prompt_tokens
        if args.prompt_tokens_max > args.prompt_tokens:
            plen = random.randint(args.prompt_tokens, args.prompt_tokens_max)
        prompts = []
        for _ in range(args.batch_size):
            src = austen if random.random() < args.austen_weight else kjv
            start = random.randrange(0, len(src) - plen)
            prompts.append(src[start : start + plen])
        if path.exists():
            continue  # resume
        ids = torch.tensor(prompts)
        t = time.time()
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=tok.eos_token_id)
        if args.save_ids:
            torch.save({"prompt_tokens": plen, "ids": gen.clone(), "mode": args.mode}, path.with_suffix(".pt"))
        texts = [tok.decode(row[plen:].tolist(), clean_up_tokenization_spaces=False) for row in gen]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(t_.replace("<|endoftext|>", "") for t_ in texts) + "\n", encoding="utf-8")
        tmp.replace(path)
        tqdm.write(f"batch {b}: {args.batch_size * args.new_tokens / (time.time() - t):.0f} tok/s")
    return 0


def generate_from_prompts(args: argparse.Namespace, tok, model) -> int:
    """Batches whose rows continue prompts drawn from a file's paragraphs (left-padded to the longest)."""
    from tqdm import tqdm

    paragraphs = [p.strip() for p in Path(args.prompts).read_text(encoding="utf-8").split("\n\n") if p.strip()]
    if not paragraphs:
        raise SystemExit(f"no prompts in {args.prompts}")
    encoded = [tok.encode(p, add_special_tokens=False) for p in paragraphs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pad_id = tok.eos_token_id if tok.eos_token_id is not None else 0
    for b in tqdm(range(args.first_batch, args.first_batch + args.batches), desc=f"selfgen {args.mode} (prompts)"):
        path = out / f"batch{b:03d}.txt"
        rows = [encoded[random.randrange(len(encoded))] for _ in range(args.batch_size)]
        if path.exists():
            continue  # resume (the prompt draws above keep later batches reproducible)
        width = max(len(r) for r in rows)
        left_pad = torch.tensor([width - len(r) for r in rows])
        ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
        mask = (torch.arange(width)[None] >= left_pad[:, None]).long()
        t = time.time()
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, **dict(MODES[args.mode]), max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, pad_token_id=pad_id)
        if args.save_ids:
            torch.save({"prompt_tokens": width, "ids": gen.clone(), "left_pad": left_pad, "mode": args.mode},
                       path.with_suffix(".pt"))
        texts = [tok.decode(row[width:].tolist(), clean_up_tokenization_spaces=False) for row in gen]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(texts) + "\n", encoding="utf-8")
        tmp.replace(path)
        tqdm.write(f"batch {b}: {args.batch_size * args.new_tokens / (time.time() - t):.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
