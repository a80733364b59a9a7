"""Measure a trained default model for its model card: per-source bits per character, per-head accuracy,
TokenSwift acceptance with the paper's settings, AR speed, and a long generation's health.

    python -m tokenswift.train.evaluate --model assets/default-model --corpus ../shared/corpus --out runs/eval.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..generator import Generator
from ..settings import PAPER_SAMPLING, Settings
from .acceptance_bound import ranks_along, tokens_per_iteration
from .corpus import ALL_SOURCES, AUSTEN_SOURCES, load_corpus
from .heads import head_accuracy
from .lm import evaluate as lm_evaluate
from .lm import make_val_group

PAPER = dict(**PAPER_SAMPLING, ngram_reuse=True, ngram_topk=20)


def distinct(tokens: list[int], n: int) -> float:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def bits_per_char(gen: Generator, splits, context: int) -> dict[str, dict[str, float]]:
    model = gen.model
    eot = gen.tokenizer.eos_token_id
    out = {}
    groups = {name: [splits[name].val] for name in ALL_SOURCES}
    groups["austen (all six)"] = [splits[n].val for n in AUSTEN_SOURCES]
    for name, texts in groups.items():
        group = make_val_group(name, texts, gen.tokenizer, eot, context)
        m = lm_evaluate(model.float(), group, bf16=True)
        out[name] = {"loss": round(m["loss"], 4), "ppl": round(m["ppl"], 2), "bpc": round(m["bpc"], 4)}
    model.to(gen.adapter.dtype)
    return out


def austen_prefix(gen: Generator, splits, tokens: int) -> list[int]:
    ids = gen.tokenizer.encode(splits["persuasion"].val + splits["emma"].val, add_special_tokens=False)
    return ids[:tokens]


def acceptance(gen: Generator, prompt: list[int], new: int, tree: str, seed: int, budget: int) -> dict:
    settings = Settings(tree=tree, kv_budget=budget, **PAPER)
    result = gen.generate(prompt, settings, new, method="tokenswift", seed=seed)
    s = result.stats
    return {"tree": tree, "kv_budget": budget, "new_tokens": s["new_tokens"], "iterations": s["iterations"],
            "mean_accepted": round(s["mean_accepted"], 3), "accepted_by_source": s["accepted_by_source"],
            "per_iteration_from_heads": round(s["accepted_by_source"].get("head", 0) / s["iterations"], 3),
            "per_iteration_from_ngrams": round(s["accepted_by_source"].get("ngram", 0) / s["iterations"], 3),
            "tokens_per_s": round(s["tokens_per_s"], 1)}


BOUND_TREES = ("1x3x3x3", "3x3x3x3", "4x4x4x4", "8x6x4x3", "16x16x16x16")


def acceptance_bound(gen: Generator, prompt: list[int], new: int, seed: int) -> dict:
    """Tokens per iteration the product trees can reach on this model with its heads and with perfect
    heads (see acceptance_bound.py), along one AR sample with the paper's settings."""
    result = gen.generate(prompt, Settings(**PAPER), new, method="ar", seed=seed)
    ids = torch.tensor(prompt + result.token_ids)
    model, heads = gen.model.float(), gen.heads.float() if gen.heads is not None else None
    try:
        ranks = ranks_along(model, heads, ids, len(prompt), PAPER["penalty"], PAPER["penalty_window"])
    finally:
        model.to(gen.adapter.dtype)
        if heads is not None:
            gen.set_heads(heads)
    p1 = float((ranks["base"] == 0).float().mean())
    trees = {}
    for spec in BOUND_TREES:
        widths = [int(w) for w in spec.split("x")]
        trees[spec] = {"shipped_heads": round(tokens_per_iteration(ranks, widths, oracle=False), 3),
                       "oracle_heads": round(tokens_per_iteration(ranks, widths, oracle=True), 3)}
    head_top1 = {k: round(float((v == 0).float().mean()), 3) for k, v in ranks.items() if k.startswith("head")}
    return {"new_tokens": new, "seed": seed, "p_sample_is_base_top1": round(p1, 3),
            "paper_tree_upper_bound": round(1 + 4 * p1, 3), "trees_without_ngrams": trees,
            "head_top1_on_own_samples": head_top1}


