"""TokenSwift's multi-token heads: sequential residual blocks that share the model's LM head.

h_0 is the last decoder layer's output before the final norm. Head i computes
    h_i = h_{i-1} + W_i · RMSNorm_in_i(h_{i-1})        logits_i = lm_head(RMSNorm_post_i(h_i))
and predicts the token at offset +2+i (the base LM head predicts +1). W_i is hidden x hidden, no bias.
Official checkpoints store them in the model's state dict as `model.medusa_layers.{i}.linear.weight`,
`.input_layernorm.weight` and `.post_layernorm.weight`, with `"medusa_heads": N` in config.json; we load and
save exactly that layout.

Our own extension, beside those keys: a **root input** (`tokenswift.root_input.weight`, hidden x hidden). h0 is the
state at the last accepted node, whose logits gave the token the next tree starts from (its root); h0 does not
know which token that was (a sample, or a penalised pick). With a root input, the heads read
    h0' = h0 + U · unit_rms(embed(root))
instead of h0 (U = 0 is the plain heads). A small model is unsure of its next token, so that one token is much of
what its heads lack: trained so, SmolLM2-135M's heads guess the token after the root far more often (the card in
assets/smollm2-135m). Heads without the key are the official ones, unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

OFFICIAL_PREFIX = "model.medusa_layers."
PARTS = ("linear.weight", "input_layernorm.weight", "post_layernorm.weight")
# Our own addition beside the official keys: the token ids the heads were trained to rank (their drafting
# vocabulary, most frequent first; tokenswift.train.distill_heads). Absent: the engine's default.
DRAFT_VOCAB_KEY = "tokenswift.draft_vocab"
ROOT_INPUT_KEY = "tokenswift.root_input.weight"  # our root input U (see the module's docstring); absent: none
HEADS_FILE = "heads.safetensors"  # in a model folder: the heads, which replace any stored inside its weights


def unit_rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x (..., H) scaled to root-mean-square 1 along its last dimension: an embedding row as the root input reads it."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def root_term(u: torch.Tensor, root_embedding: torch.Tensor) -> torch.Tensor:
    """U (H, H), root_embedding (..., H) -> U · unit_rms(root_embedding) (..., H) in U's dtype: what the root adds to
    the heads' input."""
    return F.linear(unit_rms(root_embedding).to(u.dtype), u)


class HeadBlock(nn.Module):
    def __init__(self, hidden_size: int, norm_factory) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=False)
        self.input_layernorm = norm_factory()
        self.post_layernorm = norm_factory()
        nn.init.zeros_(self.linear.weight)  # a fresh head is the identity


