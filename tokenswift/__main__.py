"""Command line: `python -m tokenswift generate ...` (and `train-heads`, see `python -m tokenswift -h`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .kinds import Method
from .tree import AUTO


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling and drafting (defaults: greedy, cost-aware tree)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--eta", type=float, default=0.0)
    g.add_argument("--penalty", type=float, default=1.0, help="contextual penalty theta (1.0 = off; paper: 1.2)")
    g.add_argument("--penalty-window", type=int, default=1024)
    g.add_argument("--no-ngram-reuse", action="store_true", help="turn token reuse off")
    g.add_argument("--ngram-topk", type=int, default=20)
    g.add_argument("--tree", default=AUTO, help="auto (cost-aware, default), a preset, or widths like 1x3x3x3")
    g.add_argument("--kv-mode", default="dynamic", choices=["full", "once", "dynamic"])
    g.add_argument("--kv-budget", type=int, default=4096)
    g.add_argument("--stop-at-eos", action="store_true")


def _settings(args: argparse.Namespace):
    from .settings import Settings

    return Settings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, eta=args.eta,
                    penalty=args.penalty, penalty_window=args.penalty_window, ngram_reuse=not args.no_ngram_reuse,
                    ngram_topk=args.ngram_topk, tree=args.tree, kv_mode=args.kv_mode, kv_budget=args.kv_budget,
                    stop_at_eos=args.stop_at_eos)


def cmd_generate(args: argparse.Namespace) -> int:
    from .generator import Generator

    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("give exactly one of --prompt or --prompt-file")
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
    settings = _settings(args)
    gen = Generator.from_pretrained(args.model, device=args.device, dtype=args.dtype)
    result = gen.generate(prompt, settings, max_new_tokens=args.max_new_tokens, method=args.method, seed=args.seed)
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": result.stats,
                          "settings": settings.to_dict()}, indent=2))
    else:
        print(result.text)
        s = result.stats
        print(f"\n[{s['method']}] {s['new_tokens']} tokens in {s['time_s']:.2f}s ({s['tokens_per_s']:.1f} tok/s), "
              f"{s['iterations']} iterations, {s['mean_accepted']:.2f} tokens/iteration", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tokenswift", description="TokenSwift: lossless fast long generation")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="generate text with AR or TokenSwift")
    p.add_argument("--model", required=True, help="model directory (or hub id already in the local cache)")
    p.add_argument("--prompt", help="prompt text")
    p.add_argument("--prompt-file", help="read the prompt from a UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--method", choices=list(Method), default=Method.TOKENSWIFT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (accelerate device_map)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print text, token ids and stats as JSON")
    _add_sampling_flags(p)
    p.set_defaults(func=cmd_generate)
    from .train.heads import add_train_heads_parser

    add_train_heads_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
