"""The native kernels as one shared library per instruction-set variant: built once per machine from the C files of
this folder, the variant chosen from the CPU's features at run time, each kernel published after its self-check.

Variants (as llama.cpp's CPU backend builds one library per variant and picks one by the CPU's features):
  amx     AVX-512 (F, BW, DQ, VL) and AMX tiles: Sapphire Rapids and later Xeons
  avx512bf16  AVX-512 (F, BW, DQ, VL) and AVX-512 BF16 without AMX (AMD Zen 4 and 5, Cooper Lake): Q4_1 weights
          rebuilt as bfloat16 and widened in registers (panel_q4.c); every other kernel as avx512's. On a 2-vCPU AMD
          EPYC (Zen 4) SmolLM2-135M's one-row step took 14.6 ms against avx512's 23.0, and in generation our AR ran
          19% faster, TokenSwift as fast or faster (docs/performance.md, 2026-12-07, session 38)
  avx512  AVX-512 (F, BW, DQ, VL) without AVX-512 BF16: Skylake-X, Cascade Lake and Ice Lake Xeons
  avx2    AVX2 with FMA: Haswell and later, AMD Zen 1-3
Each library is linked from separate compilation units (one per .c file; panel_amx.c in "amx" only), compiled with
its variant's instruction-set flags, not -march=native: which variant a process runs is decided here from the
features /proc/cpuinfo lists (`cpu_flags`), the best one first, never by whether a compiler hits an #error.
TOKENSWIFT_ISA names one variant instead (an AVX-512 host then runs and tests the AVX2 kernels).

Nothing is required: without a C compiler, on a CPU without AVX2 and FMA, or with TOKENSWIFT_NATIVE=0 no library
loads, `function` returns None and callers keep their PyTorch path; `why_not(name)` says why. Libraries are
cached under $TOKENSWIFT_CACHE/native (default ~/.cache/tokenswift), named by the variant and a hash of the
sources, the flags and the compiler, and written atomically, so that concurrent processes can build the same one.
A variant the compiler refuses (a compiler too old for -mamx-tile, say) is remembered there the same way
(`<variant>-<hash>.failed`), so later processes go straight to the next variant without running the compiler;
a failure that says nothing about the compiler (a timeout, a signal, a full disk, an internal compiler error)
is not remembered. Measured on the 2-vCPU Sapphire Rapids host (all kernels ready: build or load, then every
self-check): a cold first process builds the amx library in 1.2 s (five units compiled side by side, then
linked) and checks its kernels in 0.01-0.03 s, 1.2 s in all where the six single-kernel libraries before took
3.2 s; a warm process 0.04-0.05 s. With a compiler that refuses -mamx-tile, the first process spends 1.7-1.9 s
(the refusal, then the avx512 library) and every later one 0.04-0.05 s, none of it on the amx variant.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import abi, switches
from .switches import ISA_ENV, NATIVE_ENV as DISABLE_ENV

CACHE_ENV = "TOKENSWIFT_CACHE"
# -ffp-contract=off: a product and a sum are rounded where the C says, never fused behind its back, so that every
# variant computes what its intrinsics say and the element-wise functions what PyTorch's do.
COMMON_FLAGS = ("-O3", "-ffp-contract=off", "-fPIC")
UNITS = ("panel_mm.c", "panel_q4.c", "attend_rows.c", "layer_rows.c", "decide_rows.c")
_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512 = _AVX2 + ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl")
BUILD_TIMEOUT_S = 180
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Variant:
    """One library: its compiler flags, the CPU features (as /proc/cpuinfo names them) it needs, its sources."""

    name: str
    flags: tuple[str, ...]
    cpu: frozenset[str]
    sources: tuple[str, ...]


VARIANTS = {v.name: v for v in (  # the best first
    Variant("amx", _AVX512 + ("-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
            frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "amx_tile",
                       "amx_bf16"}),
            UNITS + ("panel_amx.c",)),
    Variant("avx512bf16", _AVX512 + ("-mavx512bf16",),
            frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}), UNITS),
    Variant("avx512", _AVX512, frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"}), UNITS),
    Variant("avx2", _AVX2, frozenset({"avx2", "fma", "f16c"}), UNITS),
)}

_library: dict[str, object] = {}  # "lib": the loaded CDLL or None, "variant": its Variant, "why", "passed over"
_reasons: dict[str, str] = {}  # kernel name -> why `function(name)` returned None
_functions: dict[str, object] = {}


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux), or what the platform says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return "\n".join(lines) or platform.machine()


def cpu_flags() -> set[str]:
    """This CPU's feature flags as Linux lists them ("avx2", "fma", "avx512f", "amx_tile", ...). Where there is no
    /proc/cpuinfo, the flags of the capability PyTorch detected at run time ("AVX512" or "AVX2"), else none."""
    for line in _cpu_identity().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    import torch  # only off Linux: PyTorch probes the CPU at run time with cpuid

    capability = torch.backends.cpu.get_cpu_capability()
    return set(VARIANTS["avx512"].cpu if capability.startswith("AVX512") else
               VARIANTS["avx2"].cpu if capability == "AVX2" else ())


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
    """The variant this process asks for (TOKENSWIFT_ISA): "native" (the best this CPU runs, the default) or a key
    of VARIANTS; an unknown name is an error."""
    name = switches.current().isa
    if name != "native" and name not in VARIANTS:
        raise ValueError(f"{ISA_ENV}={name!r}: expected one of native, {', '.join(VARIANTS)}")
    return name


def loaded_variant() -> Variant | None:
    """The variant whose library this process loaded (None where none did)."""
    library()
    return _library["variant"]


def passed_over() -> list[str]:
    """Why better variants than the loaded one were not used, one line each ("amx: ... could not build ...")."""
    library()
    return list(_library["passed over"])


def library() -> ctypes.CDLL | None:
    """This process's kernel library (built on first use), or None (see `why_not`)."""
    if "lib" not in _library:
        chosen = variant()  # a malformed TOKENSWIFT_ISA is refused on every machine, not only where kernels build
        lib, picked, why, passed = None, None, "", []
        if not switches.current().native:
            why = f"{DISABLE_ENV}=0"
        elif platform.machine().lower() not in ("x86_64", "amd64"):
            why = f"not an x86-64 CPU ({platform.machine()})"
        elif (compiler := _compiler()) is None:
            why = "no C compiler found (CC, cc, gcc or clang)"
        else:
            flags = cpu_flags()
            for candidate in ([VARIANTS[chosen]] if chosen != "native" else VARIANTS.values()):
                missing = sorted(candidate.cpu - flags)
                if missing:
                    passed.append(f"{candidate.name}: this CPU lacks {', '.join(missing)}")
                    continue
                lib, reason = _build_and_load(candidate, compiler)
                if lib is not None:
                    picked = candidate
                    break
                passed.append(f"{candidate.name}: {reason}")
            if lib is None:
                why = "; ".join(passed) or "no variant"
        _library.update(lib=lib, variant=picked, why=why, **{"passed over": passed if lib is not None else []})
    return _library["lib"]


