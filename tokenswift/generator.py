"""AR and TokenSwift generation loops over one engine, emitting one Step event per iteration."""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from . import events as ev
from .acceptance import exact_walk, per_row_walk
from .adapter import ModelAdapter
from .auto import (MAX_ROWS, MIN_REACH, PRIOR_SHAPE, PRIOR_SHAPE_NATIVE, PROBE_ROWS, AcceptanceStats, Calibration,
                   CostModel, Payoff, choose)
from .heads import Heads, read_head_tensors
from .datastore import ORDERS as DATASTORE_ORDERS, Datastore, find as find_datastore
from .kv_cache import KVCache
from .lean import LeanHeads
from .native import decide as native_decide
from .native import layers as native_layers
from .ngram import NGramTable
from .partial_cache import PartialKVCache
from .sampling import UniformStream, decide_rows, penalize_rows, seen_rows
from .settings import Settings
from .suffix import SuffixIndex
from .codec import decode_ids, encode_text
from .kinds import Method, PartialMode, Source
from .validate import NGRAM_NODES, check_generation, validate_seed
from .tree import AUTO, DraftTree, build_head_paths, parse_tree, tree_widths, verification_inputs

METHODS = tuple(Method)
PREFILL_CHUNK = 256
NGRAM_SIZE = NGRAM_NODES  # reused n-grams are 4-grams; the validator bounds the nodes they add


@dataclass
class Result:
    prompt_ids: list[int]
    token_ids: list[int]  # new tokens only
    text: str
    stats: dict = field(default_factory=dict)


