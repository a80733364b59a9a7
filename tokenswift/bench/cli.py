"""The command line of the benchmarks: `python -m tokenswift.bench COMMAND ...` (the commands are listed in
tokenswift/bench/__init__.py). Each command's module is imported when it runs."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..builtin import resolve_model
from ..kinds import Method
from ..train.corpus import default_corpus_dir
from . import speed
from .conditions import conditions, print_conditions
from .prompts import held_out_prompts
from .report import headline, markdown_table, speed_figure, write_png
from .speed import load_hf_models, method_settings, run_speed


EMMA = str(default_corpus_dir() / "emma.txt")  # the default book of the commands that read one (any working folder)


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
    b.add_argument("--text", default=EMMA, help="prompt from its held-out part (default: %(default)s)")
    b.add_argument("--context", type=int, default=1024)
    b.add_argument("--tokens", type=int, default=1000)
    b.add_argument("--penalty", type=float, default=1.0)
    b.add_argument("--row-costs", default=None, help="'1:1,3:1.07,...': q rows' time in one-row steps (bench rows)")
    h = sub.add_parser("draft-hits", help="how often the suffix match and the datastore guess the next token")
    h.add_argument("--model", default="assets/default-model")
    h.add_argument("--text", default=EMMA, help="prompt from its held-out part (default: %(default)s)")
    h.add_argument("--context", type=int, default=1024)
    h.add_argument("--tokens", type=int, default=1000)
    r = sub.add_parser("rows", help="one forward of 1, 2, ... new tokens, split into attention, matrices and the rest")
    r.add_argument("--model", default="assets/default-model")
    r.add_argument("--text", default=EMMA, help="prompt from its held-out part (default: %(default)s)")
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
    speed.add_arguments(sub.add_parser("speed", help="AR, TokenSwift and HF generate speed, ratios"))
    k = sub.add_parser("cpu-kind", help="every speed run the README's table asks of this kind of CPU, resumable")
    k.add_argument("--out-dir", default="runs/cpu-kind")
    k.add_argument("--variants", nargs="+", default=None,
                   help="kernel variants to run (native, amx, avx512bf16, avx512, avx2; default: native, the AVX2 build "
                        "where the CPU runs a wider one, and avx512bf16 on AVX-512 BF16 CPUs without AMX)")
    k.add_argument("--tokens", type=int, default=1000, help="new tokens per run")
    k.add_argument("--rounds", type=int, default=3, help="alternated rounds of SmolLM2's rows per variant")
    k.add_argument("--no-smollm2", action="store_true", help="the default model's steps only")
    k.add_argument("--redo", action="store_true", help="run every step again, even those with results")
    args = parser.parse_args(argv)
    if args.command == "speed":
        return speed_command(args)
    if args.command == "cpu-kind":
        from .cpu_kind import main as cpu_kind_main

        return cpu_kind_main(args)
    if args.command == "ar-vs-hf":
        from .ar_vs_hf import ar_vs_hf

        print(json.dumps(ar_vs_hf(args.new, args.repeats, getattr(torch, args.dtype))))
    elif args.command == "memory":
        from .resident import memory

        print(json.dumps(memory(args.model, args.method, args.tokens, args.every)))
    elif args.command == "suffix-bound":
        from .drafts import suffix_bound

        print(json.dumps(suffix_bound(args.model, args.text, args.context, args.tokens, args.penalty, args.row_costs)))
    elif args.command == "draft-hits":
        from .drafts import draft_hits

        print(json.dumps(draft_hits(args.model, args.text, args.context, args.tokens)))
    elif args.command == "rows":
        from .rows import rows

        print(json.dumps(rows(args.model, args.text, args.context, args.rows, args.repeats)))
    elif args.command == "parts":
        from .parts import parts

        print(json.dumps(parts(args.model, args.row, args.context, args.tokens, args.repeats, args.detail, args.text)))
    elif args.command == "bonus-head":
        from .bonus_head import bonus_head

        print(json.dumps(bonus_head(args.model, args.train_tokens, args.epochs, args.penalty, args.context,
                                    args.tokens, args.seed)))
    elif args.command == "context":
        from .context import context

        print(json.dumps(context(args.model, args.text, args.contexts, args.tokens)))
    return 0


def speed_command(args: argparse.Namespace) -> int:
    """`bench speed`: load, state the conditions, run (speed.py), then write the results and the report (report.py)."""
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from ..generator import Generator

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        method_settings("greedy", "tokenswift-auto", args.auto_tree)
    except ValueError as e:
        print(f"--auto-tree {args.auto_tree!r} is not accepted by this engine ({e}); try e.g. --auto-tree small",
              file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model)  # a built-in name -> its fetched folder, for HF's loads too
    gen = Generator.from_pretrained(model_dir, dtype=args.dtype)
    hf_models = {} if args.no_hf else load_hf_models(model_dir)
    prompts = held_out_prompts(gen.encode, args.contexts, Path(args.corpus) if args.corpus else None)
    prompts = {k: prompts[k] for k in args.contexts}
    cond = conditions(gen, {"model": args.model, "new_tokens": args.tokens, "repeats": args.repeats,
                            "auto_tree": args.auto_tree, "seed": args.seed, "rows": list(args.rows),
                            "paper_tree": not args.no_paper,
                            "contexts": list(args.contexts), "hf_dtypes": list(hf_models),
                            "pld_dtype": args.pld_dtype or "faster HF dtype of each row's first repeat"}, prompts)
    print_conditions(cond)
    sys.stdout.flush()
    t = time.perf_counter()
    results = run_speed(gen, hf_models, {k: v["ids"] for k, v in prompts.items()}, list(args.rows), args.tokens,
                        args.repeats, args.auto_tree, args.seed, args.pld_dtype, progress=not args.no_progress,
                        paper=not args.no_paper)
    cond["bench_wall_s"] = round(time.perf_counter() - t, 1)
    results = {"benchmark": "speed", "conditions": cond, **results}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    table = markdown_table(results)
    (out / "table.md").write_text(table + "\n")
    png = write_png(speed_figure(results), out, args.browser)
    print()
    print("\n".join(headline(results)))
    print(f"wrote {out / 'results.json'}, {out / 'table.md'}; {png}")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
