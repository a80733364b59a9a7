"""Build the default model's datastore of continuations (tokenswift.datastore) from its training text and
from text it generated itself (`tokenswift.train.selfgen --save-ids`, continuations only).

    python -m tokenswift.train.datastore --model assets/default-model --corpus ../shared/corpus \
        --selfgen runs/selfgen --out assets/default-model

Only the train split of the corpus is read (the last 5% of each file's lines stay held out, as for the
model), and only the Austen novels by default: the app and the benchmarks write Austen.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..datastore import Datastore
from .corpus import AUSTEN_SOURCES, ALL_SOURCES, load_corpus


def selfgen_sequences(directory: str | Path) -> list[list[int]]:
    """The generated part of every token row saved by selfgen (batchNNN.pt: prompt length and rows)."""
    rows: list[list[int]] = []
    for file in sorted(Path(directory).rglob("batch*.pt")):
        saved = torch.load(file, weights_only=True)
        start = int(saved["prompt_tokens"])
        rows.extend(r[start:].tolist() for r in saved["ids"])
    return rows


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(prog="python -m tokenswift.train.datastore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory (its tokenizer encodes the corpus)")
    p.add_argument("--corpus", default="../shared/corpus")
    p.add_argument("--sources", choices=("austen", "all"), default="austen")
    p.add_argument("--selfgen", action="append", default=[], help="selfgen output directory (repeatable)")
    p.add_argument("--min-count", type=int, default=5)
    p.add_argument("--min-share", type=float, default=0.2)
    p.add_argument("--out", required=True, help="directory or .safetensors path")
    args = p.parse_args(argv)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(args.model)
    splits = load_corpus(args.corpus)
    names = AUSTEN_SOURCES if args.sources == "austen" else ALL_SOURCES
    sequences = [tok.encode(splits[n].train, add_special_tokens=False) for n in names]
    corpus_tokens = sum(map(len, sequences))
    generated = [row for d in args.selfgen for row in selfgen_sequences(d)]
    sequences += generated
    store = Datastore.build(sequences, len(tok), args.min_count, args.min_share)
    path = store.save(args.out)
    sizes = ", ".join(f"order {n}: {len(t):,}" for n, t in store.tables.items())
    print(f"{corpus_tokens:,} corpus tokens ({', '.join(names)}), {sum(map(len, generated)):,} generated tokens "
          f"-> {len(store):,} contexts ({sizes}); {path} ({path.stat().st_size / 1e6:.2f} MB) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