class Heads(nn.Module):
    """A stack of `num_heads` sequential residual heads. `forward(h0)` returns the hidden state each
    head feeds to the shared LM head: (num_heads, T, hidden)."""

    def __init__(self, hidden_size: int, num_heads: int, norm_factory) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.hidden_size = hidden_size
        self.layers = nn.ModuleList(HeadBlock(hidden_size, norm_factory) for _ in range(num_heads))
        self.draft_vocab: torch.Tensor | None = None  # (V',) int64 token ids the heads rank, or None: the engine's
        self.root_input: nn.Linear | None = None  # U of the root input, or None: plain heads

    def add_root_input(self) -> "Heads":
        """Give the heads a root input, zero (so they compute what they computed before until trained)."""
        ref = self.layers[0].linear.weight
        self.root_input = nn.Linear(self.hidden_size, self.hidden_size, bias=False).to(device=ref.device, dtype=ref.dtype)
        nn.init.zeros_(self.root_input.weight)
        return self

    def with_root(self, h0: torch.Tensor, root_embedding: torch.Tensor | None) -> torch.Tensor:
        """h0 (T, H), root_embedding (T, H) or (H,): the embedding row of the token each row's tree starts from ->
        what the head blocks read (h0 itself without a root input or without a root)."""
        if self.root_input is None or root_embedding is None:
            return h0
        return h0 + root_term(self.root_input.weight, root_embedding).to(h0.dtype)

    @property
    def num_heads(self) -> int:
        return len(self.layers)

    @classmethod
    def init(cls, model: nn.Module, num_heads: int = 3) -> "Heads":
        """Fresh heads for `model` that are the identity on its logits: W_i = 0 and each post norm is the model's
        final norm (so head i's logits are the base LM head's until trained), with the model family's own RMSNorm
        class, on the model's embedding device and dtype."""
        config = model.config
        norm_cls = type(model.model.norm)
        eps = getattr(config, "rms_norm_eps", 1e-6)
        heads = cls(config.hidden_size, num_heads, lambda: norm_cls(config.hidden_size, eps=eps))
        final = model.model.norm.weight
        if final.device.type != "meta":
            with torch.no_grad():
                for block in heads.layers:
                    block.post_layernorm.weight.copy_(final.detach().float())
        ref = model.model.embed_tokens.weight
        device = ref.device if ref.device.type != "meta" else torch.device("cpu")
        return heads.to(device=device, dtype=ref.dtype)

    def forward(self, h0: torch.Tensor, root_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """h0: (T, hidden) -> (num_heads, T, hidden), each already through its post norm. root_embedding: see
        `with_root`."""
        outs = []
        h = self.with_root(h0, root_embedding)
        for block in self.layers:
            h = h + block.linear(block.input_layernorm(h))
            outs.append(block.post_layernorm(h))
        return torch.stack(outs)

    # ---- official layout -------------------------------------------------------------------------
    def official_state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{OFFICIAL_PREFIX}{i}.{part}": t.detach().contiguous().cpu()
                for i, block in enumerate(self.layers)
                for part, t in _parts(block).items()}

    def load_official_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Strict: every expected key must be present with the right shape; no extra head keys."""
        expected = {f"{OFFICIAL_PREFIX}{i}.{part}" for i in range(self.num_heads) for part in PARTS}
        present = {k for k in tensors if k.startswith(OFFICIAL_PREFIX)}
        missing, extra = sorted(expected - present), sorted(present - expected)
        if missing or extra:
            raise ValueError(f"head weights do not match {self.num_heads} heads: missing {missing[:4]}, unexpected {extra[:4]}")
        for i, block in enumerate(self.layers):
            for part, param in _parts(block).items():
                value = tensors[f"{OFFICIAL_PREFIX}{i}.{part}"]
                if tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{OFFICIAL_PREFIX}{i}.{part}: shape {tuple(value.shape)}, expected {tuple(param.shape)}")
                with torch.no_grad():
                    param.copy_(value.to(param.dtype))

    def save(self, path: str | Path) -> Path:
        """Save as a standalone safetensors file in the official key layout (metadata: medusa_heads)."""
        path = Path(path)
        if path.suffix != ".safetensors":
            path = path / HEADS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = self.official_state_dict()
        if self.draft_vocab is not None:
            tensors[DRAFT_VOCAB_KEY] = self.draft_vocab.to(torch.int64).contiguous().cpu()
        if self.root_input is not None:
            tensors[ROOT_INPUT_KEY] = self.root_input.weight.detach().contiguous().cpu()
        save_file(tensors, str(path), metadata={"medusa_heads": str(self.num_heads)})
        return path

    @classmethod
    def load(cls, model: nn.Module, source: str | Path) -> "Heads":
        """Load heads for `model` from a safetensors file or a checkpoint directory (official TokenSwift
        checkpoints, a directory saved by `save_with_model`, or one holding `heads.safetensors`, which then wins over
        heads inside its weights)."""
        tensors = read_head_tensors(source)
        if not tensors:
            raise ValueError(f"no TokenSwift head weights ({OFFICIAL_PREFIX}*) found in {source}")
        count = 1 + max(int(k[len(OFFICIAL_PREFIX):].split(".")[0]) for k in tensors)
        heads = cls.init(model, num_heads=count)
        heads.load_official_state_dict(tensors)
        heads.draft_vocab = read_draft_vocab(source, model.lm_head.weight.shape[0])
        root = read_root_input(source)
        if root is not None:
            if tuple(root.shape) != (heads.hidden_size, heads.hidden_size):
                raise ValueError(f"{ROOT_INPUT_KEY}: shape {tuple(root.shape)}, expected {(heads.hidden_size,) * 2}")
            heads.add_root_input()
            with torch.no_grad():
                heads.root_input.weight.copy_(root.to(heads.root_input.weight.dtype))
        return heads


def _parts(block: HeadBlock) -> dict[str, torch.Tensor]:
    return {"linear.weight": block.linear.weight,
            "input_layernorm.weight": block.input_layernorm.weight,
            "post_layernorm.weight": block.post_layernorm.weight}


def _safetensors_files(source: Path) -> list[Path]:
    """The files heads are read from: a file itself; in a folder its heads file where it has one (heads retrained
    for a model ship beside its weights, and those weights may still hold older heads), else its weight files."""
    if source.is_file():
        return [source]
    if (source / HEADS_FILE).is_file():
        return [source / HEADS_FILE]
    index = source / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted({f for k, f in weight_map.items() if k.startswith(OFFICIAL_PREFIX)})
        return [source / n for n in names]
    return sorted(source.glob("*.safetensors"))


def read_draft_vocab(source: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The drafting vocabulary saved beside the heads (DRAFT_VOCAB_KEY), checked: distinct ids below vocab_size."""
    source = Path(source)
    for file in _safetensors_files(source) if source.exists() else []:
        with safe_open(str(file), framework="pt") as f:
            if DRAFT_VOCAB_KEY in f.keys():
                ids = f.get_tensor(DRAFT_VOCAB_KEY).to(torch.int64).flatten()
                if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != ids.numel():
                    raise ValueError(f"{file}: {DRAFT_VOCAB_KEY} must hold distinct token ids below {vocab_size}")
                return ids
    return None


