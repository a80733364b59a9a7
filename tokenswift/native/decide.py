"""The target's token for rows of logits through the native kernel (`decide_rows.c`), and the exact
acceptance walk over a verified draft tree in one native call (`walk_tree`).

The decision is given in plain numbers (`Rule`: penalty, temperature, min-p; `rule_of(settings)` reads them from
any object with the sampling chain's fields, as tokenswift.Settings). `decide_rows(...)` returns None where the
kernel cannot serve (no compiler, or neither AVX-512 nor AVX2 with FMA, a chain with top-k, top-p or eta: rule
None, logits that are not float32 on the CPU); callers keep the PyTorch chain of `tokenswift.sampling`, which
defines the same decision. The self-checks here compare the kernels with a small PyTorch transcription of what
decide_rows.c documents (this folder imports nothing from the package above it); tests/test_native.py compares
them with `tokenswift.sampling` and `tokenswift.acceptance` themselves.
"""
from __future__ import annotations

import ctypes
import threading
from itertools import accumulate
from typing import NamedTuple

import numpy as np
import torch

from . import build

_P, _INT, _LONG, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_ARGTYPES = [_P, _INT, _INT, _P, _LONG, _LONG, _P, _P, _FLOAT, _INT, _FLOAT, _FLOAT, _P, _P, _P, _P, _LONG]


class Rule(NamedTuple):
    """A decision the kernel implements: the contextual penalty (1: none), then greedy argmax (temperature 0) or
    temperature, min-p (0: off) and an inverse-CDF sample."""

    penalty: float = 1.0
    temperature: float = 0.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def rule(penalty: float = 1.0, temperature: float = 0.0, min_p: float = 0.0, top_k: int = 0, top_p: float = 1.0,
         eta: float = 0.0) -> Rule | None:
    """The kernel's rule for a sampling chain, or None where the chain has a step it does not implement (top-k,
    top-p, eta)."""
    if top_k != 0 or top_p < 1.0 or eta != 0.0:
        return None
    return Rule(float(penalty), float(temperature), float(min_p))


def rule_of(chain) -> Rule | None:
    """`rule(...)` of an object with the sampling chain's fields (penalty, temperature, min_p, top_k, top_p, eta)."""
    return rule(chain.penalty, chain.temperature, chain.min_p, chain.top_k, chain.top_p, chain.eta)


def _function():
    return build.function("decide_rows", _INT, _ARGTYPES, _self_check, "a PyTorch transcription of the chain")


def available() -> bool:
    return _function() is not None


