"""The models a server may load: an allowlist, never arbitrary paths typed by a user.

A model is a local directory or the name of a built-in model (tokenswift/builtin.py), which is fetched and
converted on first use (tokenswift/serve/fetches.py). Two views of each allowed model:
- `Codec` (the web server): its tokenizer and the numbers the validator needs (maximum positions,
  vocabulary size), read from its files without loading any weight;
- `ModelCache` (the engine process): the loaded `Generator`, weights included.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..builtin import BUILTIN_MODELS, is_builtin, resolve_model
from ..codec import decode_ids, encode_text
from ..validate import ModelLimits, shown
from .fetches import FetchJob, Fetches

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_NAME = "default: Austen & KJV, 16M (bundled)"
DEFAULT_MODEL_DIR = ROOT / "assets" / "default-model"


def allowlist(strict: bool = False) -> dict[str, str]:
    """Display name -> local directory or built-in model name. The bundled model comes first (the page's default;
    TOKENSWIFT_DEFAULT_MODEL replaces its directory), then the built-in models; extra entries come from
    TOKENSWIFT_MODELS="name=path;name2=smollm2-135m". An item that is not name=source is skipped, or with `strict`
    raises ValueError naming the variable."""
    models = {DEFAULT_MODEL_NAME: os.environ.get("TOKENSWIFT_DEFAULT_MODEL") or str(DEFAULT_MODEL_DIR)}
    for model in BUILTIN_MODELS.values():
        models[f"{model.title} (fetched on first use)"] = model.name
    for item in filter(None, (part.strip() for part in (os.environ.get("TOKENSWIFT_MODELS") or "").split(";"))):
        name, sep, path = item.partition("=")
        if sep and name.strip() and path.strip():
            models[name.strip()] = path.strip()
        elif strict:
            raise ValueError(f"TOKENSWIFT_MODELS: {shown(item)} is not name=folder (or name=built-in model's name); "
                             "items are separated by ';'")
    return models


def check_allowlist() -> dict[str, str]:
    """The allowlist, or ValueError (one sentence naming the variable) where the operator's model settings cannot
    serve: an item of TOKENSWIFT_MODELS that is not name=source, or an entry (TOKENSWIFT_DEFAULT_MODEL's too) naming
    neither a model folder nor a built-in model. The server checks this before it starts, as it does its limits."""
    models = allowlist(strict=True)
    for name, path in models.items():
        if not is_builtin(path) and not (Path(path) / "config.json").is_file():
            variable = "TOKENSWIFT_DEFAULT_MODEL" if name == DEFAULT_MODEL_NAME else "TOKENSWIFT_MODELS"
            raise ValueError(f"{variable}: no model folder (one with a config.json) at {path}")
    return models


def entry_named(models: Mapping[str, str], name: str) -> str:
    """The allowlist's entry that `name` means: the entry itself, or the entry of the built-in model of that name
    (`smollm2-135m` for "SmolLM2-135M-Instruct (fetched on first use)"); else `name` unchanged (refused later)."""
    if name in models or not is_builtin(name):
        return name
    return next((entry for entry, source in models.items() if source == name), name)


def _check_name(models: dict[str, str], name: str) -> str:
    if name not in models:
        builtins = [source for source in models.values() if is_builtin(source)]
        also = f" (or a built-in model's name: {', '.join(builtins)})" if builtins else ""
        raise ValueError(f"unknown model {shown(name)}: choose one of {', '.join(models)}{also}")
    path = models[name]
    if not is_builtin(path) and not Path(path).exists():
        raise ValueError(f"model files not found at {path}")
    return path


@dataclass(frozen=True)
class Codec:
    """A model as the web server sees it: text <-> ids, and its size limits. No weights, no torch work."""

    name: str
    tokenizer: object
    limits: ModelLimits  # maximum positions and vocabulary size, for the validator
    parameters: int = 0  # weights of the model, estimated from its config (the admission's cost estimate)

    @classmethod
    def load(cls, name: str, path: str) -> "Codec":
        from transformers import AutoTokenizer

        path = resolve_model(path)  # a built-in model: its folder (fetched on first use)
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        tokenizer = AutoTokenizer.from_pretrained(path)
        positions = config.get("max_position_embeddings") or config.get("n_positions")
        return cls(name, tokenizer, ModelLimits(int(positions), int(config["vocab_size"])), _parameters(config))

    def encode(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def decode_one(self, token: int) -> str:
        return decode_ids(self.tokenizer, [token])


def _parameters(config: dict) -> int:
    """Weights of a decoder from its config: attention and MLP per layer, and the embedding (0: unknown)."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        ffn = int(config.get("intermediate_size") or 4 * hidden)
        return layers * (4 * hidden * hidden + 3 * hidden * ffn) + int(config["vocab_size"]) * hidden
    except (KeyError, TypeError, ValueError):
        return 0


class Codecs:
    """The server's codecs, loaded once on first use (a built-in model's fetch first, outside the lock, so that
    the other models' codecs stay available meanwhile)."""

    def __init__(self, models: dict[str, str] | None = None, fetches: Fetches | None = None) -> None:
        self.models = models if models is not None else allowlist()
        self.fetches = fetches or Fetches()
        self._loaded: dict[str, Codec] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self.models)

    def fetching(self, name: str) -> FetchJob | None:
        """The fetch the model `name` waits for (started now if needed), or None: nothing to fetch."""
        path = self.models.get(name)
        if name in self._loaded or not is_builtin(path):
            return None
        return self.fetches.start(path)

    def get(self, name: str) -> Codec:
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
        path = _check_name(self.models, name)
        if is_builtin(path):
            self.fetches.wait(path)
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = Codec.load(name, path)
            return self._loaded[name]


class ModelCache:
    """The engine's loaded generators: each allowed model loaded once, on first use, on the torch thread."""

    def __init__(self, models: dict[str, str] | None = None) -> None:
        self.models = models if models is not None else allowlist()
        self._loaded: dict = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str):
        from .torch_thread import TORCH

        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = TORCH.call(_load_warm, _check_name(self.models, name))
            return self._loaded[name]


def _load_warm(path: str):
    """Load a generator and warm it up (Generator.warm_up), so that the first Run's speed is its steady speed."""
    from tokenswift import Generator

    gen = Generator.from_pretrained(resolve_model(path))  # a built-in model is fetched on first use
    try:  # optional: a model the warm-up's short runs do not suit (a tiny context, say) still loads
        gen.warm_up()
    except Exception:
        pass
    return gen
