"""The compute backend (tokenswift/backend.py): the switches read in one place, every kernel family's state known
and described, and the backend handed to whatever computes decides what runs."""
import ast
import dataclasses
import json
import os
import subprocess
import sys

import torch

import tokenswift as ts
from tokenswift import backend
from tokenswift.native import rows_attention, switches

from conftest import NATIVE_FAMILY, ROOT, native_stack_or_skip, random_heads, tiny_model

SWITCH_NAMES = (switches.NATIVE_ENV, switches.ISA_ENV, switches.AMX_ENV, switches.BF16_ENV, switches.LEAN_ENV,
                switches.MATMUL_ENV, switches.DTYPE_ENV)


def test_no_module_but_the_switches_reads_a_compute_switch():
    readers = []
    for path in sorted((ROOT / "tokenswift").rglob("*.py")):
        if path.name == "switches.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in SWITCH_NAMES:
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not readers, "compute switches named outside tokenswift/native/switches.py:\n" + "\n".join(readers)


def test_the_backend_is_chosen_once_and_held_by_every_generator():
    chosen = backend.current()
    assert backend.current() is chosen
    model = tiny_model("llama-gqa")
    assert ts.Generator(model).adapter.backend is chosen and ts.Generator(model).adapter.lean.backend is chosen
    assert set(chosen.why_not) == set(backend.KERNELS)
    line = chosen.describe()
    assert line.startswith(f"{chosen.cpu} CPU; native kernels: ")
    if chosen.variant is not None:
        assert f"{chosen.variant} build" in line


def test_a_kernel_the_backend_does_not_serve_is_never_called_and_the_output_is_the_same(monkeypatch):
    model = tiny_model(NATIVE_FAMILY, seed=4)
    heads = random_heads(model)
    default = ts.Generator(model, heads=heads)
    native_stack_or_skip(default)
    prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(2)).tolist() * 3
    settings = ts.Settings(tree="1x3x3x3", draft="paper")  # the draft forward over the partial cache: no stack
    want = default.generate(prompt, settings, 60).token_ids
    calls = []
    real = rows_attention.attend_rows
    monkeypatch.setattr(rows_attention, "attend_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert default.generate(prompt, settings, 20).token_ids == want[:20] and calls  # the kernel serves by default
    calls.clear()
    chosen = backend.current()
    off = dict.fromkeys(("attention", "layers", "amx", "bf16 panels"), "turned off by the test")
    without = dataclasses.replace(chosen, why_not={**chosen.why_not, **off})
    gen = ts.Generator(model, heads=heads, backend=without)
    lean = gen.adapter.lean
    assert lean.native_stack is None
    kinds = {m.panels.kind for layer in lean.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
             if m.panels is not None}
    assert kinds <= {0}  # float32 panels only: no AMX tiles (1) and no bfloat16 panels (2)
    assert gen.generate(prompt, settings, 60).token_ids == want and not calls
    assert "attention: turned off by the test" in without.describe()


def test_switched_off_kernels_say_so_in_a_fresh_process():
    code = ("import json; from tokenswift import backend; b = backend.current(); "
            "print(json.dumps({'why': b.why_not, 'line': b.describe(), 'lean': b.lean}))")
    env = {**os.environ, switches.NATIVE_ENV: "0", switches.LEAN_ENV: "0"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out["why"].values()) == {"TOKENSWIFT_NATIVE=0"} and not out["lean"]
    assert out["line"].endswith("switches: TOKENSWIFT_NATIVE=0 TOKENSWIFT_LEAN=0")


def test_a_stack_is_built_only_where_the_pytorch_path_attends_the_same_way():
    """The native stack attends with the native kernel: a backend whose attention kernel does not serve must not
    build it (the PyTorch path would then attend differently, in the last bits)."""
    model = tiny_model(NATIVE_FAMILY, seed=4)
    native_stack_or_skip(ts.Generator(model))
    chosen = backend.current()
    no_attention = dataclasses.replace(chosen, why_not={**chosen.why_not, "attention": "turned off by the test"})
    assert ts.Generator(model, backend=no_attention).adapter.lean.native_stack is None


def test_ar_iterations_spend_no_drafting_time():
    gen = ts.Generator(tiny_model("llama-gqa"))
    steps = list(gen.stream(list(range(20)), ts.Settings(), 8, method="ar"))
    assert all(step.timings.draft_s == 0.0 for step in steps) and all(step.timings.verify_s > 0 for step in steps)


def test_a_malformed_isa_stops_the_app_at_start_with_one_line():
    env = {**os.environ, switches.ISA_ENV: "avx9", "GRADIO_SERVER_PORT": "1"}
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "error: TOKENSWIFT_ISA='avx9': expected one of native, amx, avx512bf16, avx512, avx2"
