"""Write the default model's card (assets/default-model/README.md) from the measured figures, so that
the numbers in it are exactly the ones the runs produced.

    python -m tokenswift.train.model_card --eval runs/eval.json --lm-run runs/lm --heads-run runs/heads \
        --out assets/default-model/README.md
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def curve_table(lm_log: list[dict]) -> str:
    vals = {r["step"]: r for r in lm_log if r.get("kind") == "val"}  # a resumed run may repeat a step: keep the last
    rows = ["| step | minutes | tokens seen | Austen val bits/char | KJV val bits/char | full eval |", "|---|---|---|---|---|---|"]
    for step in sorted(vals):
        r = vals[step]
        rows.append(f"| {step} | {r['elapsed_min']:.0f} | {step * 8192 / 1e6:.1f}M | {r['austen_bpc']:.3f} | "
                    f"{r['kjv_bpc']:.3f} | {'yes' if r.get('full') else 'subset'} |")
    return "\n".join(rows)


LONG_TEMPLATE = """Long generation ({long[new_tokens]:,} new tokens, paper settings, {long[method]}, {long[seconds]} s on a shared CPU): all tokens
finite and valid; distinct-1/2/4 over the last 2,000 tokens {dist[distinct_1]} / {dist[distinct_2]} /
{dist[distinct_4]}; the most frequent
token is {long[most_common_token_share_last_2000]:.1%} of them. Its last 300 tokens:

```text
{long[tail_text]}
```
"""


def _bound_section(b: dict | None) -> str:
    if not b:
        return ""
    rows = "\n".join(f"| {tree} | {v['shipped_heads']:.2f} | {v['oracle_heads']:.2f} |" for tree, v in b["trees_without_ngrams"].items())
    heads = ", ".join(f"{k} {v:.3f}" for k, v in b["head_top1_on_own_samples"].items())
    return f"""**What this model can accept at all.** With exact acceptance, a depth is accepted iff the target's own