def ar_speed(gen: Generator, prompt: list[int], new: int) -> float:
    gen.generate(prompt, Settings(), 16, method="ar")  # warm-up
    t = time.perf_counter()
    gen.generate(prompt, Settings(), new, method="ar")
    return new / (time.perf_counter() - t)


def long_run(gen: Generator, prompt: list[int], new: int, seed: int) -> dict:
    settings = Settings(kv_budget=2048, **PAPER)
    t = time.perf_counter()
    result = gen.generate(prompt, settings, new, method="tokenswift", seed=seed)
    tail = result.token_ids[-2000:]
    return {"new_tokens": len(result.token_ids), "seconds": round(time.perf_counter() - t, 1),
            "mean_accepted": round(result.stats["mean_accepted"], 3),
            "distinct_last_2000": {f"distinct_{n}": round(distinct(tail, n), 3) for n in (1, 2, 4)},
            "most_common_token_share_last_2000": round(max(tail.count(t) for t in set(tail)) / len(tail), 3),
            "tail_text": gen.decode(tail[-300:])}


def samples(gen: Generator, prompts: list[str], new: int) -> list[dict]:
    out = []
    for i, p in enumerate(prompts):
        r = gen.generate(p, Settings(**PAPER), new, seed=i)
        out.append({"prompt": p, "settings": "temperature 1.0, min-p 0.1, penalty 1.2/1024", "seed": i, "text": r.text})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenswift.train.evaluate")
    p.add_argument("--model", required=True)
    p.add_argument("--corpus", default="../shared/corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--long", type=int, default=20000, help="tokens of the long generation (0: skip)")
    p.add_argument("--trees", default="1x3x3x3,1x2x2x2,2x2x2,1x2x2", help="trees to measure acceptance with")
    p.add_argument("--update", action="store_true", help="keep what --out already holds, replace only the parts measured")
    p.add_argument("--parts", default="bpc,heads,accept,bound,speed,long,samples")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    gen = Generator.from_pretrained(args.model)
    splits = load_corpus(args.corpus)
    parts = set(args.parts.split(","))
    out = Path(args.out)
    report: dict = json.loads(out.read_text()) if args.update and out.exists() else {}
    report.update({"model": args.model, "params": sum(p.numel() for p in gen.model.parameters())})

    def save():
        out.write_text(json.dumps(report, indent=2) + "\n")

    if "bpc" in parts:
        report["bits_per_char"] = bits_per_char(gen, splits, args.context)
        save()
    if "heads" in parts and gen.heads is not None:
        ids = torch.tensor(gen.tokenizer.encode("".join(splits[n].val for n in AUSTEN_SOURCES), add_special_tokens=False))
        windows = [ids[i : i + 512] for i in range(0, ids.numel() - 512, 512)]
        heads = gen.heads.float()
        report["head_accuracy_austen_val"] = head_accuracy(gen.model.float(), heads, windows, bf16=True)
        gen.model.to(gen.adapter.dtype)
        gen.set_heads(heads)
        save()
    prompt = austen_prefix(gen, splits, 1100)
    if "accept" in parts:
        report["acceptance_2000_tokens"] = [acceptance(gen, prompt, 2000, tree, 0, 4096) for tree in args.trees.split(",")]
        save()
    if "bound" in parts:
        report["acceptance_bound"] = acceptance_bound(gen, prompt, 2000, 0)
        save()
    if "speed" in parts:
        short = austen_prefix(gen, splits, 64)
        report["ar_tokens_per_s_short_context"] = round(ar_speed(gen, short, 256), 1)
        save()
    if "long" in parts and args.long:
        report["long_generation"] = long_run(gen, prompt[:256], args.long, 0)
        save()
    if "samples" in parts:
        report["samples"] = samples(gen, ["It is a truth universally acknowledged, that",
                                          "Mr. Darcy and Elizabeth walked together in silence, until",
                                          "And the LORD spake unto Moses, saying,"], 120)
        save()
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
