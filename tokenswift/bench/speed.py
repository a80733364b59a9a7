"""Speed benchmark: our AR, TokenSwift (auto tree and the paper's tree) and HF `generate` side by side.

    python -m tokenswift.bench speed [--model assets/default-model] [--contexts 1024 16000] [--tokens 1000]
        [--repeats 3] [--threads 1] [--auto-tree auto] [--rows greedy greedy+penalty paper]
        [--out-dir runs/bench-speed]

Rows are (context length x sampling setting); columns are methods, run alternately in one process with the
order rotated every repeat:

  ours-ar            gen.generate(ids, s, N, method="ar")
  tokenswift-auto    method="tokenswift", s.with_changes(tree=--auto-tree)
  tokenswift-paper   method="tokenswift", the paper's tree (1x3x3x3, ngram_topk=20, draft="paper")
  hf-bf16, hf-fp32   HF `model.generate` on the same ids, the model loaded in bf16 and in fp32;
                     the faster of the two (median wall tok/s) is "hf-peer"
  hf-prompt-lookup   HF `generate(prompt_lookup_num_tokens=10, max_matching_ngram_size=3)`, greedy rows
                     only, in the dtype of the faster HF run

Our methods are timed twice: over the engine's own compute (Result.stats["tokens_per_s"], prefill
excluded) and by wall clock around `generate` (prefill included). HF can only be timed by wall clock, so
every ratio against HF uses wall time for both sides; ratios among our methods use compute time.

Every repeat also runs ours-ar and tokenswift-auto *paired*: both streams advanced in turn in one process
(auto one iteration, then AR until it has as many tokens), each timed by its own engine timings, so that the
host's drift (whole runs here moved by 10-30% within minutes) hits both alike; `auto / ar (paired)` is the
median of the per-repeat ratios.

Greedy rows also check losslessness: TokenSwift's token ids against AR's, and at the first differing
position the top-2 logit gap (after the penalty) from one extra HF forward ("near-tie" below 0.05).
The command (tokenswift/bench/cli.py) writes results.json, table.md and speed.png (tokenswift/bench/report.py: plotly,
screenshotted by Playwright in a Chromium found on PATH or given by --browser); the conditions line comes from
tokenswift/bench/conditions.py and the prompts from tokenswift/bench/prompts.py.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

from ..kinds import Method
from ..settings import PAPER_SAMPLING, Settings
from ..tree import AUTO

ROWS: dict[str, Settings] = {
    "greedy": Settings(temperature=0.0, penalty=1.0),
    "greedy+penalty": Settings(penalty=1.2, penalty_window=1024),
    "paper": Settings(**PAPER_SAMPLING),
}
PAPER_TREE = dict(tree="1x3x3x3", ngram_topk=20, draft="paper")
OURS = ("ours-ar", "tokenswift-auto", "tokenswift-paper")
HF_RUNS = {"hf-bf16": "bfloat16", "hf-fp32": "float32"}
PLD = "hf-prompt-lookup"
PAIRED = "paired"  # run records of ours-ar and tokenswift-auto advanced in turn (see the module docstring)
METHODS = OURS + tuple(HF_RUNS) + (PLD,)
HF_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PLD_ARGS = dict(prompt_lookup_num_tokens=10, max_matching_ngram_size=3)
NEAR_TIE = 0.05
PENALTY_NOTE = ("HF's repetition_penalty covers the whole context (prompt + output); ours (CTRL penalty) covers "
                "the last penalty_window=1024 tokens")
PLD_SKIP = "skipped: sampled row (prompt lookup is compared on greedy rows only)"
COLUMN_LABELS = {"ours-ar": "ours-ar", "tokenswift-auto": "tokenswift-auto", "tokenswift-paper": "tokenswift-paper",
                 "hf-bf16": "hf-bf16", "hf-fp32": "hf-fp32", PLD: "hf-prompt-lookup"}
RATIO_KEYS = ("ours-ar/hf-peer (wall)", "tokenswift-auto/ours-ar", "tokenswift-auto/ours-ar (paired)",
              "tokenswift-paper/ours-ar", "tokenswift-auto/hf-prompt-lookup (wall)", "tokenswift-auto/ours-ar (wall)",
              "tokenswift-paper/ours-ar (wall)")


# ---- settings per cell ----------------------------------------------------------------------------------
def method_settings(row: str, method: str, auto_tree: str) -> Settings:
    """The Settings our engine runs for one (sampling row, method)."""
    s = ROWS[row]
    if method == "tokenswift-auto":
        return s.with_changes(tree=auto_tree)
    if method == "tokenswift-paper":
        return s.with_changes(**PAPER_TREE)
    return s


def hf_kwargs(row: str) -> dict:
    """HF `generate` arguments matching a sampling row (our top_k=0/top_p=1 spelled out: HF's default top_k
    is 50)."""
    if row == "greedy":
        return dict(do_sample=False)
    if row == "greedy+penalty":
        return dict(do_sample=False, repetition_penalty=ROWS[row].penalty)
    s = ROWS[row]
    return dict(do_sample=True, temperature=s.temperature, min_p=s.min_p, top_k=0, top_p=1.0,
                repetition_penalty=s.penalty)


def methods_for(row: str, have_hf: set[str], paper: bool = True) -> list[str]:
    out = [m for m in OURS if paper or m != "tokenswift-paper"]
    out += [m for m in HF_RUNS if HF_RUNS[m] in have_hf]
    if have_hf and ROWS[row].greedy:
        out.append(PLD)
    return out


# ---- one run ----------------------------------------------------------------------------------------------
def prepare_hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """No end-of-sequence token: HF then neither stops nor suppresses EOS (min_new_tokens), like our engine
    with stop_at_eos=False, so exactly max_new_tokens come out."""
    cfg = model.generation_config
    cfg.eos_token_id = cfg.pad_token_id = cfg.bos_token_id = None
    return model.eval()


def load_hf_models(path: str, dtypes: tuple[str, ...] = ("bfloat16", "float32")) -> dict[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "unexpected keys" for the medusa heads, generation flag notices
    hf_logging.disable_progress_bar()  # "Loading weights" bars
    models = {}
    for name in dtypes:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=HF_DTYPES[name], trust_remote_code=False)
        models[name] = prepare_hf_model(model)
    return models


def hf_generate(model: torch.nn.Module, ids: list[int], row: str, n: int, seed: int,
                prompt_lookup: bool = False) -> tuple[list[int], float]:
    """HF generate of exactly n new tokens; returns (new ids, wall seconds including prefill)."""
    kwargs = hf_kwargs(row)
    if prompt_lookup:
        kwargs.update(PLD_ARGS)
    torch.manual_seed(seed)
    t = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                             eos_token_id=None, pad_token_id=None, **kwargs)
    wall = time.perf_counter() - t
    new = out[0, len(ids):].tolist()
    if len(new) != n:
        raise RuntimeError(f"HF generate returned {len(new)} new tokens, not {n} (an EOS token is still set?)")
    return new, wall


def ours_generate(gen, ids: list[int], settings: Settings, n: int, method: str, seed: int) -> tuple[list[int], dict]:
    t = time.perf_counter()
    result = gen.generate(ids, settings, n, method=method, seed=seed)
    wall = time.perf_counter() - t
    st = result.stats
    rec = {"tok_s": st["tokens_per_s"], "wall_s": wall, "wall_tok_s": len(result.token_ids) / wall,
           "time_s": st["time_s"], "prefill_s": st["prefill_s"], "iterations": st["iterations"],
           "mean_accepted": st["mean_accepted"], "mean_draft_nodes": st["mean_draft_nodes"],
           "draft_s": st["draft_s"], "verify_s": st["verify_s"], "bookkeeping_s": st["bookkeeping_s"],
           "accepted_by_source": st.get("accepted_by_source", {}),
           "tree": settings.tree if method == "tokenswift" else None}
    return result.token_ids, rec


# ---- losslessness -----------------------------------------------------------------------------------------
def paired_generate(gen, ids: list[int], row: str, auto_tree: str, n: int, seed: int) -> dict:
    """ours-ar and tokenswift-auto advanced in turn as the app advances them (`serve.runner.interleave`: auto one
    iteration, then AR until it has produced as many tokens). Returns each one's compute-only tok/s (its own step
    timings, prefill excluded), auto / AR, and whether their tokens are identical."""
    import threading

    from ..serve.runner import RunRequest, interleave

    settings = method_settings(row, "tokenswift-auto", auto_tree)  # AR reads the same sampling and ignores the tree
    request = RunRequest(ids, settings, n, seed, methods=(Method.TOKENSWIFT, Method.AR))
    tokens: dict[str, list[int]] = {Method.TOKENSWIFT: [], Method.AR: []}
    last: dict[str, object] = {}
    for step in interleave(gen, request, threading.Event(), detail=False):
        tokens[step.method].extend(step.token_ids)
        last[step.method] = step
    rates = {m: last[m].generated / last[m].elapsed_s if m in last and last[m].elapsed_s > 0 else 0.0 for m in tokens}
    auto_steps = last[Method.TOKENSWIFT].index + 1 if Method.TOKENSWIFT in last else 0
    return {"ar_tok_s": rates[Method.AR], "auto_tok_s": rates[Method.TOKENSWIFT],
            "ratio": ratio(rates[Method.TOKENSWIFT], rates[Method.AR]),
            "auto_mean_accepted": len(tokens[Method.TOKENSWIFT]) / max(1, auto_steps),
            "identical": tokens[Method.TOKENSWIFT] == tokens[Method.AR], "new_tokens": len(tokens[Method.AR])}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(model: torch.nn.Module, prompt: list[int], ar_tokens: list[int], pos: int, settings: Settings) -> dict:
    """Top-2 logit gap where AR chose ar_tokens[pos]: one forward of `model` over prompt + ar_tokens[:pos],
    the CTRL penalty over the last penalty_window tokens applied when the row has one."""
    from ..sampling import apply_penalty

    ids = list(prompt) + list(ar_tokens[:pos])
    with torch.no_grad():
        try:
            logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float()
        except TypeError:  # models without logits_to_keep
            logits = model(torch.tensor([ids])).logits[0, -1].float()
    if settings.penalty != 1.0:
        logits = apply_penalty(logits, torch.tensor(ids[-settings.penalty_window:]), settings.penalty)
    top = torch.topk(logits, 2)
    return {"gap": round(float(top.values[0] - top.values[1]), 5), "top2": top.indices.tolist(),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


def lossless_check(prompt: list[int], ar: list[list[int]], other: list[list[int]], settings: Settings,
                   gap_models: list[torch.nn.Module]) -> dict:
    """Compare one method's ids with AR's, repeat by repeat; at the first divergence (greedy rows) the top-2
    logit gap from each of gap_models."""
    for r, (a, b) in enumerate(zip(ar, other)):
        pos = first_divergence(a, b)
        if pos is None:
            continue
        out = {"identical": False, "repeat": r, "first_diff": pos, "ar_token": a[pos] if pos < len(a) else None,
               "token": b[pos] if pos < len(b) else None}
        if settings.greedy and pos < len(a):
            gaps = [top2_gap(m, prompt, a, pos, settings) for m in gap_models]
            for g in gaps:
                g["ar_token_is_top1"] = g["top2"][0] == a[pos]
            out["gaps"] = gaps
            out["near_tie"] = any(g["gap"] < NEAR_TIE for g in gaps)
        return out
    return {"identical": True, "repeats": len(other)}


# ---- the benchmark ----------------------------------------------------------------------------------------
def run_speed(gen, hf_models: dict[str, torch.nn.Module], prompts: dict[int, list[int]], rows: list[str],
              tokens: int, repeats: int, auto_tree: str = AUTO, seed: int = 0, pld_dtype: str | None = None,
              progress: bool = True, warmup: bool = True, paper: bool = True) -> dict:
    """Run every (context, row) x method `repeats` times, methods alternating in a rotated order, then ours-ar and
    tokenswift-auto paired (`paired_generate`). paper=False leaves the paper's tree out (a shorter check).

    gen: a tokenswift.Generator; hf_models: {"bfloat16": model, "float32": model} (either may be absent;
    empty: no HF columns); prompts: {context length: token ids}. pld_dtype: the HF dtype for prompt lookup
    (None: per row, the faster of the HF runs of the first repeat, which run before it). Returns
    {"runs": [raw run records], "rows": [per-row medians, ratios, lossless checks]}."""
    from tqdm import tqdm

    for row in rows:
        if row not in ROWS:
            raise ValueError(f"unknown sampling row {row!r}; choose from {', '.join(ROWS)}")
        method_settings(row, "tokenswift-auto", auto_tree)  # a readable ValueError now, not mid-run
    have_hf = set(hf_models)
    if warmup:
        _warmup(gen, hf_models, next(iter(prompts.values())), auto_tree, seed)
    total = sum(len(methods_for(row, have_hf, paper)) + 1 for row in rows) * repeats * len(prompts)
    bar = tqdm(total=total, file=sys.stderr, disable=not progress, desc="speed", dynamic_ncols=True)
    runs: list[dict] = []
    out_rows: list[dict] = []
    gap_models = [hf_models.get("float32", gen.model)]
    engine_dtype = str(gen.adapter.dtype).replace("torch.", "")
    if engine_dtype != "float32" and engine_dtype in hf_models:
        gap_models.append(hf_models[engine_dtype])
    try:
        for context, ids in prompts.items():
            for row in rows:
                methods = methods_for(row, have_hf, paper)
                toks: dict[str, list[list[int]]] = {m: [] for m in methods}
                cell_runs: list[dict] = []
                row_pld = pld_dtype
                for r in range(repeats):
                    k = r % len(methods)
                    order = methods[k:] + methods[:k]
                    for slot, method in enumerate(order):
                        bar.set_postfix_str(f"{context} {row} {method} #{r + 1}")
                        rec = {"context": context, "sampling": row, "method": method, "repeat": r, "order": slot}
                        if method in OURS:
                            s = method_settings(row, method, auto_tree)
                            engine = Method.AR if method == "ours-ar" else Method.TOKENSWIFT
                            new, stats = ours_generate(gen, ids, s, tokens, engine, seed)
                            rec.update(stats)
                        else:
                            if method == PLD:
                                if row_pld is None:
                                    row_pld = _faster_dtype(cell_runs) or next(iter(hf_models))
                                dtype = row_pld
                            else:
                                dtype = HF_RUNS[method]
                            new, wall = hf_generate(hf_models[dtype], ids, row, tokens, seed, prompt_lookup=method == PLD)
                            rec.update({"dtype": dtype, "wall_s": wall, "wall_tok_s": len(new) / wall})
                        rec["new_tokens"] = len(new)
                        toks[method].append(new)
                        cell_runs.append(rec)
                        runs.append(rec)
                        bar.update(1)
                    bar.set_postfix_str(f"{context} {row} {PAIRED} #{r + 1}")
                    rec = {"context": context, "sampling": row, "method": PAIRED, "repeat": r,
                           **paired_generate(gen, ids, row, auto_tree, tokens, seed)}
                    cell_runs.append(rec)
                    runs.append(rec)
                    bar.update(1)
                out_rows.append(_summarize_row(context, row, ids, methods, cell_runs, toks, row_pld, gap_models))
    finally:
        bar.close()
    return {"runs": runs, "rows": out_rows}


def _warmup(gen, hf_models: dict, ids: list[int], auto_tree: str, seed: int) -> None:
    """One short untimed run of each method: first-call costs (allocator, lazy init) stay out of the runs."""
    short = ids[: min(len(ids), 64)]
    n = 8
    for method in OURS:
        gen.generate(short, method_settings("greedy", method, auto_tree), n,
                     method=Method.AR if method == "ours-ar" else Method.TOKENSWIFT, seed=seed)
    for model in hf_models.values():
        hf_generate(model, short, "greedy", n, seed)
        hf_generate(model, short, "greedy", n, seed, prompt_lookup=True)


def _faster_dtype(cell_runs: list[dict]) -> str | None:
    by_dtype: dict[str, list[float]] = {}
    for rec in cell_runs:
        if rec["method"] in HF_RUNS:
            by_dtype.setdefault(rec["dtype"], []).append(rec["wall_tok_s"])
    if not by_dtype:
        return None
    return max(by_dtype, key=lambda d: statistics.median(by_dtype[d]))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is missing, nan or b is 0."""
    if a is None or b is None or not b or a != a or b != b:
        return None
    return a / b


