"""Every switch of the compute path, read from the environment once per process (`current()`).

They exist for comparisons and for machines where a path misbehaves; the defaults are the fast path. The compute
backend (tokenswift/backend.py) reads them here and says what they turned off; nothing else reads the environment
for them.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Mapping

NATIVE_ENV = "TOKENSWIFT_NATIVE"  # "0": never build or load native kernels
ISA_ENV = "TOKENSWIFT_ISA"  # "native" (default: the best variant this CPU runs) or a variant's name (amx,
#                             avx512bf16, avx512, avx2)
AMX_ENV = "TOKENSWIFT_AMX"  # "0": float32 panels even where AMX could serve
BF16_ENV = "TOKENSWIFT_BF16_PANELS"  # "0": float32 panels even where bfloat16 panels could serve
BLOCKS_ENV = "TOKENSWIFT_BLOCKS"  # "0": bfloat16 weights even where the model's GGUF blocks could serve
LEAN_ENV = "TOKENSWIFT_LEAN"  # "0": every forward through the model's own modules
MATMUL_ENV = "TOKENSWIFT_LEAN_MATMUL"  # "auto" (native panels, mm or oneDNN by rows) or "mm" (always torch.mm)
DTYPE_ENV = "TOKENSWIFT_LEAN_DTYPE"  # unset: float32 on CPU; "model": the checkpoint's dtype (experiments)


@dataclass(frozen=True)
class Switches:
    native: bool = True
    isa: str = "native"
    amx: bool = True
    bf16_panels: bool = True
    blocks: bool = True
    lean: bool = True
    lean_matmul: str = "auto"
    lean_dtype: str = ""

    def off(self) -> list[str]:
        """The switches set away from their defaults, as VARIABLE=value."""
        default = Switches()
        names = {"native": NATIVE_ENV, "isa": ISA_ENV, "amx": AMX_ENV, "bf16_panels": BF16_ENV, "blocks": BLOCKS_ENV,
                 "lean": LEAN_ENV,
                 "lean_matmul": MATMUL_ENV, "lean_dtype": DTYPE_ENV}
        out = []
        for field, variable in names.items():
            value = getattr(self, field)
            if value != getattr(default, field):
                out.append(f"{variable}={int(value) if isinstance(value, bool) else value}")
        return out


def read(env: Mapping[str, str]) -> Switches:
    return Switches(native=env.get(NATIVE_ENV, "1") != "0", isa=env.get(ISA_ENV, "") or "native",
                    amx=env.get(AMX_ENV, "1") != "0", bf16_panels=env.get(BF16_ENV, "1") != "0",
                    blocks=env.get(BLOCKS_ENV, "1") != "0",
                    lean=env.get(LEAN_ENV, "1") != "0", lean_matmul=env.get(MATMUL_ENV, "auto"),
                    lean_dtype=env.get(DTYPE_ENV, ""))


@functools.lru_cache(maxsize=1)
def current() -> Switches:
    """This process's switches (the environment at the first call)."""
    return read(os.environ)
