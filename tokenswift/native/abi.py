"""The C structs of kernels.h as ctypes sees them, and the check that the two agree.

ctypes cannot read a C header: these are copies, and a copy that drifts (a field added on one side) would pass
pointers at the wrong offsets. So every library exports `sizeof_<struct>()`, and `build` refuses a library where
a size differs from the copy's here, with the reason.
"""
from __future__ import annotations

import ctypes

_P, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class LayerWeights(ctypes.Structure):
    """layer_weights: one decoder layer's weights (see kernels.h)."""

    _fields_ = [("in_norm", _P), ("post_norm", _P), ("qkv", _P), ("o", _P), ("gate_up", _P), ("down", _P),
                ("qkv_bias", _P), ("kinds", _INT * 4)]


class HeadWeights(ctypes.Structure):
    """head_weights: one multi-token head's weights (see kernels.h)."""

    _fields_ = [("in_norm", _P), ("post_norm", _P), ("linear", _P), ("kind", _INT), ("eps", _FLOAT)]


STRUCTS = {"layer_weights": LayerWeights, "head_weights": HeadWeights}


def mismatch(lib: ctypes.CDLL) -> str:
    """'' where every struct of kernels.h has the size of its copy here; else what differs."""
    problems = []
    for name, struct in STRUCTS.items():
        size_of = lib[f"sizeof_{name}"]
        size_of.restype, size_of.argtypes = ctypes.c_size_t, []
        c_size = size_of()
        if c_size != ctypes.sizeof(struct):
            problems.append(f"struct {name} is {c_size} bytes in C but {ctypes.sizeof(struct)} in abi.py")
    return "; ".join(problems)