def decide_rows(logits: torch.Tensor, history: torch.Tensor, n: int, window: int, extras: list[list[int]],
                rule: Rule | None, uniforms: torch.Tensor | None, want_probs: bool,
                kernel=None) -> tuple[list[int], torch.Tensor | None] | None:
    """The same decision as `sampling.decide_rows(logits, seen_rows(history, n, window, extras, V), ...)`:
    logits (N, V); history: int64 token ids, of which the first n are committed; extras[r]: row r's drafted
    ancestors and itself (may be None when rule.penalty is 1: no window is read); uniforms (N,) float64
    (ignored when greedy). Returns (tokens, (N, V) probabilities or None unless `want_probs`), or None where
    the kernel cannot serve (rule None included). kernel: the C function (a self-check passes the one it checks)."""
    kernel = kernel or _function()
    if (kernel is None or rule is None or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or history.dtype != torch.int64 or logits.dim() != 2):
        return None
    rows, vocab = logits.shape
    greedy = rule.greedy
    if not greedy and (uniforms is None or uniforms.numel() != rows):
        return None
    if not logits.is_contiguous():
        logits = logits.contiguous()
    if not history.is_contiguous():
        history = history.contiguous()
    work = _work(vocab, rows)
    offsets_ptr = extras_ptr = None
    if rule.penalty != 1.0:  # one int64 buffer: rows + 1 offsets, then the extras back to back
        total = sum(map(len, extras))
        if total + rows + 1 > work.ints.shape[0]:
            work.grow(2 * (total + rows + 1))
        ints = work.ints
        if total == 0:  # an AR-cost step (extras [[]]) or a tree of roots only: every offset is 0
            ints[: rows + 1] = 0
        else:
            ints[0] = 0
            ints[1 : rows + 1] = list(accumulate(map(len, extras)))
            ints[rows + 1 : rows + 1 + total] = [tok for extra in extras for tok in extra]
        offsets_ptr = work.ints_ptr
        extras_ptr = offsets_ptr + 8 * (rows + 1)
    u_ptr = None
    if not greedy:
        if uniforms.dtype != torch.float64 or not uniforms.is_contiguous():
            uniforms = uniforms.to(torch.float64).contiguous()
        u_ptr = uniforms.data_ptr()
    probs = torch.empty(rows, vocab, dtype=torch.float32) if want_probs else None
    code = kernel(logits.data_ptr(), rows, vocab, history.data_ptr(), n, window, extras_ptr, offsets_ptr,
                  rule.penalty, greedy, rule.temperature if not greedy else 1.0, rule.min_p, u_ptr,
                  work.tokens_ptr, probs.data_ptr() if probs is not None else None, work.scratch_ptr,
                  work.scratch.nbytes)
    if code != 0:
        return None
    return work.tokens[:rows].tolist(), probs


_WALK_ARGTYPES = [_P, _INT, _INT, _P, _LONG, _LONG, _P, _FLOAT, _INT, _FLOAT, _FLOAT, _P, _P, _P, _P, _P, _P, _LONG,
                  _P]


def _walk_function():
    """`walk_tree`, once `decide_rows` and then its own check (against the reference walk over the checked
    `decide_rows`) have passed; None where the library is unavailable or either disagrees."""
    if _function() is None:
        return None
    return build.function("walk_tree", _INT, _WALK_ARGTYPES, _walk_self_check, "the exact walk over decide_rows")


def walk_available() -> bool:
    return _walk_function() is not None


def walk_tree(logits: torch.Tensor, history_ptr: int, n: int, window: int, tree: np.ndarray, rule: Rule | None,
              uniforms_ptr: int, want_probs: bool,
              kernel=None) -> tuple[list[int], int, np.ndarray, np.ndarray | None] | None:
    """The exact walk (`acceptance.exact_walk` with every visited row decided as `decide_rows` decides it) in one
    native call that decides only the rows it visits. logits (N, V) float32 contiguous on the CPU; history_ptr:
    the address of the int64 token history, of which the first n are committed; tree: (2, N) int64 C-contiguous,
    the nodes' tokens then their parents; uniforms_ptr: the address of float64 uniforms, the one for depth d at
    index d (ignored when greedy). Returns (accepted nodes below the root, bonus token, the (N,) picks, valid
    at visited nodes, and the visited rows' (N, V) distributions or None), or None where the kernel cannot serve.
    The picks and distributions live in per-thread buffers: read them before the thread's next walk."""
    kernel = kernel or _walk_function()
    if (kernel is None or rule is None or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or not logits.is_contiguous() or logits.dim() != 2):
        return None
    rows, vocab = logits.shape
    work = _work(vocab, rows)
    greedy = rule.greedy
    probs_ptr = None
    if want_probs:
        if work.probs.shape[0] < rows:
            work.grow_probs(rows)
        probs_ptr = work.probs_ptr
    k = kernel(logits.data_ptr(), rows, vocab, history_ptr, n, window, tree.ctypes.data, rule.penalty, greedy,
               rule.temperature if not greedy else 1.0, rule.min_p, None if greedy else uniforms_ptr,
               work.picks_ptr, work.path_ptr, work.bonus_ptr, probs_ptr, work.scratch_ptr, work.scratch.nbytes,
               work.extra_ptr)
    if k < 0:
        return None
    return work.path[:k].tolist(), int(work.bonus[0]), work.picks[:rows], work.probs[:rows] if want_probs else None


