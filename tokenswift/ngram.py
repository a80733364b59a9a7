"""Token reuse: an incremental n-gram frequency table over prompt and output (the paper uses 4-grams)."""
from __future__ import annotations

import heapq
from collections import defaultdict


class NGramTable:
    """Counts every n-gram seen so far, keyed by its first token.

    `top(token, k)` returns the k most frequent continuations (n - 1 tokens each) of n-grams that start
    with `token`; ties go to the continuation seen most recently. The ranking is kept until a new n-gram
    starting with that token arrives, so repeated lookups cost a dict access.
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
            bucket[gram[1:]] = bucket.get(gram[1:], 0) + 1
            self._last_seen[gram] = end
            self._top.pop(gram[0], None)

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