def _summarize_row(context: int, row: str, prompt: list[int], methods: list[str], cell_runs: list[dict],
                   toks: dict[str, list[list[int]]], pld_dtype: str | None, gap_models: list) -> dict:
    medians: dict[str, dict] = {}
    for method in methods:
        recs = [r for r in cell_runs if r["method"] == method]
        m = {"wall_tok_s": _median([r["wall_tok_s"] for r in recs]), "wall_s": _median([r["wall_s"] for r in recs])}
        if method in OURS:
            for key in ("tok_s", "time_s", "prefill_s", "mean_accepted", "iterations", "mean_draft_nodes",
                        "draft_s", "verify_s", "bookkeeping_s"):
                m[key] = _median([r[key] for r in recs])
            m["tree"] = recs[0]["tree"]
        else:
            m["dtype"] = recs[0]["dtype"]
        medians[method] = m
    if PLD not in methods and not ROWS[row].greedy:
        medians[PLD] = {"skipped": PLD_SKIP}
    hf = [m for m in HF_RUNS if m in medians]
    peer = max(hf, key=lambda m: medians[m]["wall_tok_s"]) if hf else None
    hf_peer = {"method": peer, "dtype": medians[peer]["dtype"], "wall_tok_s": medians[peer]["wall_tok_s"]} if peer else None

    def get(method: str, key: str) -> float | None:
        return medians.get(method, {}).get(key)

    paired = [r for r in cell_runs if r["method"] == PAIRED]
    if paired:
        medians[PAIRED] = {"ratio": _median([r["ratio"] for r in paired]),
                           "ratios": [r["ratio"] for r in paired], "identical": all(r["identical"] for r in paired),
                           "mean_accepted": _median([r["auto_mean_accepted"] for r in paired])}
    ratios = {
        "ours-ar/hf-peer (wall)": ratio(get("ours-ar", "wall_tok_s"), hf_peer["wall_tok_s"] if hf_peer else None),
        "tokenswift-auto/ours-ar": ratio(get("tokenswift-auto", "tok_s"), get("ours-ar", "tok_s")),
        "tokenswift-auto/ours-ar (paired)": get(PAIRED, "ratio"),
        "tokenswift-paper/ours-ar": ratio(get("tokenswift-paper", "tok_s"), get("ours-ar", "tok_s")),
        "tokenswift-auto/hf-prompt-lookup (wall)": ratio(get("tokenswift-auto", "wall_tok_s"), get(PLD, "wall_tok_s")),
        "tokenswift-auto/ours-ar (wall)": ratio(get("tokenswift-auto", "wall_tok_s"), get("ours-ar", "wall_tok_s")),
        "tokenswift-paper/ours-ar (wall)": ratio(get("tokenswift-paper", "wall_tok_s"), get("ours-ar", "wall_tok_s")),
    }
    settings = ROWS[row]
    lossless = {m: lossless_check(prompt, toks["ours-ar"], toks[m], settings, gap_models)
                for m in ("tokenswift-auto", "tokenswift-paper") if m in toks}
    lossless["ours-ar repeats identical"] = all(t == toks["ours-ar"][0] for t in toks["ours-ar"])
    hf_same = {}
    for m in hf + ([PLD] if PLD in methods else []):
        if settings.greedy:  # informational: HF's penalty window differs, and bf16 kernels differ from ours
            pos = first_divergence(toks["ours-ar"][0], toks[m][0])
            hf_same[m] = {"identical": pos is None, "first_diff": pos}
    notes = []
    if settings.penalty != 1.0 and hf:
        notes.append(PENALTY_NOTE)
    if PLD in methods and hf_peer and pld_dtype != hf_peer["dtype"]:
        notes.append(f"prompt lookup ran in {pld_dtype} (the faster HF dtype in the first repeat); by medians "
                     f"{hf_peer['dtype']} was faster")
    return {"context": context, "sampling": row, "medians": medians, "hf_peer": hf_peer, "pld_dtype": pld_dtype,
            "ratios": ratios, "lossless": lossless, "hf_vs_ours_ar_ids": hf_same, "notes": notes}


# ---- command line ----------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="assets/default-model", help="model directory or a built-in model's name "
                   "(smollm2-135m: fetched on first use)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 16000], help="prompt lengths in tokens")
    p.add_argument("--tokens", type=int, default=1000, help="new tokens per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="sampling settings")
    p.add_argument("--auto-tree", default=AUTO, help="tree of the tokenswift-auto column (default 'auto')")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="our engine's dtype (default: the checkpoint's)")
    p.add_argument("--pld-dtype", default=None, choices=["bfloat16", "float32"],
                   help="HF dtype for prompt lookup (default: the faster HF dtype of each row's first repeat)")
    p.add_argument("--corpus", default=None, help="corpus directory (default ../shared/corpus)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="runs/bench-speed")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-hf", action="store_true",
                   help="only our methods (AR, auto, paper tree): a shorter side-by-side check of auto / AR")
    p.add_argument("--no-paper", action="store_true",
                   help="leave the paper's tree out (at 16K context it takes about 6x the time of AR)")
    p.add_argument("--browser", default=None, help="a Chromium to screenshot speed.png with (default: chromium, "
                   "chromium-browser or google-chrome on PATH; without one only speed.html is written)")