def function(name: str, restype, argtypes: list, self_check: Callable[[Callable], bool], reference: str):
    """The C function `name` of this process's library, typed, once `self_check(fn)` has passed for it; None where
    it is not available or disagrees with `reference` (see `why_not(name)`). Until the check has passed, asking
    for `name` again (from the check itself too) gets None: no caller ever runs an unchecked kernel."""
    if name in _functions:
        return _functions[name]
    _functions[name] = None
    lib = library()
    if lib is None:
        _reasons[name] = _library["why"]
        return None
    try:
        fn = lib[name]  # a fresh function object: its types are this caller's alone
    except AttributeError:
        _reasons[name] = f"not in the {_library['variant'].name} build"
        return None
    fn.restype, fn.argtypes = restype, argtypes
    if not self_check(fn):
        _reasons[name] = f"self-check against {reference} failed"
        return None
    _functions[name] = fn
    return fn


def why_not(name: str) -> str:
    """Why `function(name)` returned None ('' when it did not, or was not asked for yet)."""
    return _reasons.get(name, "")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _compiler_identity(compiler: str) -> str:
    """The compiler's path, size and time stamp: a compiler upgraded in place builds (and fails) anew."""
    try:
        st = os.stat(os.path.realpath(compiler))
        return f"{compiler} {st.st_size} {st.st_mtime_ns}"
    except OSError:
        return compiler


