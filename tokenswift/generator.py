"""The generator: a loaded model with its heads, datastore and tokenizer, and the calls that generate with it.

How one generation runs (the paper's phases, one Step event per iteration) is tokenswift/decode_loop.py."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from . import events as ev, gguf_blocks
from .adapter import ModelAdapter
from .backend import Backend
from .codec import decode_ids, encode_text
from .datastore import Datastore, find as find_datastore
from .decode_loop import DecodeLoop
from .heads import Heads, read_head_tensors, root_term
from .kinds import Method
from .lean import LeanHeads
from .native import layers as native_layers, switches
from .run_summary import RunSummary
from .settings import Settings
from .tree import AUTO
from .validate import check_generation, validate_seed

METHODS = tuple(Method)


@dataclass
class Result:
    prompt_ids: list[int]
    token_ids: list[int]  # new tokens only
    text: str
    stats: dict = field(default_factory=dict)


class Generator:
    """A loaded model (plus optional heads and tokenizer) that generates with AR or TokenSwift."""

    def __init__(self, model: nn.Module, tokenizer=None, heads: Heads | None = None,
                 datastore: Datastore | None = None, backend: Backend | None = None) -> None:
        """backend: the compute backend (default: this process's, `tokenswift.backend.current()`)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.adapter = ModelAdapter(model, backend)
        self._heads: Heads | None = None
        self._lean_heads: LeanHeads | None = None
        self._native_heads: native_layers.NativeHeads | None = None
        self._root_u: torch.Tensor | None = None
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
        blocks = next(model.parameters()).device.type == "cpu" and switches.current().blocks
        local = _local_dir(path) if heads or datastore or blocks else None
        if blocks:
            gguf_blocks.load_for(model, local)  # the GGUF blocks the weights came from: streamed in their place
        gen = cls(model, tokenizer)
        if heads or datastore:
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
        self._lean_heads = None if heads is None or lean is None else LeanHeads(heads, lean.compute_dtype, lean.backend)
        native = self._lean_heads is not None and self.adapter.backend.serves("layers")
        self._native_heads = native_layers.NativeHeads.build(self._lean_heads, lean.draft_head) if native else None
        self._root_u = None  # the heads' root input U in the dtype their input arrives in, or None
        if heads is not None and heads.root_input is not None:
            u = heads.root_input.weight.detach()
            self._root_u = u.to(lean.compute_dtype) if lean is not None else u

    def heads_input(self, hidden: torch.Tensor, root: int | None) -> torch.Tensor:
        """hidden (1, H): the hidden state the heads start from -> what they read: with a root input (tokenswift.heads),
        hidden + U · unit_rms(embed(root)), root the token after hidden's position (fused: the tree's root, the last
        accepted token; paper: depth 1's top token). Else hidden itself."""
        u = self._root_u
        if u is None or root is None:
            return hidden
        row = self.adapter.inner.embed_tokens.weight[root].to(u.device)  # (H,)
        return hidden + root_term(u, row).to(device=hidden.device, dtype=hidden.dtype)

    def head_drafts(self, hidden: torch.Tensor, levels: int, k: int, root: int | None = None
                    ) -> tuple[list[list[int]], list[list[float]]]:
        """hidden (1, H) before the final norm -> per head (the first `levels`), its k most likely ids over the
        drafting vocabulary (`run_heads(..., draft_vocab=True)`) and their softmax probabilities, most likely first:
        in one native call where the kernels serve (tokenswift/native/layers.py NativeHeads), else through PyTorch.
        A drafting vocabulary of fewer than k ids gives all of its ids. root: the token the tree starts from (read
        by heads with a root input, `heads_input`)."""
        hidden = self.heads_input(hidden, root)
        lean = self.adapter.lean
        k = min(k, lean.draft_vocab if lean is not None else self.adapter.vocab_size)
        found = self._native_heads.top(hidden, levels, k) if self._native_heads is not None else None
        if found is None:
            logits = self.run_heads(hidden, levels, draft_vocab=True)[:, 0].float()  # (levels, V')
            top = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
            found = (top.indices.tolist(), top.values.tolist())
        ids = None if lean is None else lean.draft_ids
        if ids is None:
            return found
        return [[ids[i] for i in row] for row in found[0]], found[1]  # drafting rows -> token ids

    def run_heads(self, hidden: torch.Tensor, levels: int, draft_vocab: bool = False) -> torch.Tensor:
        """hidden (T, H) before the final norm (through `heads_input` where the heads have a root input) -> the
        first `levels` heads' LM-head logits, (levels, T, V). draft_vocab: only over the lean step's drafting
        vocabulary (V' <= V columns, column j being token id `LeanModel.draft_ids[j]`, or j where that is None; on
        a CPU an 8x cheaper product for the default model)."""
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
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        return DecodeLoop(self, ids, settings, max_new_tokens, method, seed, eos, detail).steps(stop)

    def generate(self, prompt: str | list[int], settings: Settings | None = None, max_new_tokens: int = 256,
                 method: str = Method.TOKENSWIFT, seed: int = 0, stop: threading.Event | None = None) -> Result:
        prompt_ids = self.encode(prompt)
        new: list[int] = []
        stats = RunSummary()
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
