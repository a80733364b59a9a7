"""Benchmarks with stated conditions, printing ratios measured side by side in one run.

    python -m tokenswift.bench ar-vs-hf [--new 256] [--repeats 3]
        Greedy decoding speed of our AR loop vs HF `generate` on a random-init Llama of about 25M
        parameters (8 layers, hidden 512, 8 heads, 2 KV heads, vocab 8192), fp32, batch 1, 64-token prompt.
        The two run alternately; the ratio of medians is printed, and the outputs are checked equal.

    python -m tokenswift.bench memory --model assets/default-model [--method ar] [--tokens 1000]
        The process's resident memory while one generation streams (paper sampling settings, seed 0):
        what a long run costs beyond its KV cache.

    python -m tokenswift.bench context --model assets/default-model --text ../shared/corpus/emma.txt \
            [--contexts 8000 16000] [--tokens 120]
        AR and TokenSwift (paper sampling settings, seed 0) after a prompt of each length cut from --text:
        tokens/s over the methods' own compute, and per iteration the draft and verification times, the
        tree size and the accepted tokens. Where long-context verification on CPU spends its time.

    python -m tokenswift.bench suffix-bound [--penalty 1.2] [--context 1024] [--tokens 1000] [--row-costs 1:1,3:1.07]
        Tokens per iteration that suffix-match drafts alone could give, were every verified row free:
        drafts of up to 1..16 tokens replayed over our own greedy output (an upper bound for that source); and
        the bound for any drafter that works from the text, told which earlier occurrence to follow; with the
        host's row costs, the tokens per step that would give verifying exactly what is accepted.

    python -m tokenswift.bench draft-hits [--context 1024] [--tokens 1000]
        How often the suffix match's and the datastore's first guess is the next token along our own AR
        continuation (greedy, greedy + penalty 1.2, the paper's sampling; seed 0), and how often the
        datastore is right where the suffix match is not.

    python -m tokenswift.bench rows [--context 1024] [--rows 1 2 4 9 12] [--repeats 60]
        One lean forward (and the logits) of each number of new tokens over a held-out prompt's cache, split into
        attention, weight matrices, logits and the rest: what a verified row costs. See tokenswift/bench_rows.py.

    python -m tokenswift.bench parts [--row greedy] [--context 1024] [--tokens 1000] [--repeats 2] [--detail]
        Our AR's steps and TokenSwift auto's iterations in real generations, split into the forward, the logits and
        the Python around them (drafting and its parts, verification inputs, the walk, the decision, bookkeeping):
        what a drafted iteration costs beyond its rows, in AR steps. See tokenswift/bench_parts.py.

    python -m tokenswift.bench bonus-head [--train-tokens 240000] [--epochs 3] [--penalty 1.0] [--tokens 1000]
        Trains a probe head that sees the token it follows (Hydra / EAGLE style) on the frozen model, then counts
        along our AR continuation of a held-out prompt how often its first guess is right where the suffix match
        and the datastore are not: what such heads could add. See tokenswift/bench_bonus_head.py.

    python -m tokenswift.bench speed [--contexts 1024 16000] [--tokens 1000] [--repeats 3] [--auto-tree auto]
        Our AR, TokenSwift (auto tree, paper tree) and HF generate (bf16, fp32, prompt lookup) on held-out corpus
        prompts, greedy / greedy+penalty / paper sampling, 1 thread: tok/s, ratios, an ids-equal check;
        writes runs/bench-speed/{results.json,table.md,speed.png}. See tokenswift/bench_speed.py.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Callable

import torch

from .kinds import Method, Source


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
    from .generator import Generator
    from .settings import Settings

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


def _proc_mb(path: str, field: str) -> float:
    """A "Field:  N kB" line of a /proc file, in MiB (nan when absent)."""
    with open(path) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


def resident_mb(pid: int | str = "self") -> float:
    """Resident memory of a process (this one by default), in MiB, from /proc."""
    return _proc_mb(f"/proc/{pid}/status", "VmRSS:")


def peak_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process (this one by default), in MiB, from /proc."""
    return _proc_mb(f"/proc/{pid}/status", "VmHWM:")


