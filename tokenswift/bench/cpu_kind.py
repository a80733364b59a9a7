"""`bench cpu-kind`: every speed measurement the README's table asks of one kind of CPU, as one resumable suite.

    python -m tokenswift.bench cpu-kind [--out-dir runs/cpu-kind] [--variants native avx2 ...] [--no-smollm2]

A CPU kind (AMX; AVX-512 without AMX; AVX2 only) gets its rows in the README's speed table from a handful of
`bench speed` and `bench rows` runs. This command runs them one after another, each in a process of its own so that
a kernel variant can be forced through TOKENSWIFT_ISA, and writes:

    OUT/plan.json             the steps, their command lines and environments
    OUT/progress.txt          one line per step as it starts and ends (what a long run in the background shows)
    OUT/<step>/...            each `bench speed` step's results.json / table.md, each `bench rows` step's rows.json
    OUT/<step>.log            its output
    OUT/summary.md            the figures of every finished step, in the README's columns

A step whose results exist is not run again, so a stopped suite resumes where it stopped (`--redo` runs all).

The steps (see `plan`):
  * the default model, each chosen variant: 1K and 16K context, every sampling row, our methods only (auto / AR
    paired is what the README's table reports; the paper's tree is left out: at 16K it takes 6x AR's time);
  * SmolLM2-135M (fetched first, if it can be), the native variant: 1K with HF `generate` beside (AR / HF), and
    about 6K context;
  * SmolLM2-135M's rows (one verified row and four) under each chosen variant, alternated for `--rounds` rounds:
    which variant's weight products serve its shape best on this CPU.

The variants are the CPU's own (`native`) and, unless `--variants` names others, the AVX2 build where the CPU runs
a wider one, plus the plain AVX-512 build where the AVX-512 BF16 one is native (AVX-512 BF16 and no AMX: the
variant that was this kind's default until session 38 measured both). Speed ratios compare only runs made side by
side: within one `bench speed` (paired), or alternated `bench rows` rounds.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..native import build
from ..native.switches import ISA_ENV

SMOLLM2 = "smollm2-135m"
DEFAULT_MODEL = "assets/default-model"
SAMPLING_ROWS = ("greedy", "greedy+penalty", "paper")


@dataclass(frozen=True)
class Step:
    """One benchmark process: `python -m tokenswift.bench <argv>` (or `python -m tokenswift <argv>` for a fetch)
    with `env` added to this process's environment."""

    name: str  # its folder and log under the suite's out dir
    kind: str  # "speed" | "rows" | "fetch"
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    model: str = DEFAULT_MODEL
    variant: str = "native"

    def command(self) -> list[str]:
        module = "tokenswift" if self.kind == "fetch" else "tokenswift.bench"
        return [sys.executable, "-m", module, *self.argv]

    def shell(self) -> str:
        """The step as a command line anyone can rerun."""
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return (env + " " if env else "") + "python -m " + ("tokenswift " if self.kind == "fetch" else
                                                            "tokenswift.bench ") + " ".join(self.argv)


def runnable_variants(flags: set[str]) -> list[str]:
    """The kernel variants this CPU can run, best first."""
    return [v.name for v in build.VARIANTS.values() if v.cpu <= flags]


def native_variant(flags: set[str]) -> str | None:
    """The variant a process chooses by itself on this CPU (None: no variant runs here)."""
    return next((v.name for v in build.VARIANTS.values() if v.cpu <= flags), None)


def default_variants(flags: set[str]) -> list[str]:
    """native, then the AVX2 build where the CPU runs a wider one, then the plain AVX-512 build where the AVX-512
    BF16 one is native (AVX-512 BF16 and no AMX)."""
    native = native_variant(flags)
    chosen = ["native"]
    if native is not None and native != "avx2":
        chosen.append("avx2")
    if native == "avx512bf16":
        chosen.append("avx512")
    return chosen


def check_variants(names: list[str], flags: set[str]) -> list[str]:
    """`names` as given to --variants, checked: each "native" or a variant this CPU runs, no repeats. Raises
    ValueError with a readable message."""
    runnable = runnable_variants(flags)
    for name in names:
        if name != "native" and name not in build.VARIANTS:
            raise ValueError(f"unknown kernel variant {name!r}: expected native or one of {', '.join(build.VARIANTS)}")
        if name != "native" and name not in runnable:
            raise ValueError(f"this CPU cannot run the {name} variant (it runs: {', '.join(runnable) or 'none'})")
    if len(set(names)) != len(names):
        raise ValueError(f"a variant is named twice in {' '.join(names)}")
    if not names:
        raise ValueError("name at least one variant")
    return names


