"""Command line: ``python -m tokenswift.train {tokenizer,lm} ...``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence


def _add_tokenizer_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on the train split")
    p.add_argument("--corpus", default="../shared/corpus",
                   help="corpus directory; relative paths are relative to the repo root (default: %(default)s)")
    p.add_argument("--out", required=True, help="directory to save the Hugging Face fast tokenizer into")
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size (default: %(default)s)")


def _add_lm_parser(sub: argparse._SubParsersAction) -> None:
    from .lm import TrainSettings

    p = sub.add_parser(
        "lm",
        help="train the Llama base LM (resumes automatically from RUN_DIR/checkpoint.pt)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--corpus", default="../shared/corpus",
                   help="corpus directory; relative paths are relative to the repo root")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (from the `tokenizer` command)")
    p.add_argument("--out", required=True, help="run directory: logs, token cache, checkpoints, best/")
    for field in dataclasses.fields(TrainSettings):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        help_text = field.metadata.get("help", "")
        if isinstance(default, bool):
            p.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default,
                           help=help_text + " (true/false)")
        else:
            p.add_argument(flag, type=type(default), default=default, help=help_text)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen command."""
    parser = argparse.ArgumentParser(prog="python -m tokenswift.train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_tokenizer_parser(sub)
    _add_lm_parser(sub)
    args = parser.parse_args(argv)

    from .corpus import load_corpus

    splits = load_corpus(args.corpus)
    if args.command == "tokenizer":
        from .tokenizer import train_and_save

        counts = train_and_save(splits, args.out, vocab_size=args.vocab_size)
        for name, n in counts.items():
            chars = len(splits[name].text)
            print(f"{name:24s} {n:8d} tokens  {chars / n:.3f} chars/token  round trip OK")
        print(f"saved tokenizer to {args.out}")
        return 0

    from .lm import TrainSettings, train

    names = {f.name for f in dataclasses.fields(TrainSettings)}
    settings = TrainSettings(**{k: v for k, v in vars(args).items() if k in names})
    train(settings, splits=splits, tokenizer_dir=args.tokenizer, run_dir=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
