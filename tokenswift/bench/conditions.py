"""The stated conditions of a `bench speed` run: threads, CPU and its kind, library versions, the model and how our
engine computes it, the prompts and the settings of every row. Written into results.json and printed first."""
from __future__ import annotations

import os
import platform

import torch

from .speed import PAPER_TREE, PENALTY_NOTE, PLD_ARGS, ROWS, hf_kwargs


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def conditions(gen, args_like: dict, prompts: dict[int, dict]) -> dict:
    import transformers

    params = sum(p.numel() for p in gen.model.parameters())
    heads = sum(p.numel() for p in gen.heads.parameters()) if gen.heads is not None else 0
    return {
        "threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "cpu": cpu_model(), "cpus_online": os.cpu_count(), "cpu_kind": gen.adapter.backend.cpu,
        "kernel_variant": gen.adapter.backend.variant, "kernels": gen.adapter.backend.describe(),
        "model_params": params, "head_params": heads, "engine_dtype": str(gen.adapter.dtype).replace("torch.", ""),
        "engine_compute": _engine_compute(gen),
        "datastore_contexts": len(gen.datastore) if gen.datastore is not None else 0,
        "prompts": {str(k): {"tokens": len(v["ids"]), "source": v["source"]} for k, v in prompts.items()},
        "rows": {row: ROWS[row].to_dict() for row in args_like.get("rows", ROWS)},
        "hf_kwargs": {row: hf_kwargs(row) for row in args_like.get("rows", ROWS)},
        "paper_tree": PAPER_TREE, "prompt_lookup": PLD_ARGS, "penalty_note": PENALTY_NOTE,
        "timing": ("ours: tok_s = Result.stats tokens_per_s (engine compute, prefill excluded), wall_tok_s = "
                   "new tokens / wall time of generate (prefill included); HF: wall only"),
        **args_like,
    }


def _engine_compute(gen) -> str:
    lean = gen.adapter.lean
    if lean is None:
        return "through the model's own modules"
    backend = gen.adapter.backend
    kinds = sorted(set(lean.dtypes.values()))
    if lean.native_rows and backend.serves("attention") and backend.serves("decide"):
        native = "native few-row matmul, attention and decision kernels"
    elif lean.native_rows and backend.serves("attention"):
        native = f"native few-row matmul and attention kernels (decisions through PyTorch: {backend.why_not['decide']})"
    elif lean.native_rows:
        native = f"native few-row matmul kernel (attention through PyTorch: {backend.why_not['attention']})"
    else:
        native = f"PyTorch matmuls and attention ({backend.why_not['panels'] or 'native kernels not used'})"
    if lean.native_stack is not None:
        native += ", the decoder stack of up to 16 new tokens in one native call"
    if lean.native_rows and lean.head.panels.kind == 1:
        kinds = [f"{'/'.join(kinds)} arithmetic on bfloat16-exact"]  # AMX tiles over the checkpoint's bfloat16 weights
        native += " (AMX tiles over bfloat16 weights, float32 inputs split into exact bfloat16 parts)"
    elif lean.native_rows and lean.head.panels.kind == 2:
        native += " (bfloat16 weight panels widened to float32 in registers: float32 panels' products)"
    blocks = {m.panels.kind for layer in lean.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
              if m.panels is not None} | ({lean.head.panels.kind} if lean.head.panels is not None else set())
    if blocks & {3, 4, 5}:
        where = "on AMX tiles" if blocks & {4, 5} else "in vector registers"
        head = ", the LM head's Q8_0 too" if 5 in blocks else ""
        native += f"; the GGUF's Q4_1 blocks{head} streamed and rebuilt exactly to the bfloat16 weights {where}"
    return f"with the lean step, {'/'.join(kinds)} weights, float32 logits and KV cache, {native}"


def print_conditions(c: dict) -> None:
    print(f"threads: {c['threads']} torch thread(s) (OMP_NUM_THREADS={c['OMP_NUM_THREADS']}); "
          f"CPU: {c['cpu']} ({c['cpus_online']} online), kind: {c.get('cpu_kind', '?')}; {c.get('kernels', '')}")
    print(f"torch {c['torch']}, transformers {c['transformers']}, python {c['python']}")
    print(f"model: {c['model']}: {c['model_params'] / 1e6:.1f}M params + heads {c['head_params'] / 1e6:.2f}M; "
          f"checkpoint {c['engine_dtype']}, our engine computes {c['engine_compute']}; "
          f"HF copies in {', '.join(c['hf_dtypes']) or 'none'}")
    for k, v in c["prompts"].items():
        print(f"prompt {int(k):,} tokens: {v['source']}")
    print(f"new tokens: {c['new_tokens']}, repeats: {c['repeats']} (method order rotated per repeat, then ours-ar and "
          f"tokenswift-auto paired), seed {c['seed']}")
    paper = PAPER_TREE if c.get("paper_tree", True) else "left out (--no-paper)"
    print(f"tokenswift-auto tree: {c['auto_tree']!r} (datastore of continuations: {c.get('datastore_contexts', 0):,} contexts); "
          f"tokenswift-paper: {paper}")
    print(f"rows: {', '.join(c['rows'])}; note: {PENALTY_NOTE}")