class Generator:
    """A loaded model (plus optional heads and tokenizer) that generates with AR or TokenSwift."""

    def __init__(self, model: nn.Module, tokenizer=None, heads: Heads | None = None,
                 datastore: Datastore | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.adapter = ModelAdapter(model)
        self._heads: Heads | None = None
        self._lean_heads: LeanHeads | None = None
        self._native_heads: native_layers.NativeHeads | None = None
        if heads is not None:
            self.set_heads(heads)
        self.datastore: Datastore | None = None
        self.set_datastore(datastore)

    # ---- construction ------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device | None = None,
                        dtype: torch.dtype | str | None = None, heads: bool = True, datastore: bool = True,
                        **model_kwargs) -> "Generator":
        """Load a model, its tokenizer and (when the checkpoint has them) its TokenSwift heads and its datastore of
        continuations (`datastore.safetensors`, see tokenswift.datastore).

        device: "cpu", "cuda", "cuda:1", or "auto" (accelerate's device_map). dtype: torch dtype or its
        name ("bfloat16"); None keeps the checkpoint's. Never runs remote code. `path` may also name a built-in
        model ("smollm2-135m", see tokenswift.builtin), fetched and converted on first use."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .builtin import resolve_model

        path = resolve_model(path)
        if isinstance(dtype, str):
            dtype = _parse_dtype(dtype)
        kwargs = dict(model_kwargs)
        kwargs["dtype"] = dtype if dtype is not None else "auto"
        kwargs["trust_remote_code"] = False
        if device == "auto":
            kwargs["device_map"] = "auto"
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the head tensors are read below; the "unexpected keys" report is noise
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        finally:
            hf_logging.set_verbosity(verbosity)
        if device not in (None, "auto"):
            model = model.to(device)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        gen = cls(model, tokenizer)
        if heads or datastore:
            local = _local_dir(path)
            if heads and read_head_tensors(local):
                gen.set_heads(Heads.load(model, local))
            store = find_datastore(local) if datastore else None
            if store is not None:
                gen.set_datastore(Datastore.load(store))
        return gen

    def set_datastore(self, datastore: Datastore | None) -> None:
        """Attach a datastore of continuations (drafts for tree="auto" with token reuse on), or None."""
        if datastore is not None and datastore.vocab_size > self.adapter.vocab_size:
            raise ValueError(f"the datastore's vocabulary ({datastore.vocab_size}) is larger than the model's "
                             f"({self.adapter.vocab_size})")
        self.datastore = datastore

    @property
    def heads(self) -> Heads | None:
        return self._heads

    def set_heads(self, heads: Heads | None) -> None:
        """Attach multi-token heads (moved to the LM head's device and the model's dtype), or None for
        n-gram drafts only."""
        if heads is not None:
            if heads.hidden_size != self.adapter.hidden_size:
                raise ValueError(f"heads have hidden size {heads.hidden_size}, the model {self.adapter.hidden_size}")
            heads = heads.to(device=self.adapter.head_device, dtype=self.adapter.dtype).eval()
        self._heads = heads
        lean = self.adapter.lean
        if lean is not None:
            lean.set_draft_vocab(None if heads is None else heads.draft_vocab)
        self._lean_heads = LeanHeads(heads, lean.compute_dtype) if heads is not None and lean is not None else None
        self._native_heads = native_layers.NativeHeads.build(self._lean_heads, lean.draft_head) if self._lean_heads else None

    def head_drafts(self, hidden: torch.Tensor, levels: int, k: int) -> tuple[list[list[int]], list[list[float]]]:
        """hidden (1, H) before the final norm -> per head (the first `levels`), its k most likely ids over the
        drafting vocabulary (`run_heads(..., draft_vocab=True)`) and their softmax probabilities, most likely first:
        in one native call where the kernels serve (tokenswift/native/layers.py NativeHeads), else through PyTorch."""
        found = self._native_heads.top(hidden, levels, k) if self._native_heads is not None else None
        if found is None:
            logits = self.run_heads(hidden, levels, draft_vocab=True)[:, 0].float()  # (levels, V')
            top = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
            found = (top.indices.tolist(), top.values.tolist())
        lean = self.adapter.lean
        ids = None if lean is None else lean.draft_ids
        if ids is None:
            return found
        return [[ids[i] for i in row] for row in found[0]], found[1]  # drafting rows -> token ids

    def run_heads(self, hidden: torch.Tensor, levels: int, draft_vocab: bool = False) -> torch.Tensor:
        """hidden (T, H) before the final norm -> the first `levels` heads' LM-head logits, (levels, T, V).
        draft_vocab: only over the lean step's drafting vocabulary (V' <= V columns, column j being token id
        `LeanModel.draft_ids[j]`, or j where that is None; on a CPU an 8x cheaper product for the default model)."""
        if self._lean_heads is not None:
            out = self._lean_heads(hidden, levels)
        else:
            out = self._heads(hidden.to(self.adapter.head_device).to(self.adapter.dtype))[:levels]
        k, t, h = out.shape
        lean = self.adapter.lean
        if draft_vocab and lean is not None:
            return lean.draft_head(out.reshape(k * t, h).to(lean.compute_dtype)).float().reshape(k, t, -1)
        return self.adapter.logits_from_normed(out.reshape(k * t, h)).reshape(k, t, -1)

    # ---- generation --------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this generator has no tokenizer: pass the prompt as a list of token ids")
            return encode_text(self.tokenizer, prompt)
        ids = list(prompt)
        if not ids:
            raise ValueError("the prompt is empty: give at least one token id")
        vocab = self.adapter.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        return ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return decode_ids(self.tokenizer, ids)

    def stream(self, prompt: str | list[int], settings: Settings | None = None, max_new_tokens: int = 256,
               method: str = Method.TOKENSWIFT, seed: int = 0, stop: threading.Event | None = None,
               detail: bool = True) -> Iterator[ev.Step]:
        """Generate, yielding one Step per iteration. Setting `stop` ends the run after the current
        iteration. Timings count only the engine's own compute, not the time the consumer holds a step.
        detail=False leaves `Step.tree` empty (no per-node objects; `Step.draft_nodes` still counts them)."""
        settings = settings if settings is not None else Settings()
        if not isinstance(settings, Settings):
            raise ValueError("settings must be a tokenswift.Settings")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        ids = self.encode(prompt)
        max_new_tokens = check_generation(self, ids, settings, max_new_tokens)  # before anything is allocated
        seed = validate_seed(seed)
        run = _Run(self, ids, settings, max_new_tokens, method, seed, detail)
        return run.steps(stop)

    def generate(self, prompt: str | list[int], settings: Settings | None = None, max_new_tokens: int = 256,
                 method: str = Method.TOKENSWIFT, seed: int = 0, stop: threading.Event | None = None) -> Result:
        prompt_ids = self.encode(prompt)
        new: list[int] = []
        stats = _Stats()
        for step in self.stream(prompt_ids, settings, max_new_tokens, method, seed, stop, detail=False):
            new.extend(step.token_ids)
            stats.add(step)
        return Result(prompt_ids, new, self.decode(new), stats.summary(method))

    def warm_up(self) -> float:
        """Run a few short generations (AR and TokenSwift with tree="auto", greedy and sampled) on a repetitive
        token pattern, so that what is done once per process (the native kernels' loading and self-checks, first
        calls of each code path, the allocator's first large blocks) is not paid inside the first real run: on a
        CPU its first iterations otherwise cost up to three warm steps (measured: 14-15, 10, 7-8 ms against 5-6),
        and tree="auto" judges drafting by them. Returns the seconds it took (about 0.2 s for the default model
        on a 2-vCPU machine)."""
        t = time.perf_counter()
        vocab = self.adapter.vocab_size
        pattern = [(7 * i + 11) % vocab for i in range(6)] * 8  # repeats: suffix drafts, multi-row verification
        greedy = Settings(tree=AUTO)
        sampled = Settings(tree=AUTO, temperature=1.0, min_p=0.1, penalty=1.2)
        self.generate(pattern, greedy, 4, method=Method.AR)
        self.generate(pattern, greedy, 12)
        self.generate(pattern, sampled, 12)
        return time.perf_counter() - t


def _parse_dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ValueError(f"dtype must be one of {', '.join(table)}, got {name!r}")
    return table[name]


def _local_dir(path: str | Path) -> Path:
    local = Path(path)
    if local.exists():
        return local
    from huggingface_hub import snapshot_download  # a hub id: the files are already in the local cache

    return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))


class _Stats:
    """Running totals over Step events -> the summary in Result.stats."""

    def __init__(self) -> None:
        self.iterations = 0
        self.tokens = 0
        self.by_source: dict[str, int] = {}
        self.nodes = 0
        self.draft_s = self.verify_s = self.bookkeeping_s = 0.0
        self.elapsed_s = 0.0
        self.prefill_s = 0.0
        self.refreshes = 0

    def add(self, step: ev.Step) -> None:
        self.iterations += 1
        self.tokens += len(step.tokens)
        for t in step.tokens:
            self.by_source[t.source] = self.by_source.get(t.source, 0) + 1
        self.nodes += step.draft_nodes
        self.draft_s += step.timings.draft_s
        self.verify_s += step.timings.verify_s
        self.bookkeeping_s += step.timings.bookkeeping_s
        self.elapsed_s = step.elapsed_s
        self.prefill_s = step.prefill_s
        self.refreshes = step.cache.refreshes

    def summary(self, method: str) -> dict:
        it = max(1, self.iterations)
        return {
            "method": method,
            "new_tokens": self.tokens,
            "iterations": self.iterations,
            "mean_accepted": self.tokens / it,
            "accepted_by_source": dict(self.by_source),
            "mean_draft_nodes": self.nodes / it,
            "time_s": self.elapsed_s,
            "prefill_s": self.prefill_s,
            "tokens_per_s": self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "bookkeeping_s": self.bookkeeping_s,
            "partial_refreshes": self.refreshes,
        }


class _Run:
    """The state of one generation: caches, token history, n-gram tables, random stream, auto planner."""

    def __init__(self, gen: Generator, ids: list[int], settings: Settings, max_new: int, method: str, seed: int,
                 detail: bool = True) -> None:
        self.gen, self.a, self.s = gen, gen.adapter, settings
        self.method, self.max_new, self.detail = method, max_new, detail
        self.ids = list(ids)
        self.uniforms = UniformStream(seed)
        self.walk = exact_walk if settings.acceptance == "exact" else per_row_walk
        heads = gen.heads
        self.auto = method == Method.TOKENSWIFT and settings.tree == AUTO
        self.paths = parse_tree(settings.tree) if method == Method.TOKENSWIFT else []
        # auto always drafts fused (no draft forward: on a CPU it costs about an AR step, measured)
        self.fused = heads is not None and (settings.draft == "fused" or self.auto)
        if heads is None:
            self.paths = []  # no heads: n-gram drafts only
        elif self.auto:
            self.paths = [p for p in parse_tree(AUTO_HEAD_TREE) if len(p) <= heads.num_heads]
        else:  # paper: base LM head + each extra head; fused: the extra heads only
            levels = heads.num_heads if self.fused else 1 + heads.num_heads
            self.paths = [p for p in self.paths if len(p) <= levels]
        # the verification pass's hidden states and the row of the last accepted node (the heads' input when fused),
        # sliced only when the heads read it (`fused_hidden`): a tensor op right after a forward costs ~0.03-0.1 ms
        self._fused: tuple[torch.Tensor, int] | None = None
        self._fused_row: torch.Tensor | None = None
        self._move_hidden = gen.adapter.layer_devices[-1] != gen.adapter.head_device  # heads on another device
        self.widths = tree_widths(self.paths)
        self.use_ngrams = method == Method.TOKENSWIFT and settings.ngram_reuse and settings.ngram_topk > 0
        if self.auto:
            max_nodes = MAX_ROWS + max(PROBE_ROWS)
        else:
            max_nodes = 1 + len(self.paths) + ((self.widths[0] if self.widths else 0) + 1) * settings.ngram_topk * NGRAM_SIZE
        capacity = len(ids) + max_new + max_nodes + 1
        self.seq = torch.zeros(capacity, dtype=torch.long)  # token history for the penalty window
        self.seq[: len(ids)] = torch.tensor(ids)
        self._seq_view = self.seq.numpy()  # the same memory: writing a few ids through it skips a tensor's creation
        self._seq_ptr = self.seq.data_ptr()  # its address, for the native walk
        a = self.a
        self.full = KVCache(a.layer_devices, capacity, a.num_kv_heads, a.head_dim, a.cache_dtype)
        self.ngrams = NGramTable(NGRAM_SIZE) if self.use_ngrams else None
        self.suffix = SuffixIndex() if self.auto and settings.ngram_reuse else None
        self.indexed = 0  # tokens of self.ids the n-gram table and the suffix index have seen (index_new_tokens)
        self.datastore = gen.datastore if self.auto and settings.ngram_reuse else None
        self.stats = AcceptanceStats() if self.auto else None
        few_rows_cheap = a.lean is not None and a.lean.native_rows
        stack = a.lean.native_stack if a.lean is not None else None
        # auto never plans past the native stack's limit: the cost model cannot see the step to the PyTorch path
        self.max_rows = min(MAX_ROWS, stack.max_tokens) if stack is not None else MAX_ROWS
        self.costs = CostModel(PRIOR_SHAPE_NATIVE if few_rows_cheap else PRIOR_SHAPE) if self.auto else None
        self.calibration = Calibration() if self.auto else None
        self.payoff = Payoff() if self.auto else None
        # a sampled token equals a draft with the target's probability of that draft: lower priors than greedy's
        self.prior_scale = 1.0 if settings.greedy else SAMPLED_PRIOR_SCALE
        self.expected_drafted = 0.0  # auto: the plan's expected accepted drafted tokens, this iteration
        self.head_idle = 0  # auto: consults since a head token was last accepted (heads are then consulted less often)
        self.head_next = 0  # auto: first iteration at which the heads are consulted again
        self.head_consult_s = 0.0  # auto: the latest consult's seconds
        self.plan_idle = 0  # auto: consecutive plans that kept no node
        self.plan_next = 0  # auto: first iteration at which the planner runs again
        self.iteration = 0
        self.probe_s = 0.0  # auto: time of this iteration's cost probe (not part of the usual overhead)
        self.partial: PartialKVCache | None = None
        self.eos = gen.tokenizer.eos_token_id if gen.tokenizer is not None else None

    # ---- helpers ---------------------------------------------------------------------------------------
    @property
    def fused_hidden(self) -> torch.Tensor | None:
        """(1, H) verification hidden state at the last accepted node, on the heads' device (None before any)."""
        if self._fused_row is None and self._fused is not None:
            h, row = self._fused
            hidden = h[row : row + 1]
            self._fused_row = hidden.to(self.a.head_device) if self._move_hidden else hidden
        return self._fused_row

    def keep_hidden(self, h: torch.Tensor, row: int) -> None:
        """Remember the verification's hidden states (T, H) and the last accepted row for the fused heads."""
        self._fused, self._fused_row = (h, row), None

    def seen(self, extras: list[list[int]] | None) -> torch.Tensor | None:
        """(N, V) penalty windows of N rows whose drafted ancestors are `extras` (None: no penalty)."""
        if self.s.penalty == 1.0:
            return None
        return seen_rows(self.seq, len(self.ids), self.s.penalty_window, extras, self.a.vocab_size)

    def _sync(self) -> None:
        if self.full.k and self.full.k[0].device.type == "cuda":
            torch.cuda.synchronize(self.full.k[0].device)

    def cache_state(self, with_positions: bool) -> ev.CacheState:
        f = self.full
        if self.method == Method.AR or not (self.paths or self.auto):
            mode = PartialMode.NONE
        else:
            mode = PartialMode.FUSED if self.fused else PartialMode(self.s.kv_mode)
        state = ev.CacheState(f.length, f.capacity, f.bytes_used(), mode)
        p = self.partial
        if p is not None:
            ps = p.state()
            state.partial_budget, state.partial_sink = ps.budget, ps.sink
            state.partial_selected, state.partial_recent = ps.selected, ps.recent
            state.refreshed, state.refreshes = ps.refreshed, ps.refreshes
            if with_positions or ps.refreshed:
                held = p.held_positions()[: p.kept]
                state.held_positions = ev.position_runs(held)
        return state

    # ---- prefill -------------------------------------------------------------------------------------
    def prefill(self, stop: threading.Event | None) -> list[torch.Tensor] | None:
        """Run every prompt token but the last through the full cache. Returns per layer the query of the
        last prefilled token (Hq, d), for the partial cache's first selection; None when `stop` was set
        (checked between chunks, so Stop also ends a long prefill)."""
        body = self.ids[:-1]
        queries: list[torch.Tensor] = []
        for start in range(0, len(body), PREFILL_CHUNK):
            if stop is not None and stop.is_set():
                return None
            chunk = body[start : start + PREFILL_CHUNK]
            t = len(chunk)
            causal = torch.ones(t, t, dtype=torch.bool).tril_()
            ids = torch.tensor(chunk)
            _, q = self.a.forward(ids, torch.arange(start, start + t), self.full, start, causal,
                                  capture_queries=self.partial_wanted)
            queries = [x[:, -1] for x in q]
            self.full.length = start + t
        return queries

    @property
    def partial_wanted(self) -> bool:
        return bool(self.paths) and self.s.kv_mode != "full" and not self.fused

    # ---- the loop ------------------------------------------------------------------------------------
    def steps(self, stop: threading.Event | None) -> Iterator[ev.Step]:
        t0 = time.perf_counter()
        queries = self.prefill(stop)
        if queries is None:
            return
        self.index_new_tokens()
        if self.partial_wanted:
            report = self.a.num_layers // 2
            self.partial = PartialKVCache(self.full, self.s.kv_budget, self.s.kv_sink, self.s.recent_capacity,
                                          self.s.kv_mode, report)
            self.partial.refresh(self.full, queries)
        self._sync()
        prefill_s = time.perf_counter() - t0
        generated, elapsed, index = 0, 0.0, 0
        while generated < self.max_new:
            if stop is not None and stop.is_set():
                return
            timings = ev.Timings()
            note = ""
            if self.method == Method.AR:
                tokens, tree, nodes = self.ar_step(timings)
            else:
                tokens, tree, nodes, note = self.tokenswift_step(timings)
            t_book = time.perf_counter()
            produced = len(tokens)
            tokens = tokens[: self.max_new - generated]  # the last iteration keeps only what max_new allows
            done = False
            if self.s.stop_at_eos and self.eos is not None:
                for i, tok in enumerate(tokens):
                    if tok.token == self.eos:
                        tokens, done = tokens[: i + 1], True
                        break
            if len(tokens) < produced:  # drafted nodes past the cut are not part of the output (nor is the bonus)
                for node in tree:
                    if node.depth > len(tokens):
                        node.accepted = False
            generated += len(tokens)
            done = done or generated >= self.max_new
            cache = self.cache_state(with_positions=index == 0)
            timings.bookkeeping_s += time.perf_counter() - t_book
            elapsed += timings.total_s
            yield ev.Step(index, self.method, tokens, cache, timings, generated, elapsed, prefill_s, tree, done,
                          nodes, note)
            index += 1
            self.iteration = index
            if done:
                return

    def commit(self, tokens: list[int]) -> None:
        n = len(self.ids)
        self.ids.extend(tokens)
        self._seq_view[n : n + len(tokens)] = tokens

    def index_new_tokens(self) -> None:
        """Bring the n-gram table and the suffix index up to the committed tokens. Called where drafts are
        looked up, not at every commit: while auto's planner rests (temperature 1: most iterations) the tables
        are not read, and a batch is indexed exactly as the same tokens one commit at a time."""
        if self.ngrams is None and self.suffix is None:
            return
        new = self.ids[self.indexed :]
        if not new:
            return
        if self.ngrams is not None:
            self.ngrams.extend(new)
        if self.suffix is not None:
            self.suffix.extend(new)
        self.indexed = len(self.ids)

    def decide(self, logits: torch.Tensor, extras: list[list[int]] | None, depths: list[int],
               want_probs: bool | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Every row's target token at once (argmax, or a sample with the uniform of its depth: the walk
        reaches depth d only after d tokens were produced, so that node's token is the (d+1)-th draw).
        extras: per row its drafted ancestors and itself, for the penalty window (None without a penalty).
        want_probs: also the rows' distributions (default: when events carry per-node detail)."""
        want_probs = self.detail if want_probs is None else want_probs
        u = None
        if not self.s.greedy:
            if len(depths) == 1:  # one row, the root (an AR-cost step): the next uniform
                u = self.uniforms.peek(1)
            else:
                u = torch.from_numpy(self.uniforms.peek(max(depths) + 1).numpy()[depths])  # numpy's gather: ~10 us less
        fast = native_decide.decide_rows(logits, self.seq, len(self.ids), self.s.penalty_window, extras, self.s, u,
                                         want_probs=want_probs)
        if fast is not None:  # the same chain in one native pass (about 20 us instead of 0.2-0.8 ms)
            return fast
        return decide_rows(logits, self.seen(extras), self.s, u, want_probs=want_probs)

    def one_row_step(self, timings: ev.Timings) -> tuple[torch.Tensor, int]:
        """One token the AR way: forward of the last token, logits, decision (timed as verification), commit
        (bookkeeping). Returns the hidden state (1, H) and the token."""
        t = time.perf_counter()
        h, _ = self.a.forward(torch.tensor([self.ids[-1]]), torch.tensor([len(self.ids) - 1]), self.full,
                              self.full.length)
        tokens, _ = self.decide(self.a.logits(h), [[]], [0], want_probs=False)  # no event reads a one-row distribution
        if not self.s.greedy:
            self.uniforms.take(1)
        timings.verify_s = time.perf_counter() - t
        t = time.perf_counter()
        self.full.length += 1
        self.commit(tokens)
        timings.bookkeeping_s = time.perf_counter() - t
        return h, tokens[0]

    def ar_step(self, timings: ev.Timings) -> tuple[list[ev.AcceptedToken], list[ev.TreeNode], int]:
        _, token = self.one_row_step(timings)
        return [ev.AcceptedToken(token, Source.AR)], [], 0

    # ---- drafting ------------------------------------------------------------------------------------
    def head_logits(self, levels: int) -> torch.Tensor:
        """(levels, V) logits proposing depths 1, 2, ... of the tree.

        paper: one forward of the last token over the partial cache; the base LM head proposes depth 1
        and extra head i depth i + 2. fused (after the first iteration): extra head i applied to the
        verification pass's hidden state at the last accepted node proposes depth i + 1."""
        if self.fused_hidden is not None:
            return self.gen.run_heads(self.fused_hidden, levels)[:, 0]  # (levels, V)
        cache = self.full if self.partial is None else self.partial
        start = self.full.length if self.partial is None else self.partial.count
        pos = torch.tensor([len(self.ids) - 1])
        h, _ = self.a.forward(torch.tensor([self.ids[-1]]), pos, cache, start)  # (1, H)
        rows = [self.a.logits(h)]
        if levels > 1:
            rows.append(self.gen.run_heads(h, levels - 1)[:, 0])  # (levels - 1, V)
        return torch.cat(rows)

    def head_candidates(self) -> tuple[list[list[int]], list[list[float]]]:
        """Ranked tokens and their draft probabilities per depth (the base window's penalty applied). auto (which
        consults the heads only once it has a fused hidden state) ranks by the raw heads over the drafting
        vocabulary, its rates being measured: `Generator.head_drafts`."""
        if self.auto:
            cands, cprobs = self.gen.head_drafts(self.fused_hidden, len(self.widths), max(self.widths))
            return [c[:w] for c, w in zip(cands, self.widths)], [p[:w] for p, w in zip(cprobs, self.widths)]
        logits = self.head_logits(len(self.widths)).float()  # (depths, V)
        if self.s.penalty != 1.0:
            seen = self.seen([[]]).expand(logits.shape[0], -1)
            logits = penalize_rows(logits, seen, self.s.penalty)
        top = torch.topk(torch.softmax(logits, dim=-1), max(self.widths), dim=-1)
        cands = [top.indices[d, :w].tolist() for d, w in enumerate(self.widths)]
        cprobs = [top.values[d, :w].tolist() for d, w in enumerate(self.widths)]
        return cands, cprobs

    def draft(self) -> DraftTree:
        """Model drafts (see `head_logits`) and n-gram reuse, merged into one trie (fixed tree specs)."""
        last = self.ids[-1]
        tree = DraftTree.with_root(last)
        firsts: list[int] = []
        self.index_new_tokens()
        if self.paths:
            cands, cprobs = self.head_candidates()
            for tokens, p in build_head_paths(cands, cprobs, self.paths):
                tree.add_path(tokens, Source.HEAD, p)
            firsts = cands[0]
        if self.ngrams is not None:
            # n-grams starting with each depth-1 candidate (the paper), and, when the model proposes no
            # depth-1 token of its own (no heads, or fused drafting), n-grams starting with the root.
            starts = [(first, [first]) for first in firsts]
            if not firsts or self.fused_hidden is not None:
                starts.append((last, []))
            for key, prefix in starts:
                found = self.ngrams.top(key, self.s.ngram_topk)
                total = sum(c for _, c in found) or 1
                for cont, count in found:
                    path = prefix + list(cont)
                    tree.add_path(path, Source.NGRAM, [count / total] * len(path))
        return tree

    def draft_auto(self) -> tuple[DraftTree, list[list], str]:
        """Cost-aware drafting: every proposal (suffix match, fused heads, 4-grams) in one candidate trie,
        each node rated by its kind's measured acceptance, then pruned to the best expected rate."""
        last = self.ids[-1]
        self.probe_s = 0.0
        if not self.costs.rows:  # the first iteration: an AR-cost step, which also measures the one-row cost
            return DraftTree.with_root(last), [[]], "0 nodes: measuring this machine's step"
        if self.iteration < self.plan_next:  # nothing paid lately: rest the planner (its Python costs ~6% of a step)
            return DraftTree.with_root(last), [[]], f"0 nodes: no draft paid in the last {self.plan_idle} plans"
        cand = DraftTree.with_root(last)
        rates, keys, reach = [1.0], [[]], [1.0]
        self.index_new_tokens()
        scale = self.calibration.factor * self.payoff.factor
        # a node whose walk probability (times the scale) is below MIN_REACH could never pay for its row, and its
        # descendants are less likely still: a proposal is cut there (at temperature 1 most chains end within
        # a node or two, so planning stays cheap; greedy chains are likely and go on)
        floor = MIN_REACH / max(scale, 1e-9)

        rate_of, children, add_node = self.stats.rate, cand.children, cand.add_node

        def link(node: int, token: int, source: str, prob: float, kind: tuple, prior: float) -> int | None:
            """The child of `node` for this proposed token (made if new and likely enough), or None where cut."""
            rate = rate_of(kind, prior)
            child = children[node].get(token)
            if child is None:
                likely = reach[node] * rate
                if likely < floor:
                    return None
                child = add_node(node, token, source, prob)
                rates.append(rate)
                keys.append([kind])
                reach.append(likely)
            else:  # merged proposals: the larger rate (reach is recomputed from the final rates below)
                if rate > rates[child]:
                    rates[child] = rate
                keys[child].append(kind)
            return child

        def add(tokens: list[int], source: str, probs: list[float], kinds: list[tuple], priors: list[float]) -> None:
            node: int | None = 0
            for i, token in enumerate(tokens):
                node = link(node, token, source, probs[i], kinds[i], priors[i])
                if node is None:
                    return

        if self.suffix is not None:
            m, cont = self.suffix.lookup(SUFFIX_DRAFT)
            if cont:
                kinds = _suffix_kinds(m)
                prior = (0.6 if m >= 3 else 0.3) * self.prior_scale
                add(cont, Source.NGRAM, [1.0] * len(cont), kinds, [prior] * len(cont))
        if self.datastore is not None:  # what followed the last tokens in the model's datastore: a chain, plus the
            context = self.ids[-DATASTORE_CONTEXT:]  # runner-up continuation at depth 1
            node = 0
            for depth in range(1, DATASTORE_DRAFT + 1):
                order, found = self.datastore.lookup(context)
                if not found:
                    break
                if depth == 1:
                    for token, share in found[1:]:
                        link(0, token, Source.NGRAM, share, (Source.DATASTORE, order, _prob_bucket(share), 1),
                             min(PRIOR_CAP, share * self.prior_scale))
                token, share = found[0]
                node = link(node, token, Source.NGRAM, share, (Source.DATASTORE, order, _prob_bucket(share), min(depth, 3)),
                            min(PRIOR_CAP, share * self.prior_scale))
                if node is None:  # cut: the next links would be less likely still
                    break
                context = context[1:] + [token]
        consult_heads = bool(self.paths) and self.fused_hidden is not None and self.iteration >= self.head_next
        if consult_heads:
            t_consult = time.perf_counter()
            cands, cprobs = self.head_candidates()
            self.head_consult_s = time.perf_counter() - t_consult
            for tokens, p in build_head_paths(cands, cprobs, self.paths):
                kinds = [(Source.HEAD, d + 1, _prob_bucket(q)) for d, q in enumerate(p)]
                add(tokens, Source.HEAD, p, kinds, p)
        if self.ngrams is not None:
            found = self.ngrams.top(last, AUTO_NGRAMS)
            total = sum(c for _, c in found) or 1
            for cont, count in found:
                share = count / total
                kinds = _ngram_kinds(_prob_bucket(share), len(cont))
                add(list(cont), Source.NGRAM, [share] * len(cont), kinds, [0.3 * share * self.prior_scale] * len(cont))

        for i in range(1, len(cand)):  # from the final (merged) rates
            reach[i] = reach[cand.parents[i]] * rates[i]
        plan = choose(reach, cand.depths, self.costs, self.max_rows, calibration=scale)
        if plan.keep and self.iteration >= PROBE_AFTER and self.costs.needs_probe(len(self.ids)):
            # drafting looks worth it, and the acceptance rates rest on some evidence: measure, then decide
            t = time.perf_counter()
            self.costs.probe(self.probe_rows, len(self.ids))
            self.probe_s = time.perf_counter() - t
            plan = choose(reach, cand.depths, self.costs, self.max_rows, calibration=scale)
        self.expected_drafted = sum(reach[i] for i in plan.keep)
        tree = DraftTree.with_root(last)
        node_of = {0: 0}
        kept_keys: list[list] = [[]]
        for i in plan.keep:
            node_of[i] = tree.add_node(node_of[cand.parents[i]], cand.tokens[i], cand.sources[i], cand.draft_probs[i])
            kept_keys.append(keys[i])
        # Plans that keep nothing in a row: after the second, the planner rests 1, 2, 4, ... then at most 32 iterations.
        self.plan_idle = 0 if plan.keep else self.plan_idle + 1
        self.plan_next = self.iteration + (2 ** min(self.plan_idle - 2, PLANNER_REST_LOG2) if self.plan_idle >= 2 else 1)
        if consult_heads:  # heads whose tokens are not accepted are consulted after 2, 4, 8, ... then every 64 iterations
            # backed off now; an accepted head token (seen after the verification) resets the backoff
            # unless a consult is cheap against a step (a large model's): then every iteration, as its rates are
            # measured only where its nodes are verified
            self.head_idle += 1
            step_s = self.costs.seconds[0] if self.costs.seconds else 0.0
            cheap = self.head_consult_s * HEAD_CHEAP_RATIO <= step_s
            self.head_next = self.iteration + (1 if cheap else 2 ** min(self.head_idle, HEAD_REST_LOG2))
        return tree, kept_keys, plan.note

    def probe_rows(self, q: int) -> None:
        """One verification of q rows (a chain of the last token) in the scratch slots past the cache."""
        base = self.full.length
        tokens = torch.full((q,), self.ids[-1], dtype=torch.long)
        mask = torch.ones(q, q, dtype=torch.bool).tril_()
        h, _ = self.a.forward(tokens, base + torch.arange(q), self.full, base, mask)
        self.decide(self.a.logits(h), [[self.ids[-1]] * d for d in range(q)], list(range(q)))

    # ---- one iteration -------------------------------------------------------------------------------
    def plain_step(self, timings: ev.Timings, note: str) -> tuple[list[ev.AcceptedToken], list[ev.TreeNode], int, str]:
        """auto, when no draft pays: exactly an AR step (the root's own token is the bonus), which also keeps
        the heads' input (the fused hidden state) current."""
        root = self.ids[-1]
        h, token = self.one_row_step(timings)
        if self.fused:
            self.keep_hidden(h, 0)
        nodes = [ev.TreeNode(root, -1, 0, Source.ROOT, 1.0, True, None, token)] if self.detail else []
        return [ev.AcceptedToken(token, Source.BONUS, 1)], nodes, 0, note

    def tokenswift_step(self, timings: ev.Timings) -> tuple[list[ev.AcceptedToken], list[ev.TreeNode], int, str]:
        t = time.perf_counter()
        keys, note = None, ""
        if self.auto:
            tree, keys, note = self.draft_auto()
            if len(tree) == 1:  # nothing worth verifying: an AR-cost step
                draft_s = time.perf_counter() - t
                out = self.plain_step(timings, note)
                timings.draft_s = draft_s
                # the one-row cost is every plan's yardstick: keep it measured too
                self.costs.observe(1, timings.verify_s, draft_s - self.probe_s + timings.bookkeeping_s)
                self.calibration.observe(0.0, 0)
                self.payoff.observe(False, 1, timings.total_s - self.probe_s)
                return out
        else:
            tree = self.draft()
        self._sync()
        timings.draft_s = time.perf_counter() - t

        t = time.perf_counter()
        base = self.full.length  # slot of the root (the last accepted token)
        tokens, positions, mask, table = verification_inputs(tree, base)
        h, queries = self.a.forward(tokens, positions, self.full, base, mask, capture_queries=self.partial is not None)
        logits = self.a.logits(h)  # (N, V)
        timings.verify_s = time.perf_counter() - t

        t = time.perf_counter()
        probs = None  # (N, V): the visited rows' distributions (tensor or numpy), for the events
        picks = []  # per node: the target's token, read at visited nodes only
        walked = None
        if self.walk is exact_walk and logits.device.type == "cpu":  # the walk in one native call, visited rows only
            walked = native_decide.walk_tree(logits, self._seq_ptr, len(self.ids), self.s.penalty_window, table, self.s,
                                             0 if self.s.greedy else self.uniforms.address(max(tree.depths) + 1),
                                             self.detail)
        if walked is not None:
            path, bonus, picks, probs = walked
            if not self.s.greedy:
                self.uniforms.take(len(path) + 1)
        elif self.walk is exact_walk:
            extras = tree.ancestor_tokens() if self.s.penalty != 1.0 else None  # only a penalty window reads them
            picks, probs = self.decide(logits, extras, tree.depths)
            path, bonus = exact_walk(tree, picks.__getitem__)
            if not self.s.greedy:
                self.uniforms.take(len(path) + 1)
        else:  # the original per-row rule (for the tests only): a fresh draw every time a node is asked
            extras = tree.ancestor_tokens()

            def pick(node: int) -> int:
                u = None if self.s.greedy else torch.tensor([self.uniforms.next()], dtype=torch.float64)
                return decide_rows(logits[node : node + 1], self.seen([extras[node]]), self.s, u, want_probs=False)[0][0]

            path, bonus = per_row_walk(tree, pick)
        decide_s = time.perf_counter() - t
        self.full.compact([base + node for node in path], base + 1)
        self.full.length = base + len(path) + 1
        new_tokens = [tree.tokens[node] for node in path] + [bonus]
        self.commit(new_tokens)
        last_row = path[-1] if path else 0
        if self.fused:
            self.keep_hidden(h, last_row)
        if self.partial is not None:
            self.partial.append(self.full, list(range(base, self.full.length)), [q[:, last_row] for q in queries])
        if keys is not None:
            self.calibration.observe(self.expected_drafted, len(path))
            if any(tree.sources[n] == Source.HEAD for n in path):
                self.head_idle, self.head_next = 0, self.iteration + 1
            on_path = set(path)
            for visited in [0] + path:
                for child in tree.children[visited].values():
                    for kind in keys[child]:
                        self.stats.observe(kind, child in on_path)
        accepted = [ev.AcceptedToken(tree.tokens[n], Source.NGRAM if tree.sources[n] == Source.NGRAM else Source.HEAD,
                                     tree.depths[n]) for n in path]
        accepted.append(ev.AcceptedToken(bonus, Source.BONUS, len(path) + 1))
        nodes: list[ev.TreeNode] = []
        if self.detail:
            visited = set(path) | {0}
            if isinstance(probs, torch.Tensor):  # indexing numpy costs far less than a tensor
                probs = probs.float().cpu().numpy()
            has_picks = len(picks) > 0
            for i in range(len(tree)):
                parent = tree.parents[i]
                target_prob = float(probs[parent, tree.tokens[i]]) if probs is not None and parent in visited else None
                sample = int(picks[i]) if has_picks and i in visited else None
                nodes.append(ev.TreeNode(tree.tokens[i], parent, tree.depths[i], tree.sources[i], tree.draft_probs[i],
                                         i in visited, target_prob, sample))
        timings.bookkeeping_s = time.perf_counter() - t
        if self.costs is not None:
            other = timings.draft_s - self.probe_s + timings.bookkeeping_s - decide_s
            self.costs.observe(len(tree), timings.verify_s + decide_s, other)
            self.payoff.observe(True, len(path) + 1, timings.total_s - self.probe_s)
        return accepted, nodes, len(tree) - 1, note


AUTO_HEAD_TREE = "3x1x1"  # the head candidates auto may draw from (it keeps only those that pay; measured:
#                           it rarely keeps more than 10 nodes, and every offered node costs Python time)
PLANNER_REST_LOG2 = 5  # the planner rests at most 2**5 iterations after plans that kept nothing
HEAD_REST_LOG2 = 6  # unused heads are consulted at least every 2**6 iterations (a consult, three head blocks and three
#                     LM-head rows, costs about 0.2 ms in the decode loop through the native heads, 0.8 ms without;
#                     at paper sampling they rarely pay: consulting at least every 2**3 measured the same, 0.989
#                     against 0.991 in the app-like check)
HEAD_CHEAP_RATIO = 20  # a consult costing at most 1/20 of a one-row step is not backed off. Measured here (AMX host,
#                        the page's story, greedy + penalty 1.2): SmolLM2-135M's consult 0.80 ms against a 27.7 ms
#                        step, now every iteration: 1.20 -> 1.32 tokens per iteration, 1.09 -> 1.15x over 400 tokens;
#                        the default model's 0.26 ms against 3.6 ms keeps the backoff
AUTO_NGRAMS = 3  # 4-gram continuations of the root offered to auto
PROBE_AFTER = 16  # iterations before the first cost probe: until then plans price rows by the prior curve
SAMPLED_PRIOR_SCALE = 0.5  # suffix and 4-gram priors when sampling (the stats replace them within a few visits)
SUFFIX_DRAFT = 12  # longest suffix-match chain offered to auto
DATASTORE_DRAFT = 4  # longest datastore chain offered to auto (measured: deeper links rarely survive)
DATASTORE_CONTEXT = max(DATASTORE_ORDERS)  # tokens of context a datastore lookup reads
PRIOR_CAP = 0.9  # no prior rate reaches 1 (a child must never look likelier than its parent)


@functools.lru_cache(maxsize=None)
def _suffix_kinds(m: int) -> list[tuple]:
    """The acceptance-statistics keys of a suffix-match chain's nodes (match length m, by chain position)."""
    return [(Source.SUFFIX, min(m, 8), _chain_bucket(j)) for j in range(1, SUFFIX_DRAFT + 1)]


@functools.lru_cache(maxsize=None)
def _ngram_kinds(bucket: int, n: int) -> list[tuple]:
    """The keys of a 4-gram continuation's n nodes whose count share falls in `bucket`."""
    return [(Source.NGRAM, j + 1, bucket) for j in range(n)]


def _chain_bucket(j: int) -> int:
    return j if j <= 2 else 3 if j <= 4 else 5 if j <= 8 else 9


def _prob_bucket(p: float) -> int:
    return min(4, int(p * 5))
