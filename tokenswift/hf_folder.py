"""A plain Hugging Face folder (bfloat16 safetensors, the tokenizer, a generation config) from a GGUF file or a
Hub snapshot, for tokenswift/builtin.py.

transformers reads a GGUF (dequantized, through the `gguf` package) but refuses to save a model it loaded that way,
so the weights are copied, strictly, into a fresh model built from the same config, which is saved without the
GGUF's `quantization_config`. The generation config stops at the model's end of turn, which for an instruct model
is not always the tokenizer's end of text.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

DTYPE = torch.bfloat16


def load_gguf(path: Path) -> tuple[torch.nn.Module, object]:
    """The model (dequantized to bfloat16) and tokenizer described by one GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=DTYPE)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def load_folder(path: Path) -> tuple[torch.nn.Module, object]:
    """The model (in bfloat16) and tokenizer of a Hugging Face folder; never runs remote code."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPE, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    return model, tokenizer


def write(model: torch.nn.Module, tokenizer, out: Path, end_of_turn: str) -> Path:
    """Save `model` and `tokenizer` into `out` as a plain folder whose generation config stops at `end_of_turn`."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    eos = tokenizer.get_vocab().get(end_of_turn)
    if eos is None:
        raise ValueError(f"the tokenizer has no token {end_of_turn!r} to stop at")
    config = copy.deepcopy(model.config)
    for gguf_only in ("quantization_config", "_model_name_or_path"):  # the saved weights are plain bfloat16
        if hasattr(config, gguf_only):
            delattr(config, gguf_only)
    state = model.state_dict()
    not_float = sorted(k for k, v in state.items() if not v.is_floating_point())
    if not_float:
        raise ValueError(f"the loaded model keeps packed weights ({', '.join(not_float[:3])}): nothing to save")
    with _quiet():
        fresh = AutoModelForCausalLM.from_config(config, dtype=DTYPE)
        fresh.load_state_dict(state, strict=True)
        fresh.tie_weights()
        fresh.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                     pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
                     ).save_pretrained(out)
    return out


@contextmanager
def _quiet() -> Iterator[None]:
    """transformers' notices (the GGUF dtype advice, unexpected keys) and its "Loading weights" bars, silenced."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