# What a failure that says nothing about the compiler and the variant looks like: it is not remembered.
_TRANSIENT = re.compile(r"No space left|Disk quota|Killed|killed|signal|internal compiler error|Cannot allocate|"
                        r"out of memory|Resource temporarily unavailable|Too many open files|Input/output error|"
                        r"Read-only file system|Permission denied")


def _is_refusal(returncode: int, stderr: str) -> bool:
    """The compiler ran and refused the sources or the flags with a diagnostic (an #error, an unknown -m option):
    the same inputs will fail the same way. Not a signal (returncode < 0), not a system error."""
    return returncode > 0 and re.search(r"\berror\b", stderr) is not None and not _TRANSIENT.search(stderr)


def _build_and_load(v: Variant, compiler: str) -> tuple[ctypes.CDLL | None, str]:
    """The library of variant `v`, built if it is not cached; or None and why."""
    sources = sorted(HERE.glob("*.h")) + [HERE / s for s in v.sources]
    flags = COMMON_FLAGS + v.flags
    key = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources) + " ".join(flags).encode()
                         + _compiler_identity(compiler).encode() + platform.machine().encode()).hexdigest()[:16]
    folder = cache_dir() / "native"
    try:
        folder.mkdir(exist_ok=True)
    except OSError as error:
        return None, f"no cache folder for the kernels: {error}"
    target = folder / f"{v.name}-{key}.so"
    failed = target.with_suffix(".failed")  # the compiler's refusal, kept: the same inputs fail the same way
    if failed.exists():
        return None, failed.read_text().strip() + f" (remembered in {failed}; delete it to retry)"
    if not target.exists():
        refusal, reason = _build(v, compiler, flags, target)
        if reason:
            if refusal:
                try:
                    _write_atomically(failed, reason)
                except OSError:  # an unwritable cache: the next process tries again, no harm done
                    pass
            return None, reason
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as error:
        return None, f"loading {target.name} failed: {error}"
    mismatch = abi.mismatch(lib)
    return (None, f"{target.name}: {mismatch}") if mismatch else (lib, "")


def _build(v: Variant, compiler: str, flags: tuple[str, ...], target: Path) -> tuple[bool, str]:
    """Compile v's units side by side, link them into `target` (atomically). Returns (whether a failure is the
    compiler's refusal, why it failed: '' when it did not)."""
    name = Path(compiler).name
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{v.name}-") as tmp:
            objects = [f"{tmp}/{Path(s).stem}.o" for s in v.sources]
            runs = [subprocess.Popen([compiler, *flags, "-c", str(HERE / s), "-o", o], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True) for s, o in zip(v.sources, objects)]
            link = [compiler, *flags, "-shared", *objects, "-o", f"{tmp}/lib.so", "-lm"]
            for step, run in [(s, r) for s, r in zip(v.sources, runs)] + [("linking", None)]:
                if run is None:
                    run = subprocess.Popen(link, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    runs.append(run)
                try:
                    _, err = run.communicate(timeout=BUILD_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _stop(runs)
                    return False, f"{name} took over {BUILD_TIMEOUT_S} s on {step} for the {v.name} variant"
                if run.returncode != 0:
                    _stop(runs)
                    first = (err.strip().splitlines() or [f"(no message, exit status {run.returncode})"])[0][:300]
                    return _is_refusal(run.returncode, err), f"{name} could not build {step} ({v.name}): {first}"
            os.replace(f"{tmp}/lib.so", target)
    except OSError as error:  # a full disk, a vanished compiler: not remembered
        return False, f"building the {v.name} variant failed: {error}"
    return False, ""


def _stop(runs: list[subprocess.Popen]) -> None:
    """End the compilations still running (another unit failed) and collect every one not yet collected."""
    for run in runs:
        if run.returncode is None:
            run.kill()
            run.communicate()


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
