"""Every named kind in one place: token sources, generation methods, cache and draft modes.

They are `StrEnum`s, so each member equals its plain string ("head" == Source.HEAD), is written to
JSON as that string, and reads back with `Source("head")`.
"""
from __future__ import annotations

from enum import StrEnum


class Source(StrEnum):
    """Where a token (or a draft-tree node) came from."""

    ROOT = "root"  # the tree's root: the last committed token
    HEAD = "head"  # a model draft (depth 1: the base LM head; deeper: the extra heads)
    NGRAM = "ngram"  # reused text: a 4-gram of the table or, under tree="auto", a suffix match or a datastore continuation
    SUFFIX = "suffix"  # tree="auto" keeps acceptance statistics of suffix matches under this kind ...
    DATASTORE = "datastore"  # ... and of datastore continuations (tokenswift.datastore) under this one
    BONUS = "bonus"  # the target's own sample at the end of the accepted path
    AR = "ar"  # a plain autoregressive step


class Method(StrEnum):
    AR = "ar"
    TOKENSWIFT = "tokenswift"


class KVMode(StrEnum):
    """Partial KV cache for drafting."""

    FULL = "full"  # no partial cache
    ONCE = "once"  # select at prefill, then a rolling recent tail
    DYNAMIC = "dynamic"  # re-select whenever the recent tail is full


class PartialMode(StrEnum):
    """What an iteration's drafting read (CacheState.partial_mode): a KV mode, or one of these two."""

    NONE = "none"  # nothing is drafted (AR, or no heads and no n-grams)
    FUSED = "fused"  # the heads read the verification pass: no partial cache
    FULL = KVMode.FULL.value
    ONCE = KVMode.ONCE.value
    DYNAMIC = KVMode.DYNAMIC.value


class DraftMode(StrEnum):
    PAPER = "paper"  # a draft forward over the partial cache each iteration (the paper's scheme)
    FUSED = "fused"  # the heads read the verification pass (no draft forward)


class AcceptanceRule(StrEnum):
    EXACT = "exact"  # lossless: one target sample per tree node
    PER_ROW_BIASED = "per_row_biased"  # the original code's rule, kept to demonstrate its bias


DRAFTED = (Source.HEAD, Source.NGRAM)  # sources of drafted (not target-sampled) tokens