def proportional_mb(pid: int | str = "self") -> float:
    """A process's proportional set size (shared pages split among their users), in MiB."""
    return _proc_mb(f"/proc/{pid}/smaps_rollup", "Pss:")


def child_pids(pid: int) -> list[int]:
    """The direct children of a process, from /proc (Linux)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def memory(model: str, method: str, tokens: int, every: int) -> dict:
    from .generator import Generator
    from .settings import PAPER_SAMPLING, Settings

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


def context(model: str, text_path: str, contexts: list[int], tokens: int) -> dict:
    from .generator import Generator
    from .settings import PAPER_SAMPLING, Settings

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


def best_matches(prompt: list[int], out: list[int], cap: int) -> list[int]:
    """Per position i of `out`: the longest run of out[i:] (at most `cap` tokens) that some earlier occurrence of
    the last known token continues with, reading only the text known before i (a continuation that reaches the
    end of the known text repeats its period, as `SuffixIndex.lookup` does). The most any drafter working from the
    text itself could draft there, were it told which occurrence to follow."""
    seq = list(prompt) + list(out)
    start = len(prompt)
    where: dict[int, list[int]] = {}
    for j in range(start - 1):  # occurrences whose successor is known
        where.setdefault(seq[j], []).append(j)
    best = []
    for i in range(start, len(seq)):
        top = 0
        for j in where.get(seq[i - 1], ()):
            c, m = j + 1, 0
            period = i - c
            while m < cap and i + m < len(seq) and seq[c + m % period] == seq[i + m]:
                m += 1
            top = max(top, m)
        best.append(top)
        where.setdefault(seq[i - 1], []).append(i - 1)
    return best


def replay(matches: list[int], row_cost: Callable[[int], float] | None = None) -> tuple[float, float | None]:
    """Iterations that each accept the drafted run at their position plus one token: (tokens per iteration, and
    where `row_cost(q)` gives a q-row verification's time in one-row steps, tokens per step when every iteration
    verifies exactly its accepted run: no missed draft, no planning)."""
    i = iterations = 0
    steps = 0.0
    while i < len(matches):
        m = matches[i]
        iterations += 1
        steps += row_cost(m + 1) if row_cost is not None else 0.0
        i += m + 1
    return len(matches) / iterations, (len(matches) / steps if row_cost is not None else None)


def row_cost_curve(text: str) -> Callable[[int], float]:
    """'1:1,3:1.07,8:1.94' (rows: time of that many rows in one-row steps, `bench rows`) -> the cost of q rows as
    auto's cost model prices it from such points (`CostModel.cost`: linear between them, the last slope beyond)."""
    from .auto import CostModel

    points = sorted((int(a), float(b)) for a, b in (item.split(":") for item in text.split(",")))
    model = CostModel()
    model.rows, model.seconds = [q for q, _ in points], [c for _, c in points]
    return model.cost


