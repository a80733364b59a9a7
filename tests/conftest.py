"""Shared fixtures: tiny randomly initialised models of every supported family, built from configs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tokenswift as ts  # noqa: E402
from tokenswift.serve.models import DEFAULT_MODEL_NAME  # noqa: E402

# Tests use the bundled model (never a fetched one): the page opens on it even where SmolLM2 was fetched before.
os.environ.setdefault("TOKENSWIFT_PAGE_MODEL", DEFAULT_MODEL_NAME)

# Small ops dominate these tests: one thread avoids oversubscription when other work shares the cores.
torch.set_num_threads(int(os.environ.get("TOKENSWIFT_TEST_THREADS", "1")))

WEIGHT_SCALE = 0.2  # large enough that the random models' logits are far from flat
# A Llama with GQA and head size 64, so that tests reach the native decoder stack (tokenswift/native/layer_rows.c:
# head sizes 64 and 128 only) where this machine builds it; FAMILIES' models have head size 16 (PyTorch attention).
NATIVE_FAMILY = "llama-gqa-hd64"


def tiny_config(family: str, vocab: int = 256, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  max_position_embeddings=8192, initializer_range=WEIGHT_SCALE, rms_norm_eps=1e-6)
    if family == "llama-mha":
        cfg = LlamaConfig(num_attention_heads=4, num_key_value_heads=4, **common)
    elif family == "llama-gqa":
        cfg = LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    elif family == "qwen2":  # q/k/v biases and tied embeddings
        cfg = Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, **common)
    elif family == "mistral":  # GQA and a sliding window shorter than the tests' sequences
        cfg = MistralConfig(num_attention_heads=4, num_key_value_heads=1, sliding_window=96, **common)
    elif family == NATIVE_FAMILY:  # head size 64 (the others' is 16): the native decoder stack serves it
        cfg = LlamaConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                          **{**common, "hidden_size": 128, "intermediate_size": 256})
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_model(family: str, seed: int = 0, vocab: int = 256, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family, vocab, **overrides)
    cfg.eos_token_id = cfg.bos_token_id = cfg.pad_token_id = None  # no special tokens: nothing stops generate
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    if family == "qwen2":  # random biases (they start at zero)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, WEIGHT_SCALE)
    return model


def random_heads(model, num_heads: int = 3, seed: int = 1, scale: float = 0.05) -> ts.Heads:
    heads = ts.Heads.init(model, num_heads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.layers:
            block.linear.weight.copy_(torch.randn(block.linear.weight.shape, generator=gen) * scale)
            block.input_layernorm.weight.copy_(1 + 0.1 * torch.randn(block.input_layernorm.weight.shape, generator=gen))
            block.post_layernorm.weight.copy_(1 + 0.1 * torch.randn(block.post_layernorm.weight.shape, generator=gen))
    return heads


FAMILIES = ["llama-mha", "llama-gqa", "qwen2", "mistral"]


def native_stack_or_skip(gen: ts.Generator) -> None:
    """Asserts that `gen` computes through the native decoder stack where this machine has the native library;
    skips (saying why) where it has not (no C compiler, no AVX2 with FMA, TOKENSWIFT_NATIVE=0)."""
    from tokenswift.native import build, layers, panels, rows_attention

    if not (layers.available() and rows_attention.available() and panels.available()):
        pytest.skip(f"native decoder stack unavailable: {build.why_not('layer_rows') or build.why_not('attend_rows')}"
                    f" / {panels.why_unavailable()}")
    lean = gen.adapter.lean
    assert lean is not None and lean.native_stack is not None, "the native library is here but does not serve the model"


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


SAMPLE_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
    "of a wife. In the beginning God created the heaven and the earth. The family of Dashwood had long been "
    "settled in Sussex. Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings. "
) * 4


def tiny_tokenizer(vocab: int = 300):
    """A byte-level BPE trained in the test on a few sentences, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([SAMPLE_TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False)


def tiny_model_folder(directory: Path, vocab: int = 256):
    """A tiny random Llama (GQA) and the test tokenizer saved as a model folder: (the model, the folder)."""
    model = tiny_model("llama-gqa", vocab=vocab)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return model, directory


def save_tiny_checkpoint(directory: Path, family: str = "llama-gqa", with_heads: bool = True) -> Path:
    """A tiny random model + tokenizer (+ heads in the official layout) saved as a checkpoint directory."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(family, vocab=len(tokenizer))
    if with_heads:
        ts.save_with_model(model, random_heads(model), tokenizer, directory)
    else:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    return directory