sample is among the candidates drafted for it. Along an AR sample with the paper's settings ({b['new_tokens']:,} tokens,
same prefix, seed {b['seed']}; `python -m tokenswift.train.evaluate --parts bound`), the sample equals the base
model's top-1 token with probability **{b['p_sample_is_base_top1']:.3f}**. The paper's tree drafts only that one
token at depth 1, and heads and n-grams only extend it, so on this model it cannot average more than
1 + 4 x {b['p_sample_is_base_top1']:.3f} = **{b['paper_tree_upper_bound']:.2f} tokens per iteration**, whatever the heads. Product trees
replayed along the same sample (without n-grams), with the shipped heads and with perfect heads (each depth's
candidates are the target's own top-k given the true prefix, the most any drafter can put there):

| tree | shipped heads | perfect heads |
|---|---|---|
{rows}

The heads' top-1 hit rate on the model's own samples: {heads}. With the paper's tree, 3 tokens per
iteration is out of reach on this model whatever the heads; much larger trees would need near-perfect heads.
What raises these numbers is a lower-entropy target: a larger or better-trained model, or a lower temperature.
"""


DATASTORE_COMMANDS = """```bash
C="--model assets/default-model --corpus ../shared/corpus --prompt-tokens 64 --prompt-tokens-max 256 --new-tokens 896 --save-ids --threads 1"
python -m tokenswift.train.selfgen $C --mode greedy         --out runs/selfgen/greedy         --batches 4 --batch-size 48 --seed 1
python -m tokenswift.train.selfgen $C --mode greedy-penalty --out runs/selfgen/greedy-penalty --batches 3 --batch-size 48 --seed 2
python -m tokenswift.train.selfgen $C --mode sample         --out runs/selfgen/sample         --batches 3 --batch-size 48 --seed 3
python -m tokenswift.train.datastore --model assets/default-model --corpus ../shared/corpus \\
    --selfgen runs/selfgen --min-count 5 --min-share 0.2 --out assets/default-model
```"""


def datastore_section(model_dir: str | Path) -> str:
    """The card's section on `datastore.safetensors`, from the file itself ('' when the model has none)."""
    from ..datastore import Datastore, find

    path = find(model_dir)
    if path is None:
        return ""
    store = Datastore.load(path)
    orders = ", ".join(f"{len(t):,} of {n} tokens" for n, t in store.tables.items())
    return f"""## Datastore of continuations
`datastore.safetensors` ({path.stat().st_size / 1e6:.2f} MB) holds {len(store):,} contexts ({orders}), each with
its one or two most frequent next tokens and their shares, from the Austen train split and from about 430,000 tokens
the model generated itself (greedy, greedy with penalty 1.2, and the paper's sampling, after 64-256-token prompts
drawn from the train split): contexts seen at least 5 times, continuations with at least a 0.2 share.
`tree="auto"` drafts from it when token reuse is on (`tokenswift/datastore.py`, in the manner of REST); every
draft is verified, so it changes speed, never the output. Built with:
{DATASTORE_COMMANDS}

"""


def render(ev: dict, lm_log: list[dict], heads_log: list[dict], lm_settings: dict, heads_settings: dict,
           hardware: str, lm_minutes: float, heads_minutes: float, datastore_text: str = "") -> str:
    bpc = ev["bits_per_char"]
    cfg = next(r["config"] for r in lm_log if r.get("kind") == "start")
    bpc_rows = "\n".join(f"| {name} | {m['loss']:.3f} | {m['ppl']:.1f} | {m['bpc']:.3f} |" for name, m in bpc.items())
    heads = ev.get("head_accuracy_austen_val", [])
    head_rows = "\n".join(f"| head {h['head']} (token t+{h['head'] + 2}) | {h['top1']:.3f} | {h['top3']:.3f} |" for h in heads)
    acc_rows = "\n".join(
        f"| {a['tree']} | {a['mean_accepted']:.2f} | {a['per_iteration_from_heads']:.2f} | {a['per_iteration_from_ngrams']:.2f} | "
        f"{a['iterations']} |" for a in ev.get("acceptance_2000_tokens", []))
    bound_section = _bound_section(ev.get("acceptance_bound"))
    long = ev.get("long_generation", {})
    dist = long.get("distinct_last_2000", {})
    long_section = (LONG_TEMPLATE.format(long=long, dist=dist) if long else
                    "The 20,000-token generation check has not been measured for this card yet.\n")
    samples = "\n\n".join(f"**Prompt:** {s['prompt']}  (seed {s['seed']}, {s['settings']})\n\n```text\n{s['prompt']}{s['text']}\n```"
                          for s in ev.get("samples", []))
    return f"""---
license: mit
language: en
library_name: transformers
pipeline_tag: text-generation
tags: [tokenswift, speculative-decoding, tiny-llama]
---

# TokenSwift Live default model

A small Llama-family language model with TokenSwift multi-token heads, trained from scratch on a CPU by this
project's own scripts, so that the app and the benchmarks run offline on any machine. It writes English
in the manner of Jane Austen's novels (and of the King James Bible, its second source).

## Data and licence
Six Jane Austen novels (Emma, Mansfield Park, Northanger Abbey, Persuasion, Pride and Prejudice, Sense and
Sensibility; published 1811-1818, public domain) and the King James Bible (1611, public domain), as plain
text (`shared/corpus`). Each file is split by lines: the first 95% trains, the last 5% is held out for
validation. Training windows come from Austen with probability {lm_settings['austen_weight']} and from the
KJV otherwise. The weights and this card are released under the MIT licence.

## Architecture
`LlamaForCausalLM`: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} query
heads of {cfg['head_dim']} dims and {cfg['num_key_value_heads']} KV heads (GQA), MLP {cfg['intermediate_size']},
vocabulary {cfg['vocab_size']} (byte-level BPE trained on the train split, exact round trip), tied embeddings,
RoPE theta {cfg['rope_parameters']['rope_theta']:.0f}; **{ev['params'] / 1e6:.1f}M parameters** plus three TokenSwift
heads ({3 * cfg['hidden_size'] ** 2 / 1e6:.2f}M), stored in bf16. The heads sit inside `model.safetensors` under the
official keys `model.medusa_layers.{{i}}.{{linear,input_layernorm,post_layernorm}}.weight` with `"medusa_heads": 3` in
config.json, so `tokenswift.Generator.from_pretrained` loads base and heads, and plain
`transformers.AutoModelForCausalLM` loads the base (it ignores the head keys).

## Training
```bash
python -m tokenswift.train tokenizer --corpus ../shared/corpus --out runs/tokenizer
python -m tokenswift.train lm --corpus ../shared/corpus --tokenizer runs/tokenizer --out runs/lm --minutes {lm_minutes:g}
python -m tokenswift train-heads --model runs/lm/best --corpus ../shared/corpus --out runs/heads \\
    --context {heads_settings.get('context')} --batch-size {heads_settings.get('batch_size')} --steps {heads_settings.get('steps')} \\
    --distill {heads_settings.get('distill')} --minutes {heads_settings.get('minutes')} --save-model assets/default-model
```
Base LM: context {lm_settings['context']}, batch {lm_settings['batch_size']} windows, AdamW (peak lr {lm_settings['lr']},
warm-up {lm_settings['warmup_steps']} steps, cosine, weight decay {lm_settings['weight_decay']}), bf16 autocast,
seed {lm_settings['seed']}, about {lm_minutes:g} minutes of wall time. Heads: base frozen, head i trained to predict token
t+2+i (cross-entropy mixed with a KL term toward the base model's own distribution, weight {heads_settings.get('distill')}),
lr {heads_settings.get('lr')}, {heads_minutes:g} minutes. Hardware: {hardware}.

Validation during training (Austen and KJV held-out text; "subset" rows use a fixed part of it):

{curve_table(lm_log)}

## Evaluation (held-out text, all windows of {ev.get('context', 1024)} tokens)
| source | token loss | perplexity | bits per character |
|---|---|---|---|
{bpc_rows}

Heads on the held-out Austen text (next-next-token prediction from each position):

| head | top-1 | top-3 |
|---|---|---|
{head_rows}

TokenSwift with the paper's settings (temperature 1.0, min-p 0.1, penalty 1.2 over 1024 tokens, n-gram
reuse top-20, partial KV budget 4096), 2,000 new tokens after a held-out Austen prefix of 1,100 tokens, seed 0.
Accepted tokens per iteration include the bonus token:

| tree | mean accepted / iteration | from heads | from n-grams | iterations |
|---|---|---|---|---|
{acc_rows}

{bound_section}
Our AR decoding at short context (64-token prompt, 256 new tokens, greedy, bf16 weights with float32 KV cache
and logits, batch 1, 2 threads, `--parts speed`):
**{ev.get('ar_tokens_per_s_short_context', float('nan')):.0f} tokens/s**.

{long_section}
{datastore_text}## Samples (unedited)
{samples}

## Limits
A 16M-parameter model trained for about an hour on two CPU cores: it produces Austen-like sentences with
plausible vocabulary and punctuation, but loses the thread of meaning within a sentence or two. It exists
to make TokenSwift observable offline, not to be read for pleasure.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenswift.train.model_card")
    p.add_argument("--eval", required=True)
    p.add_argument("--lm-run", required=True)
    p.add_argument("--heads-run", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hardware", default="2 vCPUs (AMD EPYC, AVX-512 BF16), 24 GB RAM, no GPU")
    p.add_argument("--lm-minutes", type=float, default=80)
    p.add_argument("--heads-minutes", type=float, default=15)
    args = p.parse_args(argv)
    ev = json.loads(Path(args.eval).read_text())
    lm_run, heads_run = Path(args.lm_run), Path(args.heads_run)
    text = render(ev, _log(lm_run / "log.jsonl"), _log(heads_run / "heads_log.jsonl"),
                  json.loads((lm_run / "settings.json").read_text()), json.loads((heads_run / "settings.json").read_text()),
                  args.hardware, args.lm_minutes, args.heads_minutes, datastore_section(Path(args.out).parent))
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
