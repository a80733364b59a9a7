"""The target's token for rows of logits through the native kernel (`decide_rows.c`), and the exact
acceptance walk over a verified draft tree in one native call (`walk_tree`).

`decide_rows(...)` returns None where the kernel cannot serve (no compiler, or neither AVX-512 nor AVX2 with
FMA, settings with top-k, top-p or eta, logits that are not float32 on the CPU); callers keep the PyTorch chain of
`tokenswift.sampling`, which defines the same decision and serves as the reference in the self-check.
"""
from __future__ import annotations

import ctypes
import threading
from itertools import accumulate

import numpy as np
import torch

from ..sampling import decide_rows as reference_decide_rows, seen_rows
from ..settings import Settings
from . import build

_P, _INT, _LONG, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_ARGTYPES = [_P, _INT, _INT, _P, _LONG, _LONG, _P, _P, _FLOAT, _INT, _FLOAT, _FLOAT, _P, _P, _P, _P, _P]


def _function():
    return build.function("decide_rows", _INT, _ARGTYPES, _self_check, "the PyTorch sampling chain")


def available() -> bool:
    return _function() is not None


def serves(settings: Settings) -> bool:
    """True when the kernel implements every step these settings ask for (penalty, temperature, min-p)."""
    return settings.top_k == 0 and settings.top_p >= 1.0 and settings.eta == 0.0


def decide_rows(logits: torch.Tensor, history: torch.Tensor, n: int, window: int, extras: list[list[int]],
                settings: Settings, uniforms: torch.Tensor | None,
                want_probs: bool) -> tuple[list[int], torch.Tensor | None] | None:
    """The same decision as `sampling.decide_rows(logits, seen_rows(history, n, window, extras, V), ...)`:
    logits (N, V); history: int64 token ids, of which the first n are committed; extras[r]: row r's drafted
    ancestors and itself (may be None when settings.penalty is 1: no window is read); uniforms (N,) float64
    (ignored when greedy). Returns (tokens, (N, V) probabilities or None unless `want_probs`), or None where
    the kernel cannot serve."""
    kernel = _function()
    if (kernel is None or not serves(settings) or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or history.dtype != torch.int64 or logits.dim() != 2):
        return None
    rows, vocab = logits.shape
    greedy = settings.greedy
    if not greedy and (uniforms is None or uniforms.numel() != rows):
        return None
    if not logits.is_contiguous():
        logits = logits.contiguous()
    if not history.is_contiguous():
        history = history.contiguous()
    work = _work(vocab, rows)
    offsets_ptr = extras_ptr = None
    if settings.penalty != 1.0:  # one int64 buffer: rows + 1 offsets, then the extras back to back
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
                  settings.penalty, greedy, settings.temperature if not greedy else 1.0, settings.min_p, u_ptr,
                  work.tokens_ptr, probs.data_ptr() if probs is not None else None, work.scratch_ptr, work.mark_ptr)
    if code != 0:
        return None
    return work.tokens[:rows].tolist(), probs


_WALK_ARGTYPES = [_P, _INT, _INT, _P, _LONG, _LONG, _P, _FLOAT, _INT, _FLOAT, _FLOAT, _P, _P, _P, _P, _P, _P, _P, _P]


def _walk_function():
    """`walk_tree` of the decide_rows library, once it has passed its own check against `exact_walk` over
    `decide_rows` (None where the library is unavailable or disagrees)."""
    if "walk" in _walk:
        return _walk["walk"]
    _walk["walk"] = None
    lib = build.load("decide_rows") if _function() is not None else None
    if lib is not None:
        fn = lib.walk_tree
        fn.restype, fn.argtypes = _INT, _WALK_ARGTYPES
        _walk["walk"] = fn
        if not _walk_self_check():
            _walk["walk"] = None
    return _walk["walk"]


_walk: dict[str, object] = {}


def walk_tree(logits: torch.Tensor, history_ptr: int, n: int, window: int, tree: np.ndarray, settings: Settings,
              uniforms_ptr: int, want_probs: bool) -> tuple[list[int], int, np.ndarray, np.ndarray | None] | None:
    """The exact walk (`acceptance.exact_walk` with every visited row decided as `decide_rows` decides it) in one
    native call that decides only the rows it visits. logits (N, V) float32 contiguous on the CPU; history_ptr:
    the address of the int64 token history, of which the first n are committed; tree: (2, N) int64 C-contiguous,
    the nodes' tokens then their parents; uniforms_ptr: the address of float64 uniforms, the one for depth d at
    index d (ignored when greedy). Returns (accepted nodes below the root, bonus token, the (N,) picks, valid
    at visited nodes, and the visited rows' (N, V) distributions or None), or None where the kernel cannot serve.
    The picks and distributions live in per-thread buffers: read them before the thread's next walk."""
    kernel = _walk_function()
    if (kernel is None or not serves(settings) or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or not logits.is_contiguous() or logits.dim() != 2):
        return None
    rows, vocab = logits.shape
    work = _work(vocab, rows)
    greedy = settings.greedy
    probs_ptr = None
    if want_probs:
        if work.probs.shape[0] < rows:
            work.grow_probs(rows)
        probs_ptr = work.probs_ptr
    k = kernel(logits.data_ptr(), rows, vocab, history_ptr, n, window, tree.ctypes.data, settings.penalty, greedy,
               settings.temperature if not greedy else 1.0, settings.min_p, None if greedy else uniforms_ptr,
               work.picks_ptr, work.path_ptr, work.bonus_ptr, probs_ptr, work.scratch_ptr, work.mark_ptr,
               work.extra_ptr)
    if k < 0:
        return None
    return work.path[:k].tolist(), int(work.bonus[0]), work.picks[:rows], work.probs[:rows] if want_probs else None


