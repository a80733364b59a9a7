"""Train the project's byte-level BPE tokenizer and save it as a Hugging Face fast tokenizer.

The tokenizer is trained on the train split only (see :mod:`tokenswift.train.corpus`): vocabulary
8192, one special token ``<|endoftext|>`` (used as BOS, EOS and padding), no normalizer, a ByteLevel
pre-tokenizer without a prefix space and a ByteLevel decoder, so ``decode(encode(text)) == text``
for any text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .corpus import SourceSplit

#: The only special token: document separator, BOS, EOS and padding.
ENDOFTEXT: str = "<|endoftext|>"
DEFAULT_VOCAB_SIZE: int = 8192
#: Lines handed to the trainer per batch.
_LINES_PER_BATCH: int = 1000


def _line_batches(texts: list[str]) -> Iterator[list[str]]:
    """Yield the texts in batches of lines (terminators kept) for ``train_from_iterator``."""
    for text in texts:
        lines = text.split("\n")
        for start in range(0, len(lines), _LINES_PER_BATCH):
            chunk = lines[start : start + _LINES_PER_BATCH]
            yield [line + "\n" for line in chunk]


def build_bpe(texts: list[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on ``texts``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_line_batches(texts), trainer=trainer)
    return tok


def wrap_fast(tok: Tokenizer, model_max_length: int = 32768) -> PreTrainedTokenizerFast:
    """Wrap a raw tokenizer as a ``PreTrainedTokenizerFast`` with the project's special tokens."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a saved tokenizer directory with ``AutoTokenizer`` (offline)."""
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Encode ``text`` without special tokens."""
    return tokenizer.encode(text, add_special_tokens=False)


def check_round_trip(tokenizer: PreTrainedTokenizerBase, texts: dict[str, str]) -> dict[str, int]:
    """Assert ``decode(encode(t)) == t`` for each text, both plain and with explicit flags.

    Returns the number of tokens per text. Raises ``AssertionError`` naming the first failing text.
    """
    counts: dict[str, int] = {}
    for name, text in texts.items():
        ids = encode(tokenizer, text)
        explicit = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        plain = tokenizer.decode(ids)
        assert explicit == text, f"round trip failed (explicit flags) for {name}"
        assert plain == text, f"round trip failed (plain decode) for {name}"
        counts[name] = len(ids)
    return counts


def train_and_save(
    splits: dict[str, SourceSplit], out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> dict[str, int]:
    """Train on the train split of every source, save to ``out_dir``, reload and verify round trips.

    Returns the token count of each full corpus file under the saved tokenizer.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = build_bpe([s.train for s in splits.values()], vocab_size=vocab_size)
    wrap_fast(raw).save_pretrained(str(out))
    reloaded = load_tokenizer(out)
    assert len(reloaded) == vocab_size, f"vocab size {len(reloaded)} != {vocab_size}"
    assert reloaded.eos_token == ENDOFTEXT and reloaded.bos_token == ENDOFTEXT
    assert not reloaded.clean_up_tokenization_spaces
    return check_round_trip(reloaded, {name: s.text for name, s in splits.items()})