def suffix_bound(model: str, text_path: str, context: int, tokens: int, penalty: float,
                 row_costs: str | None = None) -> dict:
    """Tokens per iteration that suffix-match drafts alone could give if every verified row were free:
    replay drafts of up to L tokens over our own greedy AR output (accept the matching prefix, plus one). And the
    bound for any drafter working from the text (`best_matches`): told which earlier occurrence to follow, with up
    to L tokens; with `row_costs`, the tokens per step it would reach verifying exactly what is accepted."""
    from .generator import Generator
    from .settings import Settings
    from .suffix import SuffixIndex
    from .train.corpus import split_text

    gen = Generator.from_pretrained(model)
    with open(text_path, encoding="utf-8") as f:
        ids = gen.encode(split_text(f.read())[1])[:context]
    out = gen.generate(ids, Settings(penalty=penalty), tokens, method=Method.AR).token_ids
    rows, best, speed = {}, {}, {}
    cost = row_cost_curve(row_costs) if row_costs else None
    for limit in (1, 2, 4, 8, 16):
        index, i, iterations = SuffixIndex(), 0, 0
        index.extend(ids)
        while i < len(out):
            _, draft = index.lookup(limit)
            hit = 0
            while hit < len(draft) and i + hit < len(out) and draft[hit] == out[i + hit]:
                hit += 1
            made = min(hit + 1, len(out) - i)
            index.extend(out[i : i + made])
            i, iterations = i + made, iterations + 1
        rows[limit] = round(len(out) / iterations, 2)
        per_iteration, per_step = replay(best_matches(ids, out, limit), cost)
        best[limit] = round(per_iteration, 2)
        if per_step is not None:
            speed[limit] = round(per_step, 2)
    result = {"benchmark": "suffix-bound", "model": model, "context": len(ids), "new_tokens": tokens, "penalty": penalty,
              "tokens_per_iteration_by_draft_length": rows, "best_occurrence_tokens_per_iteration": best}
    if cost is not None:
        result["best_occurrence_tokens_per_step"] = speed
        result["row_costs"] = row_costs
    return result


HIT_SAMPLING = {"greedy": dict(), "greedy+penalty": dict(penalty=1.2),
                "paper": dict(temperature=1.0, min_p=0.1, penalty=1.2)}