def read_root_input(source: str | Path) -> torch.Tensor | None:
    """The root input's U saved beside the heads (ROOT_INPUT_KEY), or None."""
    source = Path(source)
    for file in _safetensors_files(source) if source.exists() else []:
        with safe_open(str(file), framework="pt") as f:
            if ROOT_INPUT_KEY in f.keys():
                return f.get_tensor(ROOT_INPUT_KEY)
    return None


def read_head_tensors(source: str | Path) -> dict[str, torch.Tensor]:
    """All `model.medusa_layers.*` tensors found in a file or directory (empty dict if none)."""
    source = Path(source)
    if not source.exists():
        return {}
    out: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(source):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith(OFFICIAL_PREFIX):
                    out[key] = f.get_tensor(key)
    return out


def save_with_model(model: nn.Module, heads: Heads, tokenizer, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Save the model, tokenizer and heads together in the official layout: the head tensors sit
    inside model.safetensors and config.json says `medusa_heads`. Plain transformers loads the result
    (it reports the head keys as unexpected and ignores them)."""
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    weights = directory / "model.safetensors"
    if not weights.exists():
        raise ValueError("save_with_model expects a single-file checkpoint (model.safetensors)")
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata() or {}
        for key in f.keys():
            tensors[key] = f.get_tensor(key)
    dtype = dtype or next(iter(tensors.values())).dtype  # the heads' weights in the model's dtype
    for key, value in heads.official_state_dict().items():
        tensors[key] = value.to(dtype)
    if heads.draft_vocab is not None:
        tensors[DRAFT_VOCAB_KEY] = heads.draft_vocab.to(torch.int64).contiguous().cpu()
    if heads.root_input is not None:
        tensors[ROOT_INPUT_KEY] = heads.root_input.weight.detach().to(dtype).contiguous().cpu()
    save_file(tensors, str(weights), metadata=metadata)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["medusa_heads"] = heads.num_heads
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory
