"""The compute backend: which native kernels serve this process and which PyTorch paths stand in, and why.

Chosen once (`current()`): it reads the switches (tokenswift/native/switches.py), loads the kernel library of
the best variant this CPU runs (each kernel published only after its self-check), and records for every kernel
family whether it serves or why not. The model adapter holds it and hands it to whatever computes: the lean
step's matrices and decoder stack, attention, the KV cache's moves, the heads, the verifier's decision and walk.
A kernel family that serves may still decline one call (a shape it does not cover); the caller then computes
that call with PyTorch, the same numbers by construction (each kernel's self-check holds it to them).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from .native import build, decide, layers, panels, rows_attention, switches
from .native.switches import Switches

# kernel family -> (does it serve, the kernel whose build.why_not says why not); what each computes:
KERNELS = {
    "panels": (panels.available, "panel_mm"),  # few-row float32 matrix products (panel_mm.c)
    "bf16 panels": (panels.bf16_available, "panel_bf16"),  # bfloat16 weights widened in registers (panel_mm.c)
    "amx": (panels.amx_available, "panel_amx"),  # bfloat16 weights on AMX tiles (panel_amx.c)
    "q4 blocks": (panels.q4_available, "panel_q4"),  # weights as the GGUF Q4_1 blocks they came from (panel_q4.c)
    "amx q4 blocks": (panels.q4_amx_available, "panel_q4_amx"),  # GGUF Q4_1 blocks on AMX tiles (panel_amx.c)
    "amx q8 blocks": (panels.q8_amx_available, "panel_q8_amx"),  # GGUF Q8_0 blocks on AMX tiles (panel_amx.c)
    "layers": (layers.available, "layer_rows"),  # norms, SiLU, the decoder stack, the heads, KV moves (layer_rows.c)
    "attention": (rows_attention.available, "attend_rows"),  # few-row attention over the cache (attend_rows.c)
    "decide": (decide.available, "decide_rows"),  # penalty, sampling chain, decision of verified rows (decide_rows.c)
    "walk": (decide.walk_available, "walk_tree"),  # the exact walk over a verified tree (decide_rows.c)
}


@dataclass(frozen=True)
class Backend:
    switches: Switches
    why_not: dict[str, str] = field(default_factory=dict)  # kernel family -> why it does not serve ("" where it does)
    variant: str | None = None  # the kernel library's variant ("amx", "avx512bf16", "avx512", "avx2"), None without one
    cpu: str = ""

    def serves(self, kernel: str) -> bool:
        return not self.why_not[kernel]

    @property
    def lean(self) -> bool:
        """The lean step (fused, pre-transposed weights) where a model is eligible; else the model's modules."""
        return self.switches.lean

    def describe(self) -> str:
        """One line: the CPU kind, the kernel variant and switches, and what does not serve and why."""
        off = self.switches.off()
        head = f"{self.cpu} CPU; " + (panels.describe() if self.variant else f"native kernels: none ({self.why_not['panels']})")
        missing = [f"{k}: {why}" for k, why in self.why_not.items() if why and self.variant]
        return head + ("; off: " + ", ".join(missing) if missing else "") + ("; switches: " + " ".join(off) if off else "")


def choose() -> Backend:
    """Probe every kernel family under this process's switches (the kernels read the same ones: the library is
    loaded once per process). A backend passed to a generator may serve less than this one, never more."""
    chosen = switches.current()
    switched_off = {"amx": None if chosen.amx else f"{switches.AMX_ENV}=0",
                    "bf16 panels": None if chosen.bf16_panels else f"{switches.BF16_ENV}=0",
                    "q4 blocks": None if chosen.blocks else f"{switches.BLOCKS_ENV}=0",
                    "amx q4 blocks": None if chosen.blocks and chosen.amx else
                    f"{switches.BLOCKS_ENV if not chosen.blocks else switches.AMX_ENV}=0"}
    switched_off["amx q8 blocks"] = switched_off["amx q4 blocks"]
    why = {}
    for name, (serves, unit) in KERNELS.items():
        why[name] = "" if serves() else (switched_off.get(name) or build.why_not(unit) or build.why_not("panel_mm")
                                         or "not in this build")
    variant = build.loaded_variant()
    return Backend(chosen, why, variant.name if variant is not None else None, build.cpu_kind())


@functools.lru_cache(maxsize=1)
def current() -> Backend:
    """This process's backend, chosen at the first call."""
    return choose()
