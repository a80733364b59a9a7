"""A datastore of continuations: drafts from text the model has seen or written, outside the current context.

Retrieval-based speculative decoding (REST, He et al., NAACL 2024) drafts from a corpus instead of a model:
when the last few tokens occurred in the datastore, what usually followed them there is a draft that costs
a dictionary lookup. This complements the paper's token reuse, which only looks back over the current
text: on a short prompt, or with the contextual penalty that keeps the text from repeating itself, the
current text has little to reuse, while a small model's continuations remain formulaic.

Stored per context order n in ORDERS: every n-token context seen at least `min_count` times, with its most
frequent next tokens (up to TOP) and their shares of the context's occurrences (at least `min_share`).
`lookup` backs off from the longest order. Drafts only: every token is still verified against the target,
so a datastore can make generation faster or slower, never different.

Saved as safetensors (uint16 token ids for vocabularies below 65,536, shares in 1/255 steps), loaded
into one dict per order keyed by the packed context.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ORDERS = (4, 3, 2)  # context lengths, longest first (the lookup's back-off order)
TOP = 2  # continuations kept per context
FILENAME = "datastore.safetensors"  # next to the model's weights


def _pack(tokens: Iterable[int]) -> int:
    key = 0
    for tok in tokens:
        key = (key << 20) | tok
    return key


class Datastore:
    """orders[n]: packed n-token context -> ((token, share), ...) most frequent first."""

    def __init__(self, vocab_size: int, tables: dict[int, dict[int, tuple[tuple[int, float], ...]]]) -> None:
        self.vocab_size = vocab_size
        self.tables = {n: tables.get(n, {}) for n in ORDERS}

    def __len__(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def lookup(self, context: list[int]) -> tuple[int, tuple[tuple[int, float], ...]]:
        """(order n, continuations) for the longest n whose last-n-token context is stored; (0, ()) if none."""
        for n in ORDERS:
            if len(context) >= n:
                found = self.tables[n].get(_pack(context[-n:]))
                if found:
                    return n, found
        return 0, ()

    # ---- building ----------------------------------------------------------------------------------------
    @classmethod
    def build(cls, sequences: Iterable[list[int]], vocab_size: int, min_count: int = 5,
              min_share: float = 0.2) -> "Datastore":
        """Count every (context, next token) over `sequences` (lists of token ids) for each order."""
        if vocab_size > 2**20:
            raise ValueError(f"vocabularies up to 2**20 tokens are supported, got {vocab_size}")
        counts: dict[int, dict[int, Counter]] = {n: defaultdict(Counter) for n in ORDERS}
        for seq in sequences:
            for i in range(1, len(seq)):
                nxt = seq[i]
                for n in ORDERS:
                    if i >= n:
                        counts[n][_pack(seq[i - n : i])][nxt] += 1
        tables: dict[int, dict[int, tuple[tuple[int, float], ...]]] = {}
        for n, by_context in counts.items():
            table = {}
            for key, nexts in by_context.items():
                total = sum(nexts.values())
                if total < min_count:
                    continue
                kept = tuple((tok, _quantize(c / total)) for tok, c in nexts.most_common(TOP) if c / total >= min_share)
                if kept:
                    table[key] = kept
            tables[n] = table
        return cls(vocab_size, tables)

    # ---- files -------------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if path.suffix != ".safetensors":
            path = path / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        id_dtype = torch.int32 if self.vocab_size > 65535 else torch.uint16
        tensors = {}
        for n, table in self.tables.items():
            contexts = torch.zeros(len(table), n, dtype=torch.int64)
            nexts = torch.full((len(table), TOP), -1, dtype=torch.int64)
            shares = torch.zeros(len(table), TOP, dtype=torch.uint8)
            for row, (key, found) in enumerate(sorted(table.items())):
                contexts[row] = torch.tensor(_unpack(key, n))
                for j, (tok, share) in enumerate(found):
                    nexts[row, j], shares[row, j] = tok, round(share * 255)
            tensors[f"order{n}.contexts"] = contexts.to(id_dtype)
            tensors[f"order{n}.next"] = (nexts + 1).to(id_dtype)  # 0 = none
            tensors[f"order{n}.shares"] = shares
        save_file(tensors, str(path), metadata={"vocab_size": str(self.vocab_size), "top": str(TOP)})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Datastore":
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        with safe_open(str(path), framework="pt") as f:  # one read: the metadata and every tensor
            vocab = int((f.metadata() or {}).get("vocab_size", 0))
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        tables = {}
        for n in ORDERS:
            if f"order{n}.contexts" not in tensors:
                continue
            contexts = tensors[f"order{n}.contexts"].to(torch.int64).tolist()
            nexts = (tensors[f"order{n}.next"].to(torch.int64) - 1).tolist()
            shares = tensors[f"order{n}.shares"].tolist()
            table = {}
            for ctx, toks, sh in zip(contexts, nexts, shares):
                table[_pack(ctx)] = tuple((t, s / 255) for t, s in zip(toks, sh) if t >= 0)
            tables[n] = table
        return cls(vocab, tables)


def _quantize(share: float) -> float:
    return round(share * 255) / 255


def _unpack(key: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(key & 0xFFFFF)
        key >>= 20
    return out[::-1]


def find(model_dir: str | Path) -> Path | None:
    """The datastore file saved with a model, if any."""
    path = Path(model_dir) / FILENAME
    return path if path.is_file() else None
