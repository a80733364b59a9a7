"""The models the app may load: an allowlist, never arbitrary paths typed by a user."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from tokenswift import Generator

from .torch_thread import TORCH

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_NAME = "default: Austen & KJV, 16M (bundled)"
DEFAULT_MODEL_DIR = ROOT / "assets" / "default-model"


def allowlist() -> dict[str, str]:
    """Display name -> local directory. TOKENSWIFT_DEFAULT_MODEL replaces the bundled model's directory;
    extra entries come from TOKENSWIFT_MODELS="name=path;name2=path2"."""
    models = {DEFAULT_MODEL_NAME: os.environ.get("TOKENSWIFT_DEFAULT_MODEL") or str(DEFAULT_MODEL_DIR)}
    for item in filter(None, (os.environ.get("TOKENSWIFT_MODELS") or "").split(";")):
        name, sep, path = item.partition("=")
        if sep and name.strip() and path.strip():
            models[name.strip()] = path.strip()
    return models


class ModelCache:
    """Loads each allowed model once, on first use; shared read-only by every session."""

    def __init__(self, models: dict[str, str] | None = None) -> None:
        self.models = models if models is not None else allowlist()
        self._loaded: dict[str, Generator] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str) -> Generator:
        if name not in self.models:
            raise ValueError(f"unknown model {name!r}: choose one of {', '.join(self.models)}")
        with self._lock:
            if name not in self._loaded:
                path = self.models[name]
                if not Path(path).exists():
                    raise ValueError(f"model files not found at {path}")
                self._loaded[name] = TORCH.call(Generator.from_pretrained, path)
            return self._loaded[name]

    def add(self, name: str, generator: Generator) -> None:
        """Register an already loaded generator (tests, notebooks)."""
        with self._lock:
            self.models.setdefault(name, "<in memory>")
            self._loaded[name] = generator
