"""Held-out corpus prompts of given lengths, the benchmarks' common input (`bench speed`, `parts`, `bonus-head`)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable


def held_out_prompts(encode: Callable[[str], list[int]], contexts: list[int], corpus_dir: Path | None = None) -> dict[int, dict]:
    """For each context length, the first `length` tokens of held-out text (the last 5% of each corpus file's
    lines, `train.corpus.split_text`): Emma's held-out part when it is long enough, else the held-out parts
    of several files concatenated (blank line between), Emma first, then the other Austen novels, then the
    KJV, as many as the length needs."""
    from ..train.corpus import ALL_SOURCES, load_corpus, resolve_corpus_dir

    corpus = load_corpus(resolve_corpus_dir(corpus_dir))
    out: dict[int, dict] = {}
    emma_ids = encode(corpus["emma"].val)
    for length in sorted(set(contexts)):
        if len(emma_ids) >= length:
            out[length] = {"ids": emma_ids[:length], "files": ["emma"],
                           "source": f"emma.txt held-out part (last 5% of lines, {len(emma_ids):,} tokens)"}
            continue
        used: list[str] = []
        for name in ALL_SOURCES:
            used.append(name)
            ids = encode("\n\n".join(corpus[n].val for n in used))
            if len(ids) >= length:
                break
        else:
            raise ValueError(f"the corpus's held-out text has {len(ids):,} tokens, fewer than {length:,}")
        out[length] = {"ids": ids[:length], "files": used,
                       "source": (f"held-out parts (last 5% of lines) of {' + '.join(used)} concatenated "
                                  f"(emma's alone has only {len(emma_ids):,} tokens)")}
    return out