class _Work:
    """Buffers a thread's decisions reuse (made once per vocabulary size and thread): the kernel's float row and
    byte mark per token, the chosen tokens, and the packed penalty extras (grown when a tree needs more)."""

    def __init__(self, vocab: int, rows: int) -> None:
        self.vocab = vocab
        self.scratch = np.empty(vocab, dtype=np.float32)
        self.mark = np.empty(vocab, dtype=np.uint8)
        size = max(64, rows)
        self.tokens = np.empty(size, dtype=np.int64)
        # the walk's outputs and its path's tokens (a path is at most `rows` long)
        self.picks, self.path, self.extra = (np.empty(size, dtype=np.int64) for _ in range(3))
        self.bonus = np.empty(1, dtype=np.int64)
        self.grow(1024)
        self.grow_probs(0)
        self.scratch_ptr, self.mark_ptr, self.tokens_ptr = (a.ctypes.data for a in (self.scratch, self.mark, self.tokens))
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


def random_draft(logits: torch.Tensor, root: int, follow_every: int, gen: torch.Generator):
    """A random draft trie for checking walks: node i (1 <= i < rows of logits) hangs below a random earlier node and
    holds that node's likeliest token, except every `follow_every`-th, which holds a random one (merged where equal),
    so that decisions often follow it and walks go deep. Returns (the logits of its nodes, contiguous; the trie)."""
    from ..kinds import Source
    from ..tree import DraftTree

    tree = DraftTree.with_root(root)
    top = logits.argmax(-1).tolist()
    for i in range(1, logits.shape[0]):
        parent = int(torch.randint(0, len(tree), (1,), generator=gen))
        token = top[parent] if i % follow_every else int(torch.randint(0, logits.shape[1], (1,), generator=gen))
        if token not in tree.children[parent]:
            tree.add_node(parent, token, Source.NGRAM, 1.0)
    return logits[: len(tree)].contiguous(), tree


def _walk_self_check() -> bool:
    """The walk against `exact_walk` over `decide_rows` (the checked kernel): the same path, bonus, picks at the
    visited nodes and their distributions, on random trees whose drafts often hold the decided token."""
    from ..acceptance import exact_walk

    gen = torch.Generator().manual_seed(1)
    vocab, n = 97, 30
    history = torch.randint(0, vocab, (n + 40,), generator=gen)
    for trial, settings in enumerate((Settings(), Settings(penalty=1.3, penalty_window=12),
                                      Settings(temperature=0.9, min_p=0.05, penalty=1.2, penalty_window=20),
                                      Settings(temperature=1.0))):
        logits, tree = random_draft(torch.randn(9, vocab, generator=gen) * 4, int(history[n - 1]), 3, gen)
        u = torch.rand(len(tree), generator=gen, dtype=torch.float64)
        table = np.array([tree.tokens, tree.parents], dtype=np.int64)
        got = walk_tree(logits, history.data_ptr(), n, settings.penalty_window, table, settings, u.data_ptr(), True)
        if got is None:
            return False
        extras = tree.ancestor_tokens()
        picks, probs = decide_rows(logits, history, n, settings.penalty_window, extras, settings,
                                   None if settings.greedy else u[torch.tensor(tree.depths)], want_probs=True)
        path, bonus = exact_walk(tree, picks.__getitem__)
        if (got[0], got[1]) != (path, bonus):
            return False
        for node in [0] + path:
            if int(got[2][node]) != picks[node] or not torch.equal(torch.from_numpy(got[3][node]), probs[node]):
                return False
    return True


def _self_check() -> bool:
    """Against the PyTorch chain: the same tokens (samples whose uniform lies within 1e-4 of a CDF step are
    skipped: float rounding may put them on either side) and distributions within 1e-5."""
    gen = torch.Generator().manual_seed(0)
    vocab, n = 203, 40
    history = torch.randint(0, vocab, (n + 8,), generator=gen)
    extras = [[], [5], [5, 7], [int(history[0]), 9, 9]]
    logits = torch.randn(len(extras), vocab, generator=gen) * 3
    for settings in (Settings(), Settings(penalty=1.3, penalty_window=16),
                     Settings(temperature=0.8, min_p=0.05, penalty=1.2, penalty_window=30),
                     Settings(temperature=1.0), Settings(temperature=1.5, min_p=0.2)):
        u = torch.rand(len(extras), generator=gen, dtype=torch.float64)
        got = decide_rows(logits, history, n, settings.penalty_window, extras, settings, u, want_probs=True)
        if got is None:
            return False
        seen = seen_rows(history, n, settings.penalty_window, extras, vocab) if settings.penalty != 1.0 else None
        want_tokens, want_probs = reference_decide_rows(logits, seen, settings, u, want_probs=True)
        if not torch.allclose(got[1], want_probs, atol=1e-5, rtol=1e-4):
            return False
        cdf = torch.cumsum(want_probs.double(), dim=-1)
        for r, (a, b) in enumerate(zip(got[0], want_tokens)):
            near_step = settings.greedy is False and bool(((cdf[r] - u[r] * cdf[r, -1]).abs() < 1e-4).any())
            if a != b and not near_step:
                return False
    return True
