"""Compile a C source of this folder into a shared library once per machine, and load it with ctypes.

No torch headers are involved (a plain C file compiles in well under a second), and nothing is required:
without a C compiler, on a CPU the source does not support, or with TOKENSWIFT_NATIVE=0, `load` returns
None and callers keep their PyTorch path. Libraries are cached under $TOKENSWIFT_CACHE (default
~/.cache/tokenswift), named by a hash of the source, the flags, this machine's CPU and the compiler, and written
atomically so that concurrent processes can build the same one. A source that does not build (one that
`#error`s on this CPU, as panel_amx.c without AMX) is remembered the same way, so later processes do not run
the compiler again for it.

Variants (TOKENSWIFT_ISA): "native" (the default) builds for this CPU (-march=native); "avx2" builds the AVX2 +
FMA kernels without AVX-512 (and so without AMX) on a CPU that has more, so that an AVX-512 host runs and tests
the kernels an AVX2 CPU gets. Each variant has its own cached libraries (`<name>-avx2-<hash>.so`).
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
ISA_ENV = "TOKENSWIFT_ISA"  # a key of VARIANTS: which kernel variant to build (default "native")
# -ffp-contract=off: a product and a sum are rounded where the C says, never fused behind its back, so that a
# kernel compiled into two libraries (layer_rows.c includes panel_mm.c and attend_rows.c) computes the same.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC")
# variant -> flags added to FLAGS. -mno-avx512f turns off every AVX-512 extension; the AMX sources need AVX-512
# and #error without it.
VARIANTS = {"native": (), "avx2": ("-mno-avx512f",)}
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


def cpu_flags() -> set[str]:
    """This CPU's feature flags as Linux lists them ("avx2", "fma", "avx512f", "amx_tile", ...); empty elsewhere."""
    for line in _cpu_identity().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_kind() -> str:
    """The kind of x86 CPU as the speed tables group them: "AMX", "AVX-512 without AMX" (with or without AVX-512
    BF16), "AVX2" or "other"."""
    flags = cpu_flags()
    if {"amx_tile", "amx_bf16"} <= flags:
        return "AMX"
    if "avx512f" in flags:
        return "AVX-512 without AMX" + (" (with AVX-512 BF16)" if "avx512_bf16" in flags else "")
    if {"avx2", "fma"} <= flags:
        return "AVX2"
    return "other"


def cache_dir() -> Path:
    """Where built libraries and fetched models live: $TOKENSWIFT_CACHE or ~/.cache/tokenswift."""
    return _cache_dir()


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


def variant() -> str:
    """The kernel variant this process builds (TOKENSWIFT_ISA, default "native"); an unknown name is an error."""
    name = os.environ.get(ISA_ENV, "") or "native"
    if name not in VARIANTS:
        raise ValueError(f"{ISA_ENV}={name!r}: expected one of {', '.join(VARIANTS)}")
    return name


def flags() -> tuple[str, ...]:
    """The compiler flags of this process's variant."""
    return FLAGS[:2] + VARIANTS[variant()] + FLAGS[2:]


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def load(name: str) -> ctypes.CDLL | None:
    """The library built from `<name>.c` in this folder, or None (see `why_not(name)`)."""
    if name in _loaded:
        return _loaded[name]
    variant()  # a malformed TOKENSWIFT_ISA is refused on every machine, not only where a kernel would build
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


def _compiler_identity(compiler: str) -> str:
    """The compiler's path, size and time stamp: a compiler upgraded in place builds (and fails) anew."""
    try:
        st = os.stat(os.path.realpath(compiler))
        return f"{compiler} {st.st_size} {st.st_mtime_ns}"
    except OSError:
        return compiler


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build_and_load(name: str) -> ctypes.CDLL | None:
    source = HERE / f"{name}.c"
    compiler = _compiler()
    if compiler is None:
        _reasons[name] = "no C compiler found (CC, cc, gcc or clang)"
        return None
    chosen, build_flags = variant(), flags()
    headers = b"".join(h.read_bytes() for h in sorted(HERE.glob("*.h")))  # shared by the sources
    headers += b"".join((HERE / inc).read_bytes() for inc in _included_sources(source))
    key = hashlib.sha256(source.read_bytes() + headers + " ".join(build_flags).encode() + _cpu_identity().encode()
                         + _compiler_identity(compiler).encode()).hexdigest()[:16]
    stem = name if chosen == "native" else f"{name}-{chosen}"
    target = _cache_dir() / f"{stem}-{key}.so"
    failed = target.with_suffix(".failed")  # the compiler's refusal, kept: the same inputs fail the same way
    if failed.exists():
        _reasons[name] = failed.read_text().strip() + f" (remembered in {failed}; delete it to retry)"
        return None
    if not target.exists():
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            done = subprocess.run([compiler, *build_flags, str(source), "-o", tmp], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                _reasons[name] = f"{Path(compiler).name} could not build {source.name}: " + (
                    done.stderr.strip().splitlines() or ["(no message)"])[0][:300]
                try:
                    _write_atomically(failed, _reasons[name])
                except OSError:  # an unwritable cache: the next process tries again, no harm done
                    pass
                return None
            os.replace(tmp, target)
        except (OSError, subprocess.SubprocessError) as error:  # a timeout or a full disk: not remembered
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