def plan(variants: list[str], out_dir: str, smollm2: bool = True, tokens: int = 1000,
         contexts: tuple[int, int] = (1024, 16000), smol_long: int = 6000, rows_repeats: int = 5,
         rounds: int = 3, corpus: str | None = None) -> list[Step]:
    """The suite's steps in the order they run (a pure function of its arguments); `corpus`: the prompts' corpus
    folder (default: `bench speed`'s)."""
    def env(v: str) -> dict[str, str]:
        return {} if v == "native" else {ISA_ENV: v}

    def speed(name: str, model: str, context: int, *extra: str) -> tuple[str, ...]:
        return ("speed", "--model", model, "--contexts", str(context), "--tokens", str(tokens), "--repeats", "1",
                *extra, "--no-paper", "--no-progress", "--out-dir", f"{out_dir}/{name}",
                *(("--corpus", corpus) if corpus else ()))

    steps: list[Step] = []
    for v in variants:
        for ctx in contexts:
            name = f"default-{v}-{ctx}"
            steps.append(Step(name, "speed", speed(name, DEFAULT_MODEL, ctx, "--no-hf"), env(v), DEFAULT_MODEL, v))
    if not smollm2:
        return steps
    steps.append(Step("fetch-smollm2", "fetch", ("fetch", SMOLLM2), {}, SMOLLM2))
    ctx = contexts[0]
    name = f"smollm2-native-{ctx}-hf"
    steps.append(Step(name, "speed", speed(name, SMOLLM2, ctx), {}, SMOLLM2))
    name = f"smollm2-native-{smol_long}"
    steps.append(Step(name, "speed", speed(name, SMOLLM2, smol_long, "--no-hf"), {}, SMOLLM2))
    for r in range(1, rounds + 1):
        for v in variants:
            steps.append(Step(f"smollm2-rows-{v}-r{r}", "rows",
                              ("rows", "--model", SMOLLM2, "--context", str(ctx), "--rows", "1", "4", "--repeats",
                               str(rows_repeats)), env(v), SMOLLM2, v))
    return steps


# ---- running ---------------------------------------------------------------------------------------------------
def result_path(out: Path, step: Step) -> Path:
    return out / step.name / ("results.json" if step.kind == "speed" else f"{step.kind}.json")


def run_step(step: Step, out: Path) -> tuple[bool, str]:
    """Run one step in its own process; its outputs go under `out` (the plan's out dir). Returns (finished, a
    line on how it ended)."""
    (out / step.name).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **step.env}
    argv = step.command()
    log = out / f"{step.name}.log"
    t = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {step.shell()}\n")
        f.flush()
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        return False, f"failed (exit code {proc.returncode}) after {took:.0f} s: see {log}"
    if step.kind in ("rows", "fetch"):  # their result is the last line they print (JSON for rows, a folder for fetch)
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        payload = json.loads(last) if step.kind == "rows" else {"folder": last}
        payload["wall_s"] = round(took, 1)
        result_path(out, step).write_text(json.dumps(payload, indent=1) + "\n")
    return True, f"done in {took:.0f} s"


