"""Compile a C source of this folder into a shared library once per machine, and load it with ctypes.

No torch headers are involved (a plain C file compiles in well under a second), and nothing is required:
without a C compiler, on a CPU the source does not support, or with TOKENSWIFT_NATIVE=0, `load` returns
None and callers keep their PyTorch path. Libraries are cached under $TOKENSWIFT_CACHE (default
~/.cache/tokenswift), named by a hash of the source, the flags and this machine's CPU, and written
atomically so that concurrent processes can build the same one.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

DISABLE_ENV = "TOKENSWIFT_NATIVE"  # "0": never build or load native kernels
CACHE_ENV = "TOKENSWIFT_CACHE"
# -ffp-contract=off: a product and a sum are rounded where the C says, never fused behind its back, so that a
# kernel compiled into two libraries (layer_rows.c includes panel_mm.c and attend_rows.c) computes the same.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC")
HERE = Path(__file__).resolve().parent

_loaded: dict[str, ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}
_functions: dict[str, object] = {}


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU model and its flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return "\n".join(lines) or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tokenswift")
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, delete=True)
        probe.close()
        return path
    except OSError:
        fallback = Path(tempfile.gettempdir()) / f"tokenswift-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def load(name: str) -> ctypes.CDLL | None:
    """The library built from `<name>.c` in this folder, or None (see `why_not(name)`)."""
    if name in _loaded:
        return _loaded[name]
    lib = None
    if os.environ.get(DISABLE_ENV, "1") == "0":
        _reasons[name] = f"{DISABLE_ENV}=0"
    elif platform.machine().lower() not in ("x86_64", "amd64"):
        _reasons[name] = f"not an x86-64 CPU ({platform.machine()})"
    else:
        lib = _build_and_load(name)
    _loaded[name] = lib
    return lib


def function(name: str, restype, argtypes: list, self_check: Callable[[], bool], reference: str):
    """The C function `name` of the library built from `<name>.c`, typed, once it has passed `self_check()`
    (which may call this function again: it then gets the function under test); None where it is not
    available or disagrees with `reference` (see `why_not(name)`)."""
    if name in _functions:
        return _functions[name]
    lib = load(name)
    if lib is None:
        _functions[name] = None
        return None
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, argtypes
    _functions[name] = fn
    if not self_check():
        _reasons[name] = f"self-check against {reference} failed"
        _functions[name] = None
    return _functions[name]


def why_not(name: str) -> str:
    """Why `load(name)` returned None ('' when it did not)."""
    return _reasons.get(name, "")


def _included_sources(source: Path) -> list[str]:
    """The C files of this folder that `source` includes (`#include "x.c"`): part of its library's identity."""
    found = re.findall(r'^#include "([\w.]+\.c)"', source.read_text(), flags=re.MULTILINE)
    return sorted(set(found))


def _build_and_load(name: str) -> ctypes.CDLL | None:
    source = HERE / f"{name}.c"
    compiler = _compiler()
    if compiler is None:
        _reasons[name] = "no C compiler found (CC, cc, gcc or clang)"
        return None
    headers = b"".join(h.read_bytes() for h in sorted(HERE.glob("*.h")))  # shared by the sources
    headers += b"".join((HERE / inc).read_bytes() for inc in _included_sources(source))
    key = hashlib.sha256(source.read_bytes() + headers + " ".join(FLAGS).encode() + _cpu_identity().encode()
                         + compiler.encode()).hexdigest()[:16]
    target = _cache_dir() / f"{name}-{key}.so"
    if not target.exists():
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            done = subprocess.run([compiler, *FLAGS, str(source), "-o", tmp], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                _reasons[name] = f"{Path(compiler).name} could not build {source.name}: " + (
                    done.stderr.strip().splitlines() or ["(no message)"])[0][:300]
                return None
            os.replace(tmp, target)
        except (OSError, subprocess.SubprocessError) as error:
            _reasons[name] = f"building {source.name} failed: {error}"
            return None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        return ctypes.CDLL(str(target))
    except OSError as error:
        _reasons[name] = f"loading {target.name} failed: {error}"
        return None
