"""Suffix-match drafting: continue the text as it went on after the latest earlier occurrence of its end.

Long generations repeat themselves (the paper's case study: verbatim loops within about 5K tokens
without a penalty), and a small model does so much sooner. When the last m tokens occurred before, the
tokens that followed them then are a draft that costs nothing to make. This generalises the paper's token
reuse (4-grams keyed by one token) to the longest match, in the manner of prompt-lookup decoding and
SuffixDecoding (arXiv 2411.04975), whose drafts grow with the match length.

Constant time per token: for each m in 1..max_match, a dict from the m tokens ending at a position to the
latest such position that already has a successor.
"""
from __future__ import annotations


class SuffixIndex:
    def __init__(self, max_match: int = 8) -> None:
        self.max_match = max_match
        self._ends: list[dict[tuple[int, ...], int]] = [dict() for _ in range(max_match + 1)]  # [m][gram] -> end
        self.tokens: list[int] = []
        self._indexed = 0  # positions < this are registered (each needs its successor to exist)

    def extend(self, tokens: list[int]) -> None:
        seq = self.tokens
        seq.extend(tokens)
        ends, longest = self._ends, self.max_match
        for end in range(self._indexed, len(seq) - 1):  # the gram ending at `end` has a successor now
            tail = tuple(seq[max(0, end - longest + 1) : end + 1])  # one slice; each gram is a slice of it
            size = len(tail)
            for m in range(1, size + 1):
                ends[m][tail[size - m :]] = end
        self._indexed = max(self._indexed, len(seq) - 1)

    def lookup(self, length: int) -> tuple[int, list[int]]:
        """(match length m, up to `length` tokens that followed the latest earlier occurrence of the last m
        tokens), for the longest m that occurred before; (0, []) when even the last token is new. A match
        close to the end (a loop of period p) continues periodically."""
        seq = self.tokens
        n = len(seq)
        tail = tuple(seq[max(0, n - self.max_match) :])
        size = len(tail)
        for m in range(size, 0, -1):
            end = self._ends[m].get(tail[size - m :])
            if end is not None:
                period = n - 1 - end
                return m, [seq[end + 1 + (i % period)] for i in range(length)]
        return 0, []
