"""A model's weights as the GGUF blocks they were converted from, kept beside its Hugging Face folder, so that the
native panel kernels can stream the blocks instead of the bfloat16 weights (`tokenswift/native/q4_blocks.h`,
`panel_amx.c`).

Why: the built-in SmolLM2-135M comes from a GGUF file (Q4_1 decoder layers, a Q8_0 embedding that is also its LM
head) and its converted bfloat16 weights are, bit for bit, roundings of those blocks: bf16(d * q + m) and
bf16(d * q). A decode step on a CPU is bound by the bytes it streams: 66 + 30 MB of blocks against 212 + 57 MB of
bfloat16 per token.

Nothing here changes what a model computes: `Blocks.matches(weight)` rebuilds the values and compares them with
the weight bit for bit, and a kernel is only given blocks that match (`tokenswift.lean`). The file is
`quantized.safetensors`: one uint8 tensor of raw GGUF blocks per weight, (rows, k / 32, block bytes), named as the
model names the weight, the formats in its metadata; `python -m tokenswift fetch` writes it.
"""
from __future__ import annotations

import json
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

FILE_NAME = "quantized.safetensors"
BLOCK = 32  # weights per block (one row's 32 consecutive inputs)
# Q4_1: float16 d, float16 m, 16 bytes of 4-bit codes (input j in byte j's low bits, j + 16 in its high);
# Q8_0: float16 d, 32 int8
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}
GROUP_ROWS = 16  # rows of a kernel group (q4_blocks.h)

# GGUF (llama.cpp) tensor names -> the Hugging Face Llama names they hold
_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head"}


@dataclass(frozen=True)
class Blocks:
    """One weight (rows, k) as raw GGUF blocks: `raw` (rows, k / 32, BLOCK_BYTES[format]) uint8."""

    raw: torch.Tensor
    format: str = "q4_1"  # or "q8_0"

    @property
    def shape(self) -> tuple[int, int]:
        return self.raw.shape[0], self.raw.shape[1] * BLOCK

    def values(self) -> torch.Tensor:
        """The bfloat16 weights the blocks encode (rows, k): gguf's dequantization (float32 d * q, then + m), rounded
        to bfloat16 as a conversion to bfloat16 rounds."""
        rows, blocks, _ = self.raw.shape
        d = self.raw[..., :2].contiguous().view(torch.float16).float()  # (rows, blocks, 1)
        if self.format == "q8_0":
            values = self.raw[..., 2:].contiguous().view(torch.int8).float() * d
        else:
            m = self.raw[..., 2:4].contiguous().view(torch.float16).float()
            values = d * self.codes().float() + m
        return values.reshape(rows, blocks * BLOCK).to(torch.bfloat16)

    def codes(self) -> torch.Tensor:
        """Q4_1: (rows, k / 32, 32) uint8, input i's 4-bit code (byte i % 16, low bits for i < 16, high bits after)."""
        codes = self.raw[..., 4:]
        return torch.cat([codes & 15, codes >> 4], dim=-1)

    def matches(self, weight: torch.Tensor) -> bool:
        """Whether the blocks encode exactly `weight` (rows, k), every bit."""
        if tuple(weight.shape) != self.shape:
            return False
        w = weight.detach().cpu()
        if w.dtype != torch.bfloat16:
            wf = w.float()
            if not torch.equal(wf.to(torch.bfloat16).float(), wf):
                return False
            w = wf.to(torch.bfloat16)
        return torch.equal(self.values().view(torch.int16), w.view(torch.int16))

    def groups(self) -> torch.Tensor | None:
        """The kernels' layout (q4_blocks.h, panel_amx.c): groups of 16 rows x 32 inputs in the order
        [rows / 16][k / 32], each the 16 rows' d (then m), then their codes (Q4_1 codes reordered as q4_blocks.h
        says); flat uint8. None where the rows are not a multiple of 16 (no kernel takes them)."""
        rows, blocks, _ = self.raw.shape
        if rows % GROUP_ROWS:
            return None

        def grouped(t: torch.Tensor) -> torch.Tensor:  # (rows, k/32, b) -> (n/16, k/32, 16 * b): a group's 16 rows
            per_group = t.reshape(rows // GROUP_ROWS, GROUP_ROWS, blocks, -1).transpose(1, 2)
            return per_group.reshape(rows // GROUP_ROWS, blocks, -1)
        if self.format == "q8_0":
            return torch.cat([grouped(self.raw[..., :2]), grouped(self.raw[..., 2:])], dim=-1).contiguous().reshape(-1)
        quarter = self.codes().reshape(rows, blocks, 4, 8)  # [input // 8][input % 8]
        low, high = quarter[..., 0::2, :], quarter[..., 1::2, :]  # inputs j, j + 16 / j + 8, j + 24
        words = (low | (high << 4)).transpose(-1, -2).reshape(rows, blocks, 16)  # word j: bytes 2j, 2j + 1
        parts = [grouped(self.raw[..., :2]), grouped(self.raw[..., 2:4]), grouped(words)]
        return torch.cat(parts, dim=-1).contiguous().reshape(-1)

    @staticmethod
    def stack(parts: "list[Blocks]") -> "Blocks | None":
        """Blocks of the weights one above the other (q, k and v as one matrix), or None where one has none or
        their formats differ."""
        if not parts or any(p is None or p.format != parts[0].format or p.raw.shape[1:] != parts[0].raw.shape[1:]
                            for p in parts):
            return None
        return Blocks(torch.cat([p.raw for p in parts]), parts[0].format)


# ---- attached to a loaded model ------------------------------------------------------------------------------------
_attached: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Blocks]]" = weakref.WeakKeyDictionary()


