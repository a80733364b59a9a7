"""Suffix-match drafting: continue the text as it went on after an earlier occurrence of its end.

Long generations repeat themselves (the paper's case study: verbatim loops within about 5K tokens
without a penalty), and a small model does so much sooner. When the last m tokens occurred before, the
tokens that followed them then are a draft that costs nothing to make. This generalises the paper's token
reuse (4-grams keyed by one token) to the longest match, in the manner of prompt-lookup decoding and
SuffixDecoding (arXiv 2411.04975), whose drafts grow with the match length.

Constant time per token to index: for each m in 1..max_match, a dict from the m tokens ending at a position to the
latest such position that already has a successor.

Where even max_match tokens occurred before, the latest occurrence is not always the one to follow. A loop
whose phrase repeats every 8 tokens while the line breaks repeat every 80 (a model continuing a wrapped book)
matches its last 8 tokens one phrase back, and that draft breaks at the next line break. So the index also
keeps every earlier end of each max_match-gram, and a lookup that matches max_match tokens measures, for the latest
`candidates` of them, how many tokens before each agree with the text's end (up to long_match, by list-slice
comparisons: one for a candidate that cannot beat the best so far, a binary search for one that does): the longest
agreement wins, the latest among equals. A lookup in a loop costs tens of microseconds (a few without a match).
"""
from __future__ import annotations


class SuffixIndex:
    def __init__(self, max_match: int = 8, long_match: int = 128, candidates: int = 32) -> None:
        self.max_match, self.long_match, self.candidates = max_match, long_match, candidates
        self._ends: list[dict[tuple[int, ...], int]] = [dict() for _ in range(max_match + 1)]  # [m][gram] -> end
        self._every_end: dict[tuple[int, ...], list[int]] = {}  # max_match-gram -> each end with a successor, in order
        self.tokens: list[int] = []
        self._indexed = 0  # positions < this are registered (each needs its successor to exist)

    def extend(self, tokens: list[int]) -> None:
        seq = self.tokens
        seq.extend(tokens)
        ends, longest, every = self._ends, self.max_match, self._every_end
        for end in range(self._indexed, len(seq) - 1):  # the gram ending at `end` has a successor now
            tail = tuple(seq[max(0, end - longest + 1) : end + 1])  # one slice; each gram is a slice of it
            size = len(tail)
            for m in range(1, size + 1):
                ends[m][tail[size - m :]] = end
            if size == longest:
                every.setdefault(tail, []).append(end)
        self._indexed = max(self._indexed, len(seq) - 1)

    def lookup(self, length: int) -> tuple[int, list[int]]:
        """(match length m, up to `length` tokens that followed the chosen earlier occurrence of the last m
        tokens), for the longest m that occurred before; (0, []) when even the last token is new. Beyond
        max_match, m is the agreement rounded down to max_match times a power of two (few distinct values: m keys
        the planner's acceptance statistics). A match close to the end (a loop of period p) continues
        periodically."""
        seq = self.tokens
        n = len(seq)
        tail = tuple(seq[max(0, n - self.max_match) :])
        size = len(tail)
        for m in range(size, 0, -1):
            end = self._ends[m].get(tail[size - m :])
            if end is not None:
                if m == self.max_match:
                    m, end = self._longest_agreement(tail, m, end)
                period = n - 1 - end
                return m, [seq[end + 1 + (i % period)] for i in range(length)]
        return 0, []

    def _longest_agreement(self, gram: tuple[int, ...], m: int, latest: int) -> tuple[int, int]:
        """Among the latest `candidates` earlier ends of `gram` (the text's last max_match tokens), the one whose
        preceding tokens agree longest with the text's (at most long_match), as (that agreement rounded down to
        max_match times a power of two, end); (m, latest) where none agrees beyond m."""
        seq, n = self.tokens, len(self.tokens)
        best, best_end = m, latest
        ends = self._every_end[gram]
        for end in reversed(ends[max(0, len(ends) - self.candidates) :]):
            cap = min(self.long_match, end + 1)  # the span ending at `end` starts at index 0 at the latest
            if cap <= best or seq[end - best : end + 1] != seq[n - best - 1 :]:
                continue  # no longer than the best: a later end already won the tie
            lo, hi = best + 1, cap  # lo tokens agree; the largest agreeing length lies in [lo, hi]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if seq[end - mid + 1 : end + 1] == seq[n - mid :]:
                    lo = mid
                else:
                    hi = mid - 1
            best, best_end = lo, end
            if best >= self.long_match:
                break
        bucket = self.max_match  # = m, with best_end = latest, where no candidate agreed beyond m
        while bucket * 2 <= best:
            bucket *= 2
        return bucket, best_end
