"""The text of a growing list of token ids, handed out as deltas at a cost that does not grow with length.

Decoding the whole list on every update is quadratic over a long run. Here each update decodes only a
short window: the tokens since the last emitted text plus a few before them (so a tokenizer that reads
context, such as SentencePiece's leading spaces, sees it). A delta that ends in an unfinished multi-byte
character is held back until the next update completes it.
"""
from __future__ import annotations

from typing import Callable

CONTEXT_TOKENS = 4
UNFINISHED = "\ufffd"


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.start = 0  # first id of the decoding window
        self.emitted = 0  # ids whose text has been handed out
        self.chars = 0  # characters handed out

    def add(self, ids: list[int]) -> str:
        """Append `ids`; returns the new text (possibly empty while a character is unfinished)."""
        self.ids.extend(ids)
        head = self.decode(self.ids[self.start : self.emitted])
        window = self.decode(self.ids[self.start :])
        if window.endswith(UNFINISHED) or not window.startswith(head):
            return ""
        delta = window[len(head) :]
        self.emitted = len(self.ids)
        self.start = max(0, self.emitted - CONTEXT_TOKENS)
        self.chars += len(delta)
        return delta

    def finish(self) -> str:
        """The text not handed out yet (one full decode, at the end)."""
        rest = self.decode(self.ids)[self.chars :]
        self.emitted, self.chars = len(self.ids), self.chars + len(rest)
        self.start = max(0, self.emitted - CONTEXT_TOKENS)
        return rest
