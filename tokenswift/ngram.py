"""Token reuse: an incremental n-gram frequency table over prompt and output (the paper uses 4-grams)."""
from __future__ import annotations

import heapq
from collections import defaultdict


class NGramTable:
    """Counts every n-gram seen so far, keyed by its first token.

    `top(token, k)` returns the k most frequent continuations (n - 1 tokens each) of n-grams that start
    with `token`; ties go to the continuation seen most recently. A ranking, once asked for, is kept and
    updated as n-grams arrive (an arriving n-gram is the most recent one, so only it can move; the ranking
    stays exactly what a full sort would give), so repeated lookups cost a dict access, not a sort of every
    continuation of a frequent token.
    """

    def __init__(self, n: int = 4) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self._counts: dict[int, dict[tuple[int, ...], int]] = defaultdict(dict)
        self._last_seen: dict[tuple[int, ...], int] = {}
        self._tokens: list[int] = []
        self._top: dict[int, dict[int, list]] = {}  # token -> k -> ranked continuations, until its bucket changes

    def __len__(self) -> int:
        return len(self._last_seen)

    def extend(self, tokens: list[int]) -> None:
        """Append tokens to the tracked sequence and count the n-grams they complete."""
        start = len(self._tokens)
        self._tokens.extend(tokens)
        seq = self._tokens
        for end in range(max(start, self.n - 1), len(seq)):
            gram = tuple(seq[end - self.n + 1 : end + 1])
            bucket = self._counts[gram[0]]
            count = bucket.get(gram[1:], 0) + 1
            bucket[gram[1:]] = count
            self._last_seen[gram] = end
            ranked = self._top.get(gram[0])
            if ranked:
                self._update_rankings(ranked, gram, count)

    def _update_rankings(self, ranked: dict[int, list], gram: tuple[int, ...], count: int) -> None:
        """gram's count rose to `count` and it is now the most recent: move it within each kept top-k list."""
        cont = gram[1:]
        for k, entries in ranked.items():
            at = next((i for i, (c, _) in enumerate(entries) if c == cont), None)
            if at is not None:
                del entries[at]
            elif len(entries) >= k and entries[-1][1] > count:  # every kept one is more frequent: it stays out
                continue
            else:  # enters (ties with the last kept go to the more recent, this one)
                if len(entries) >= k:
                    entries.pop()
            # its key (count, most recent) beats every entry with count <= its count
            i = 0
            while i < len(entries) and entries[i][1] > count:
                i += 1
            entries.insert(i, (cont, count))

    def top(self, token: int, k: int) -> list[tuple[tuple[int, ...], int]]:
        """Up to k (continuation, count) pairs for n-grams starting with `token`, most frequent first."""
        bucket = self._counts.get(token)
        if not bucket or k <= 0:
            return []
        ranked = self._top.setdefault(token, {})
        if k not in ranked:
            key = lambda item: (item[1], self._last_seen[(token, *item[0])])  # noqa: E731
            ranked[k] = heapq.nlargest(k, bucket.items(), key=key)
        return ranked[k]
