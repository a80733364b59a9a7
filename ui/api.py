"""The app's public API endpoint `/generate` (gr.api): one method, streamed as JSON lines."""
from __future__ import annotations

import json
from typing import Callable, Iterator

import gradio as gr

from tokenswift import Settings
from tokenswift.serve.torch_thread import TORCH

from .controls import MAX_NEW_TOKENS
from .live import LiveApp


def api_generate(app: LiveApp) -> Callable:
    def generate(prompt: str, max_new_tokens: int = 200, method: str = "tokenswift", settings_json: str = "{}",
                 seed: int = 0, model: str = "") -> Iterator[str]:
        """Stream a generation. `settings_json` holds tokenswift.Settings fields, e.g.
        {"temperature": 1.0, "min_p": 0.1, "penalty": 1.2}. Yields JSON strings
        {"text", "new_tokens", "done", "stats"}; the last one has done = true."""
        try:
            settings = Settings.from_dict(json.loads(settings_json or "{}"))
        except (ValueError, TypeError) as exc:
            raise gr.Error(f"invalid settings: {exc}") from None
        if method not in ("ar", "tokenswift"):
            raise gr.Error("method must be 'ar' or 'tokenswift'")
        if not isinstance(max_new_tokens, (int, float)) or not 1 <= int(max_new_tokens) <= MAX_NEW_TOKENS:
            raise gr.Error(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}")
        name = model or app.models.names()[0]
        gen = app._generator(name)
        if not isinstance(prompt, str) or not prompt.strip():
            raise gr.Error("prompt must be a non-empty string")
        ids: list[int] = []
        iterations, compute = 0, 0.0
        for step in TORCH.iterate(gen.stream(prompt, settings, int(max_new_tokens), method=method, seed=int(seed))):
            ids.extend(step.token_ids)
            iterations, compute = step.index + 1, step.elapsed_s
            stats = {"method": method, "iterations": iterations, "new_tokens": len(ids),
                     "mean_accepted": len(ids) / iterations, "compute_s": compute,
                     "tokens_per_s": len(ids) / compute if compute else 0.0}
            yield json.dumps({"text": gen.decode(ids), "new_tokens": len(ids), "done": step.done, "stats": stats})
    return generate
