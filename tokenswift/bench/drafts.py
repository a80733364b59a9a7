"""What cheap drafters could give along our own AR continuation of a held-out prompt.

    python -m tokenswift.bench suffix-bound [--penalty 1.2] [--context 1024] [--tokens 1000] [--row-costs 1:1,3:1.07]
        Tokens per iteration that suffix-match drafts alone could give, were every verified row free: drafts of up
        to 1..16 tokens replayed over our own greedy output (an upper bound for that source); and the bound for any
        drafter that works from the text, told which earlier occurrence to follow; with the host's row costs, the
        tokens per step that would give verifying exactly what is accepted.

    python -m tokenswift.bench draft-hits [--context 1024] [--tokens 1000]
        How often the suffix match's and the datastore's first guess is the next token (greedy, greedy + penalty
        1.2, the paper's sampling; seed 0), and how often the datastore is right where the suffix match is not.
"""
from __future__ import annotations

from typing import Callable

from ..kinds import Method, Source


def best_matches(prompt: list[int], out: list[int], cap: int) -> list[int]:
    """Per position i of `out`: the longest run of out[i:] (at most `cap` tokens) that some earlier occurrence of
    the last known token continues with, reading only the text known before i (a continuation that reaches the
    end of the known text repeats its period, as `SuffixIndex.lookup` does). The most any drafter working from the
    text itself could draft there, were it told which occurrence to follow."""
    seq = list(prompt) + list(out)
    start = len(prompt)
    where: dict[int, list[int]] = {}
    for j in range(start - 1):  # occurrences whose successor is known
        where.setdefault(seq[j], []).append(j)
    best = []
    for i in range(start, len(seq)):
        top = 0
        for j in where.get(seq[i - 1], ()):
            c, m = j + 1, 0
            period = i - c
            while m < cap and i + m < len(seq) and seq[c + m % period] == seq[i + m]:
                m += 1
            top = max(top, m)
        best.append(top)
        where.setdefault(seq[i - 1], []).append(i - 1)
    return best


def replay(matches: list[int], row_cost: Callable[[int], float] | None = None) -> tuple[float, float | None]:
    """Iterations that each accept the drafted run at their position plus one token: (tokens per iteration, and
    where `row_cost(q)` gives a q-row verification's time in one-row steps, tokens per step when every iteration
    verifies exactly its accepted run: no missed draft, no planning)."""
    i = iterations = 0
    steps = 0.0
    while i < len(matches):
        m = matches[i]
        iterations += 1
        steps += row_cost(m + 1) if row_cost is not None else 0.0
        i += m + 1
    return len(matches) / iterations, (len(matches) / steps if row_cost is not None else None)


def row_cost_curve(text: str) -> Callable[[int], float]:
    """'1:1,3:1.07,8:1.94' (rows: time of that many rows in one-row steps, `bench rows`) -> the cost of q rows as
    auto's cost model prices it from such points (`CostModel.cost`: linear between them, the last slope beyond)."""
    from ..auto import CostModel

    points = sorted((int(a), float(b)) for a, b in (item.split(":") for item in text.split(",")))
    model = CostModel()
    model.rows, model.seconds = [q for q, _ in points], [c for _, c in points]
    return model.cost


def suffix_bound(model: str, text_path: str, context: int, tokens: int, penalty: float,
                 row_costs: str | None = None) -> dict:
    """Tokens per iteration that suffix-match drafts alone could give if every verified row were free:
    replay drafts of up to L tokens over our own greedy AR output (accept the matching prefix, plus one). And the
    bound for any drafter working from the text (`best_matches`): told which earlier occurrence to follow, with up
    to L tokens; with `row_costs`, the tokens per step it would reach verifying exactly what is accepted."""
    from ..generator import Generator
    from ..settings import Settings
    from ..suffix import SuffixIndex
    from ..train.corpus import split_text

    gen = Generator.from_pretrained(model)
    with open(text_path, encoding="utf-8") as f:
        ids = gen.encode(split_text(f.read())[1])[:context]
    out = gen.generate(ids, Settings(penalty=penalty), tokens, method=Method.AR).token_ids
    rows, best, speed = {}, {}, {}
    cost = row_cost_curve(row_costs) if row_costs else None
    for limit in (1, 2, 4, 8, 16):
        index, i, iterations = SuffixIndex(), 0, 0
        index.extend(ids)
        while i < len(out):
            _, draft = index.lookup(limit)
            hit = 0
            while hit < len(draft) and i + hit < len(out) and draft[hit] == out[i + hit]:
                hit += 1
            made = min(hit + 1, len(out) - i)
            index.extend(out[i : i + made])
            i, iterations = i + made, iterations + 1
        rows[limit] = round(len(out) / iterations, 2)
        per_iteration, per_step = replay(best_matches(ids, out, limit), cost)
        best[limit] = round(per_iteration, 2)
        if per_step is not None:
            speed[limit] = round(per_step, 2)
    result = {"benchmark": "suffix-bound", "model": model, "context": len(ids), "new_tokens": tokens, "penalty": penalty,
              "tokens_per_iteration_by_draft_length": rows, "best_occurrence_tokens_per_iteration": best}
    if cost is not None:
        result["best_occurrence_tokens_per_step"] = speed
        result["row_costs"] = row_costs
    return result


HIT_SAMPLING = {"greedy": dict(), "greedy+penalty": dict(penalty=1.2),
                "paper": dict(temperature=1.0, min_p=0.1, penalty=1.2)}


def draft_hits(model: str, text_path: str, context: int, tokens: int) -> dict:
    """How often each cheap drafter's first guess is the next token, along our own AR continuation of a
    held-out prompt (seed 0): the suffix match, the model's datastore, and the datastore where the suffix
    match missed (what it adds)."""
    from ..generator import Generator
    from ..settings import Settings
    from ..suffix import SuffixIndex
    from ..train.corpus import split_text

    gen = Generator.from_pretrained(model)
    if gen.datastore is None:
        raise SystemExit(f"{model} has no datastore.safetensors")
    with open(text_path, encoding="utf-8") as f:
        ids = gen.encode(split_text(f.read())[1])[:context]
    rows = {}
    for name, sampling in HIT_SAMPLING.items():
        out = gen.generate(ids, Settings(**sampling), tokens, method=Method.AR, seed=0).token_ids
        index = SuffixIndex()
        index.extend(ids)
        suffix = store = store_only = 0
        for i, token in enumerate(out):
            guess = index.lookup(1)[1]
            suffix_hit = bool(guess) and guess[0] == token
            found = gen.datastore.lookup(index.tokens)[1]  # the index holds the text so far
            store_hit = bool(found) and found[0][0] == token
            suffix, store, store_only = suffix + suffix_hit, store + store_hit, store_only + (store_hit and not suffix_hit)
            index.extend([token])
        n = len(out)
        rows[name] = {Source.SUFFIX: round(suffix / n, 3), Source.DATASTORE: round(store / n, 3),
                      "datastore_where_suffix_missed": round(store_only / n, 3)}
    return {"benchmark": "draft-hits", "model": model, "context": len(ids), "new_tokens": tokens,
            "top1_hit_rate": rows}