class _Work:
    """Buffers a thread's decisions reuse (made once per vocabulary size and thread): the kernel's scratch (a float
    row, its blocks' sums and a byte mark per token), the chosen tokens, and the packed penalty extras (grown when a
    tree needs more)."""

    def __init__(self, vocab: int, rows: int) -> None:
        self.vocab = vocab
        blocks = (vocab + 15) // 16  # decide_rows_scratch in decide_rows.c (which checks the size)
        self.scratch = np.empty(blocks * 16 * 4 + blocks * 8 + vocab, dtype=np.uint8)
        size = max(64, rows)
        self.tokens = np.empty(size, dtype=np.int64)
        # the walk's outputs and its path's tokens (a path is at most `rows` long)
        self.picks, self.path, self.extra = (np.empty(size, dtype=np.int64) for _ in range(3))
        self.bonus = np.empty(1, dtype=np.int64)
        self.grow(1024)
        self.grow_probs(0)
        self.scratch_ptr, self.tokens_ptr = self.scratch.ctypes.data, self.tokens.ctypes.data
        self.picks_ptr, self.path_ptr, self.extra_ptr, self.bonus_ptr = (
            a.ctypes.data for a in (self.picks, self.path, self.extra, self.bonus))

    def grow_probs(self, rows: int) -> None:
        """Room for `rows` distributions of the walk (grown as trees need; an app's trees stay small)."""
        self.probs = np.empty((rows, self.vocab), dtype=np.float32)
        self.probs_ptr = self.probs.ctypes.data

    def grow(self, size: int) -> None:
        """A new packed-extras buffer of `size` ints (its address read once: numpy's .ctypes costs microseconds)."""
        self.ints = np.empty(size, dtype=np.int64)
        self.ints_ptr = self.ints.ctypes.data


_local = threading.local()  # the engine decides from one thread (its executor); other callers get their own buffers


def _work(vocab: int, rows: int) -> _Work:
    work = getattr(_local, "work", None)
    if work is None or work.vocab != vocab or work.tokens.shape[0] < rows:
        work = _local.work = _Work(vocab, rows)
    return work


def _random_tree(logits: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, list[int], list[int]]:
    """A random draft trie for the walk's self-check: node i hangs below a random earlier node and mostly holds that
    node's likeliest token (else a random one; merged where a sibling holds it), so that walks go deep. Returns the
    logits of its nodes (contiguous), their tokens and their parents (-1 for the root)."""
    top = logits.argmax(-1).tolist()
    tokens, parents, children = [int(top[-1])], [-1], [set()]
    for i in range(1, logits.shape[0]):
        parent = int(torch.randint(0, len(tokens), (1,), generator=gen))
        token = top[parent] if i % 3 else int(torch.randint(0, logits.shape[1], (1,), generator=gen))
        if token not in children[parent]:
            children[parent].add(token)
            tokens.append(token)
            parents.append(parent)
            children.append(set())
    return logits[: len(tokens)].contiguous(), tokens, parents