def draft_hits(model: str, text_path: str, context: int, tokens: int) -> dict:
    """How often each cheap drafter's first guess is the next token, along our own AR continuation of a
    held-out prompt (seed 0): the suffix match, the model's datastore, and the datastore where the suffix
    match missed (what it adds)."""
    from .generator import Generator
    from .settings import Settings
    from .suffix import SuffixIndex
    from .train.corpus import split_text

    gen = Generator.from_pretrained(model)
    if gen.datastore is None:
        raise SystemExit(f"{model} has no datastore.safetensors")
    with open(text_path, encoding="utf-8") as f:
        ids = gen.encode(split_text(f.read())[1])[:context]
    rows = {}
    for name, sampling in HIT_SAMPLING.items():
        out = gen.generate(ids, Settings(**sampling), tokens, method=Method.AR, seed=0).token_ids
        index = SuffixIndex()
        index.extend(ids)
        suffix = store = store_only = 0
        for i, token in enumerate(out):
            guess = index.lookup(1)[1]
            suffix_hit = bool(guess) and guess[0] == token
            found = gen.datastore.lookup(index.tokens)[1]  # the index holds the text so far
            store_hit = bool(found) and found[0][0] == token
            suffix, store, store_only = suffix + suffix_hit, store + store_hit, store_only + (store_hit and not suffix_hit)
            index.extend([token])
        n = len(out)
        rows[name] = {Source.SUFFIX: round(suffix / n, 3), Source.DATASTORE: round(store / n, 3),
                      "datastore_where_suffix_missed": round(store_only / n, 3)}
    return {"benchmark": "draft-hits", "model": model, "context": len(ids), "new_tokens": tokens,
            "top1_hit_rate": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenswift.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ar-vs-hf", help="our AR vs HF generate, greedy, random ~25M Llama")
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    m = sub.add_parser("memory", help="resident memory while one generation streams")
    m.add_argument("--model", default="assets/default-model")
    m.add_argument("--method", default=Method.AR, choices=list(Method))
    m.add_argument("--tokens", type=int, default=1000)
    m.add_argument("--every", type=int, default=250)
    c = sub.add_parser("context", help="AR and TokenSwift speed after long prompts")
    c.add_argument("--model", default="assets/default-model")
    c.add_argument("--text", required=True, help="a plain-text file to cut the prompts from")
    c.add_argument("--contexts", type=int, nargs="+", default=[8000, 16000])
    c.add_argument("--tokens", type=int, default=120)
    b = sub.add_parser("suffix-bound", help="tokens/iteration suffix drafts alone could give, rows free (greedy)")
    b.add_argument("--model", default="assets/default-model")
    b.add_argument("--text", default="../shared/corpus/emma.txt", help="prompt from its held-out part")
    b.add_argument("--context", type=int, default=1024)
    b.add_argument("--tokens", type=int, default=1000)
    b.add_argument("--penalty", type=float, default=1.0)
    b.add_argument("--row-costs", default=None, help="'1:1,3:1.07,...': q rows' time in one-row steps (bench rows)")
    h = sub.add_parser("draft-hits", help="how often the suffix match and the datastore guess the next token")
    h.add_argument("--model", default="assets/default-model")
    h.add_argument("--text", default="../shared/corpus/emma.txt", help="prompt from its held-out part")
    h.add_argument("--context", type=int, default=1024)
    h.add_argument("--tokens", type=int, default=1000)
    r = sub.add_parser("rows", help="one forward of 1, 2, ... new tokens, split into attention, matrices and the rest")
    r.add_argument("--model", default="assets/default-model")
    r.add_argument("--text", default="../shared/corpus/emma.txt", help="prompt from its held-out part")
    r.add_argument("--context", type=int, default=1024)
    r.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 9, 12])
    r.add_argument("--repeats", type=int, default=60)
    q = sub.add_parser("parts", help="AR steps and auto iterations in the decode loop, split into parts")
    q.add_argument("--model", default="assets/default-model")
    q.add_argument("--row", default="greedy", choices=["greedy", "greedy+penalty", "paper"])
    q.add_argument("--context", type=int, default=1024)
    q.add_argument("--tokens", type=int, default=1000)
    q.add_argument("--repeats", type=int, default=2)
    q.add_argument("--detail", action="store_true", help="per-node events, as the app asks for them")
    q.add_argument("--text", default=None, help="prompt from this file's held-out part (default: the corpus's, "
                                                "as bench speed)")
    o = sub.add_parser("bonus-head", help="what a head that sees the token it follows could add to auto's drafts")
    o.add_argument("--model", default="assets/default-model")
    o.add_argument("--train-tokens", type=int, default=240_000)
    o.add_argument("--epochs", type=int, default=3)
    o.add_argument("--penalty", type=float, default=1.0)
    o.add_argument("--context", type=int, default=1024)
    o.add_argument("--tokens", type=int, default=1000)
    o.add_argument("--seed", type=int, default=0)
    from . import bench_speed

    bench_speed.add_arguments(sub.add_parser("speed", help="AR, TokenSwift and HF generate speed, ratios"))
    args = parser.parse_args(argv)
    if args.command == "speed":
        return bench_speed.run_cli(args)
    if args.command == "ar-vs-hf":
        print(json.dumps(ar_vs_hf(args.new, args.repeats, getattr(torch, args.dtype))))
    elif args.command == "memory":
        print(json.dumps(memory(args.model, args.method, args.tokens, args.every)))
    elif args.command == "suffix-bound":
        print(json.dumps(suffix_bound(args.model, args.text, args.context, args.tokens, args.penalty, args.row_costs)))
    elif args.command == "draft-hits":
        print(json.dumps(draft_hits(args.model, args.text, args.context, args.tokens)))
    elif args.command == "rows":
        from .bench_rows import rows

        print(json.dumps(rows(args.model, args.text, args.context, args.rows, args.repeats)))
    elif args.command == "parts":
        from .bench_parts import parts

        print(json.dumps(parts(args.model, args.row, args.context, args.tokens, args.repeats, args.detail, args.text)))
    elif args.command == "bonus-head":
        from .bench_bonus_head import bonus_head

        print(json.dumps(bonus_head(args.model, args.train_tokens, args.epochs, args.penalty, args.context,
                                    args.tokens, args.seed)))
    elif args.command == "context":
        print(json.dumps(context(args.model, args.text, args.contexts, args.tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