def run_suite(steps: list[Step], out: Path, redo: bool = False, say=print) -> dict[str, str]:
    """Run every step whose result is missing (all with `redo`); SmolLM2's steps are skipped when its fetch fails.
    Returns step name -> how it ended."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps([{**asdict(s), "shell": s.shell()} for s in steps], indent=1) + "\n")
    progress = out / "progress.txt"
    ended: dict[str, str] = {}
    fetch_failed = ""
    for i, step in enumerate(steps, 1):
        if step.model == SMOLLM2 and step.kind != "fetch" and fetch_failed:
            ended[step.name] = f"skipped: the fetch of {SMOLLM2} failed ({fetch_failed})"
        elif result_path(out, step).exists() and not redo:
            ended[step.name] = "kept from an earlier run"
        else:
            _log(progress, f"[{i}/{len(steps)}] {step.name}: started: {step.shell()}", say)
            ok, how = run_step(step, out)
            ended[step.name] = how
            if step.kind == "fetch" and not ok:
                fetch_failed = how
        _log(progress, f"[{i}/{len(steps)}] {step.name}: {ended[step.name]}", say)
    summary = summarize(steps, out)
    (out / "summary.md").write_text(summary + "\n")
    _log(progress, f"wrote {out / 'summary.md'}", say)
    return ended


def _log(path: Path, line: str, say) -> None:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with open(path, "a") as f:
        f.write(f"{stamp} {line}\n")
    say(line)


# ---- the summary -----------------------------------------------------------------------------------------------
def _f(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def speed_lines(step: Step, results: dict) -> list[str]:
    """README-style cells of one `bench speed` result: one line per context, the sampling rows side by side."""
    cond = results.get("conditions", {})
    by_context: dict[int, dict[str, dict]] = {}
    for row in results["rows"]:
        by_context.setdefault(row["context"], {})[row["sampling"]] = row
    lines = []
    for ctx, rows in by_context.items():
        ar = [rows[s]["medians"]["ours-ar"]["tok_s"] for s in SAMPLING_ROWS if s in rows]
        cells = []
        for s in SAMPLING_ROWS:
            row = rows.get(s)
            paired = row["medians"].get("paired") if row else None
            if not paired:
                cells.append("–")
                continue
            ids = "" if paired["identical"] else " ≠AR"
            cells.append(f"{_f(paired['ratio'])} ({_f(paired['mean_accepted'])}/it){ids}")
        hf = [rows[s]["ratios"].get("ours-ar/hf-peer (wall)") for s in SAMPLING_ROWS if s in rows]
        hf = [x for x in hf if x is not None]
        hf_cell = f"{min(hf):.2f}-{max(hf):.2f}" if hf else "–"
        greedy = rows.get("greedy")
        ts = greedy["medians"].get("tokenswift-auto", {}).get("tok_s") if greedy else None
        ran = cond.get("kernel_variant") or "none"
        variant = ran if step.variant == "native" else f"{ran} (forced)"
        lines.append(f"| {step.model} | {variant} | {ctx:,} | {min(ar):.1f}-{max(ar):.1f} | " + " | ".join(cells)
                     + f" | {hf_cell} | {_f(ts, 1)} |")
    return lines


def rows_lines(steps: list[Step], out: Path) -> list[str]:
    """Medians over rounds of each variant's SmolLM2 rows: total and weight products, 1 and 4 rows (ms)."""
    per_variant: dict[str, list[dict]] = {}
    for step in steps:
        p = result_path(out, step)
        if step.kind == "rows" and p.exists():
            per_variant.setdefault(step.variant, []).append(json.loads(p.read_text())["milliseconds"])
    lines = []
    for v, runs in per_variant.items():
        cells = []
        for q in ("1", "4"):
            for part in ("total", "matrices"):
                xs = [r[q][part] for r in runs if q in r]
                cells.append(_f(statistics.median(xs), 1) if xs else "–")
        label = f"native ({native_variant(build.cpu_flags())})" if v == "native" else f"{v} (forced)"
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def summarize(steps: list[Step], out: Path) -> str:
    flags = build.cpu_flags()
    head = [f"# CPU kind suite: {build.cpu_kind()} ({_cpu_name()}), {os.cpu_count()} CPUs online",
            "",
            f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python -m tokenswift.bench cpu-kind`; the native "
            f"variant here is {native_variant(flags) or 'none'}. One torch thread; each step's command is in plan.json.",
            "",
            "## TokenSwift auto / our AR, paired (tokens per iteration); our AR / HF generate (wall)",
            "",
            "A forced variant's ratios are against its own AR: compare variants by the last column, TokenSwift's own "
            "speed (greedy, compute only).",
            "",
            "| model | variant | context | our AR tok/s | greedy | greedy + penalty 1.2 | paper sampling | AR / HF "
            "| TokenSwift greedy tok/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    body, missing = [], []
    for step in steps:
        p = result_path(out, step)
        if step.kind != "speed":
            continue
        if not p.exists():
            missing.append(step.name)
            continue
        body += speed_lines(step, json.loads(p.read_text()))
    rows = rows_lines(steps, out)
    text = head + body
    if rows:
        text += ["", "## SmolLM2-135M: one verified row and four, ms (medians over alternated rounds)", "",
                 "| variant | rounds | 1 row | 1 row: matrices | 4 rows | 4 rows: matrices |", "|---|---:|---:|---:|---:|---:|"]
        text += rows
    if missing:
        text += ["", "Not measured (yet): " + ", ".join(missing) + "."]
    text += ["", "≠AR: an output differed from AR's (see that step's table.md: a float32 near-tie or a fault)."]
    return "\n".join(text)


def _cpu_name() -> str:
    from .conditions import cpu_model

    return cpu_model()


def main(args) -> int:
    flags = build.cpu_flags()
    try:
        variants = check_variants(list(args.variants) if args.variants else default_variants(flags), flags)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if native_variant(flags) is None:
        print("error: no native kernel variant runs on this CPU (it needs AVX2 and FMA at least); the suite measures "
              "kernel variants", file=sys.stderr)
        return 2
    steps = plan(variants, args.out_dir, smollm2=not args.no_smollm2, tokens=args.tokens, rounds=args.rounds)
    out = Path(args.out_dir)
    print(f"{len(steps)} steps on {build.cpu_kind()} (native: {native_variant(flags)}), variants: {' '.join(variants)}; "
          f"progress in {out / 'progress.txt'}")
    ended = run_suite(steps, out, redo=args.redo)
    failed = [k for k, v in ended.items() if v.startswith("failed")]
    print((out / "summary.md").read_text())
    return 1 if failed else 0