def attach(model: torch.nn.Module, blocks: dict[str, Blocks]) -> None:
    _attached[model] = blocks


def attached(model: torch.nn.Module) -> dict[str, Blocks]:
    """The blocks attached to `model` (by `load_for`), by weight name; {} where none."""
    return _attached.get(model, {})


def load_for(model: torch.nn.Module, folder: Path) -> int:
    """Attach the folder's blocks (if it has a quantized.safetensors) to `model`; returns how many weights."""
    path = Path(folder) / FILE_NAME
    if not path.is_file():
        return 0
    try:
        blocks = load(path)
    except Exception as e:  # noqa: BLE001 - an unreadable file: the bfloat16 weights serve, as without one
        warnings.warn(f"{path}: not read ({e}); the model's own weights serve", stacklevel=2)
        return 0
    attach(model, blocks)
    return len(blocks)


# ---- the file ------------------------------------------------------------------------------------------------------
def save(blocks: dict[str, Blocks], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({name: b.raw.contiguous() for name, b in blocks.items()}, str(path),
              metadata={"formats": json.dumps({name: b.format for name, b in blocks.items()})})


def load(path: Path) -> dict[str, Blocks]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        formats = json.loads((f.metadata() or {}).get("formats", "{}"))
        return {name: Blocks(f.get_tensor(name), formats[name])
                for name in f.keys() if formats.get(name) in BLOCK_BYTES}


# ---- from a GGUF file ----------------------------------------------------------------------------------------------
def read_gguf(path: Path, num_heads: int, num_kv_heads: int) -> dict[str, Blocks]:
    """The Q4_1 and Q8_0 weights of a Llama-family GGUF file, by their Hugging Face names, q_proj and k_proj rows put
    back in the order Hugging Face uses (llama.cpp's converter interleaves each head's rotary halves)."""
    from gguf import GGUFReader

    out: dict[str, Blocks] = {}
    for tensor in GGUFReader(str(path)).tensors:
        name, fmt = _hf_name(tensor.name), tensor.tensor_type.name.lower()
        if fmt not in BLOCK_BYTES or name is None:
            continue
        data = torch.from_numpy(tensor.data.copy())  # (rows, k / 32 * block bytes) uint8
        raw = data.reshape(data.shape[0], -1, BLOCK_BYTES[fmt])
        if name.endswith("q_proj.weight"):
            raw = _unpermute_rows(raw, num_heads)
        elif name.endswith("k_proj.weight"):
            raw = _unpermute_rows(raw, num_kv_heads)
        out[name] = Blocks(raw.contiguous(), fmt)
    return out


def matching(blocks: dict[str, Blocks], model: torch.nn.Module) -> dict[str, Blocks]:
    """The blocks that encode the model's weight of the same name exactly (the others are dropped)."""
    params = dict(model.named_parameters())
    return {name: b for name, b in blocks.items() if name in params and b.matches(params[name])}


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in _TOP_NAMES and parts[1] == "weight":
        return f"{_TOP_NAMES[parts[0]]}.weight"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    return None


def _unpermute_rows(raw: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order for q / k: within each head, rows (pairs, halves) -> (halves, pairs)."""
    rows = raw.shape[0]
    rest = raw.shape[1:]
    return raw.reshape(heads, rows // heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)
