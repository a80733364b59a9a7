"""Text <-> token ids, the one rule used by the engine (`Generator.encode/decode`) and by a server that
holds only a tokenizer (`tokenswift.serve.models.Codec`)."""
from __future__ import annotations


def encode_text(tokenizer, text: str) -> list[int]:
    """The prompt's ids with the tokenizer's special tokens; an empty text starts from BOS (or EOS)."""
    ids = list(tokenizer.encode(text, add_special_tokens=True))
    if not ids:
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start is None:
            raise ValueError("the prompt is empty: type some text to start from")
        ids = [start]
    return ids


def decode_ids(tokenizer, ids: list[int]) -> str:
    """Exactly the text of `ids` (special tokens kept, no clean-up of spaces)."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
