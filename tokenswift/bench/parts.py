"""Where an iteration's time goes in the decode loop: our AR's steps beside TokenSwift auto's iterations, split
into the forward, the logits and the Python around them (drafting, the verification inputs, the decision, the
cache report), each part timed where it runs.

    python -m tokenswift.bench parts [--row greedy] [--context 1024] [--tokens 1000] [--repeats 2] [--detail]
                                     [--text FILE]

Why: a part timed alone on warm caches says little here. A forward streams about 31 MB of weights through a
2-vCPU host's caches, and a small call right after it costs several times what it costs in a loop of its own
(README, "Speed on a CPU"). So the parts are timed inside real generations: the engine's functions are wrapped
for the duration of the benchmark (one clock read on each side of every call, about 1 us) and restored after.
AR and auto alternate, `repeats` generations each, so that the machine's drift falls on both alike.

Auto's iterations are split by kind: `plain` (no draft was verified: an AR-cost step, or a plan that kept
nothing) and `drafted` (at least one drafted node). For each part: the median milliseconds over the
iterations that called it and the share of iterations that did; `other` is each iteration's time outside the
top-level parts (the bookkeeping: KV compaction, commits, acceptance statistics, events). Times in AR steps
divide by our AR's median step.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from typing import Iterator

import torch

from ..kinds import Method

# label -> (dotted owner, attribute). Labels with a dot are parts of the part before the dot (not summed twice).
PARTS: dict[str, tuple[str, str]] = {
    "forward": ("tokenswift.adapter:ModelAdapter", "forward"),
    "logits": ("tokenswift.adapter:ModelAdapter", "logits"),
    "draft": ("tokenswift.auto:AutoDrafter", "propose"),
    "draft.index": ("tokenswift.drafters:ReuseIndex", "update"),
    "draft.suffix": ("tokenswift.suffix:SuffixIndex", "lookup"),
    "draft.datastore": ("tokenswift.datastore:Datastore", "lookup"),
    "draft.ngrams": ("tokenswift.ngram:NGramTable", "top"),
    "draft.heads": ("tokenswift.auto:AutoDrafter", "head_candidates"),
    "draft.plan": ("tokenswift.auto", "choose"),
    "inputs": ("tokenswift.verifier", "verification_inputs"),
    "walk": ("tokenswift.native.decide", "walk_tree"),
    "decide": ("tokenswift.verifier:Verifier", "decide"),
    "cache_state": ("tokenswift.run_state:RunState", "cache_state"),
}
TOP_LEVEL = tuple(label for label in PARTS if "." not in label)


def _owner(dotted: str):
    import importlib

    module, _, cls = dotted.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


@contextlib.contextmanager
def timed_parts(totals: dict[str, float]) -> Iterator[None]:
    """While active, every call of a PARTS function adds its seconds to totals[label]."""
    saved = []
    for label, (dotted, name) in PARTS.items():
        owner = _owner(dotted)
        original = getattr(owner, name)
        saved.append((owner, name, original))

        def timed(*args, _f=original, _label=label, **kwargs):
            t = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                totals[_label] += time.perf_counter() - t

        setattr(owner, name, timed)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _kind(step) -> str:
    if step.method == Method.AR:
        return Method.AR
    return "drafted" if step.draft_nodes else "plain"


def parts(model: str, row: str, context: int, tokens: int, repeats: int, detail: bool = False,
          text_path: str | None = None, threads: int = 1) -> dict:
    """Per iteration kind (ar, plain, drafted): the median total, each part's median and share, in ms and AR
    steps, on `threads` torch threads (restored afterwards). The prompt: the first `context` tokens of the
    corpus's held-out text (as `bench speed`), or of `text_path`'s held-out part (its last 5% of lines)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _parts(model, row, context, tokens, repeats, detail, text_path)
    finally:
        torch.set_num_threads(before)


def _prompt(gen, context: int, text_path: str | None) -> list[int]:
    from .prompts import held_out_prompts
    from ..train.corpus import split_text

    if text_path is None:
        return held_out_prompts(gen.encode, [context])[context]["ids"]
    with open(text_path, encoding="utf-8") as f:
        return gen.encode(split_text(f.read())[1])[:context]


def _parts(model: str, row: str, context: int, tokens: int, repeats: int, detail: bool,
           text_path: str | None) -> dict:
    from .speed import ROWS
    from ..generator import Generator
    from ..tree import AUTO

    gen = Generator.from_pretrained(model)
    gen.warm_up()
    prompt = _prompt(gen, context, text_path)
    settings = ROWS[row]
    runs = ((Method.AR, settings), (Method.TOKENSWIFT, settings.with_changes(tree=AUTO)))
    # samples[kind][label]: one value per iteration of that kind that called the part ("total" and "other": every one)
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    auto_tokens = 0
    totals: dict[str, float] = defaultdict(float)
    with timed_parts(totals):
        for _ in range(repeats):
            for method, s in runs:
                for step in gen.stream(prompt, s, tokens, method=method, seed=0, detail=detail):
                    seconds = dict(totals)
                    totals.clear()
                    if step.index == 0:  # the prefill's calls land on the first step
                        continue
                    kind = _kind(step)
                    if method == Method.TOKENSWIFT:
                        auto_tokens += len(step.tokens)
                    total = step.timings.total_s
                    samples[kind]["total"].append(total)
                    samples[kind]["other"].append(total - sum(seconds.get(p, 0.0) for p in TOP_LEVEL))
                    for label, sec in seconds.items():
                        samples[kind][label].append(sec)
    ar_step = statistics.median(samples[Method.AR]["total"])
    table = {}
    for kind in (Method.AR, "plain", "drafted"):
        n = len(samples[kind]["total"]) if kind in samples else 0
        if not n:
            continue
        out = {"iterations": n}
        for label, values in samples[kind].items():
            ms = statistics.median(values) * 1e3
            cell = {"ms": round(ms, 3), "ar_steps": round(ms / (ar_step * 1e3), 3)}
            if label in PARTS:
                cell["share"] = round(len(values) / n, 3)
            out[label] = cell
        table[str(kind)] = out
    auto_iterations = sum(len(samples[k]["total"]) for k in ("plain", "drafted") if k in samples)
    return {"benchmark": "parts", "model": model, "row": row, "settings": runs[1][1].to_dict(), "context": len(prompt),
            "new_tokens": tokens, "repeats": repeats, "detail": detail, "threads": torch.get_num_threads(),
            "ar_step_ms": round(ar_step * 1e3, 3),
            "auto_tokens_per_iteration": round(auto_tokens / max(1, auto_iterations), 3),
            "iterations": table,
            "parts": "ms: median over the iterations that called the part; share: the fraction of iterations that "
                     "did; other: an iteration's time outside forward, logits, draft, inputs, walk, decide and "
                     "cache_state (KV compaction, commits, acceptance statistics, events); draft.*: parts of draft"}