def _walk_self_check(kernel) -> bool:
    """The walk against the exact walk over the checked `decide_rows`: the same path, bonus, picks at the visited
    nodes and their distributions, on random trees whose drafts often hold the decided token."""
    gen = torch.Generator().manual_seed(1)
    vocab, n = 97, 30
    history = torch.randint(0, vocab, (n + 40,), generator=gen)
    for chain, window in ((Rule(), 1024), (Rule(penalty=1.3), 12), (Rule(1.2, 0.9, 0.05), 20), (Rule(1.0, 1.0), 1024)):
        logits, tokens, parents = _random_tree(torch.randn(9, vocab, generator=gen) * 4, gen)
        u = torch.rand(len(tokens), generator=gen, dtype=torch.float64)
        table = np.array([tokens, parents], dtype=np.int64)
        got = walk_tree(logits, history.data_ptr(), n, window, table, chain, u.data_ptr(), True, kernel=kernel)
        if got is None:
            return False
        path_of = [[]]  # per node: the tokens from below the root to it (its drafted ancestors and itself)
        for i in range(1, len(tokens)):
            path_of.append(path_of[parents[i]] + [tokens[i]])
        depths = torch.tensor([len(p) for p in path_of])
        picks, probs = decide_rows(logits, history, n, window, path_of, chain, u[depths], want_probs=True)
        node, path = 0, []  # the exact walk: follow the child holding the decided token
        while (child := next((j for j in range(node + 1, len(tokens))
                              if parents[j] == node and tokens[j] == picks[node]), None)) is not None:
            path.append(child)
            node = child
        if (got[0], got[1]) != (path, picks[node]):
            return False
        for visited in [0] + path:
            if int(got[2][visited]) != picks[visited] or not torch.equal(torch.from_numpy(got[3][visited]),
                                                                           probs[visited]):
                return False
    return True


def _reference(logits: torch.Tensor, history: torch.Tensor, n: int, window: int, extras: list[list[int]],
               chain: Rule, uniforms: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """What decide_rows.c documents, in float64 PyTorch, row by row: the penalty over the row's window (the last
    `window` of history[:n] + its extras), then argmax, or softmax at the temperature, the min-p cut, and the first
    token whose cumulative kept mass exceeds u times the total."""
    tokens, dists = [], []
    for r in range(logits.shape[0]):
        x = logits[r].double().clone()
        if chain.penalty != 1.0:
            ids = history[:n].tolist() + list(extras[r])
            for tok in set(ids[max(0, len(ids) - window):]):
                x[tok] = x[tok] / chain.penalty if x[tok] > 0 else x[tok] * chain.penalty
        if chain.greedy:
            tokens.append(int(x.argmax()))
            dists.append(torch.softmax(x, -1))
            continue
        p = torch.softmax(x / chain.temperature, -1)
        if chain.min_p > 0:
            p = torch.where(p >= chain.min_p * p.max(), p, torch.zeros_like(p))
            p = p / p.sum()
        tokens.append(int(torch.searchsorted(p.cumsum(0), uniforms[r] * p.sum(), right=True)))
        dists.append(p)
    return tokens, torch.stack(dists)


def _self_check(kernel) -> bool:
    """Against `_reference`: the same tokens (samples whose uniform lies within 1e-4 of a CDF step are skipped:
    float rounding may put them on either side) and distributions within 1e-5."""
    gen = torch.Generator().manual_seed(0)
    vocab, n = 203, 40
    history = torch.randint(0, vocab, (n + 8,), generator=gen)
    extras = [[], [5], [5, 7], [int(history[0]), 9, 9]]
    logits = torch.randn(len(extras), vocab, generator=gen) * 3
    for chain, window in ((Rule(), 1024), (Rule(penalty=1.3), 16), (Rule(1.2, 0.8, 0.05), 30), (Rule(1.0, 1.0), 1024),
                          (Rule(1.0, 1.5, 0.2), 1024)):
        u = torch.rand(len(extras), generator=gen, dtype=torch.float64)
        got = decide_rows(logits, history, n, window, extras, chain, u, want_probs=True, kernel=kernel)
        if got is None:
            return False
        want_tokens, want_probs = _reference(logits, history, n, window, extras, chain, u)
        if not torch.allclose(got[1].double(), want_probs, atol=1e-5, rtol=1e-4):
            return False
        cdf = torch.cumsum(want_probs, dim=-1)
        for r, (a, b) in enumerate(zip(got[0], want_tokens)):
            near_step = not chain.greedy and bool(((cdf[r] - u[r] * cdf[r, -1]).abs() < 1e-4).any())
            if a != b and not near_step:
                return False
    return True
