"""Resume checkpoints: tensors, numbers, strings and plain containers only, so they load with
`torch.load(..., weights_only=True)` and reading one never runs code stored in it."""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch


def save_state(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temporary file, then rename over ``path`` (a crash never leaves half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any]:
    """A state saved by :func:`save_state`; a file that holds any other kind of object is refused."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{path} holds objects other than tensors and plain values, so it is not loaded; "
                         f"delete it to train from the start") from None
