"""Benchmarks with stated conditions, printing ratios measured side by side in one run: `python -m tokenswift.bench`.

    python -m tokenswift.bench ar-vs-hf [--new 256] [--repeats 3]
        Greedy decoding speed of our AR loop vs HF `generate` on a random-init Llama of about 25M
        parameters (8 layers, hidden 512, 8 heads, 2 KV heads, vocab 8192), fp32, batch 1, 64-token prompt.
        The two run alternately; the ratio of medians is printed, and the outputs are checked equal.

    python -m tokenswift.bench memory --model assets/default-model [--method ar] [--tokens 1000]
        The process's resident memory while one generation streams (paper sampling settings, seed 0):
        what a long run costs beyond its KV cache.

    python -m tokenswift.bench context --model assets/default-model --text ../shared/corpus/emma.txt \
            [--contexts 8000 16000] [--tokens 120]
        AR and TokenSwift (paper sampling settings, seed 0) after a prompt of each length cut from --text:
        tokens/s over the methods' own compute, and per iteration the draft and verification times, the
        tree size and the accepted tokens. Where long-context verification on CPU spends its time.

    python -m tokenswift.bench suffix-bound [--penalty 1.2] [--context 1024] [--tokens 1000] [--row-costs 1:1,3:1.07]
        Tokens per iteration that suffix-match drafts alone could give, were every verified row free:
        drafts of up to 1..16 tokens replayed over our own greedy output (an upper bound for that source); and
        the bound for any drafter that works from the text, told which earlier occurrence to follow; with the
        host's row costs, the tokens per step that would give verifying exactly what is accepted.

    python -m tokenswift.bench draft-hits [--context 1024] [--tokens 1000]
        How often the suffix match's and the datastore's first guess is the next token along our own AR
        continuation (greedy, greedy + penalty 1.2, the paper's sampling; seed 0), and how often the
        datastore is right where the suffix match is not.

    python -m tokenswift.bench rows [--context 1024] [--rows 1 2 4 9 12] [--repeats 60]
        One lean forward (and the logits) of each number of new tokens over a held-out prompt's cache, split into
        attention, weight matrices, logits and the rest: what a verified row costs. See rows.py.

    python -m tokenswift.bench parts [--row greedy] [--context 1024] [--tokens 1000] [--repeats 2] [--detail]
        Our AR's steps and TokenSwift auto's iterations in real generations, split into the forward, the logits and
        the Python around them (drafting and its parts, verification inputs, the walk, the decision, bookkeeping):
        what a drafted iteration costs beyond its rows, in AR steps. See parts.py.

    python -m tokenswift.bench bonus-head [--train-tokens 240000] [--epochs 3] [--penalty 1.0] [--tokens 1000]
        Trains a probe head that sees the token it follows (Hydra / EAGLE style) on the frozen model, then counts
        along our AR continuation of a held-out prompt how often its first guess is right where the suffix match
        and the datastore are not: what such heads could add. See bonus_head.py.

    python -m tokenswift.bench speed [--contexts 1024 16000] [--tokens 1000] [--repeats 3] [--auto-tree auto]
        Our AR, TokenSwift (auto tree, paper tree) and HF generate (bf16, fp32, prompt lookup) on held-out corpus
        prompts, greedy / greedy+penalty / paper sampling, 1 thread: tok/s, ratios, an ids-equal check;
        writes runs/bench-speed/{results.json,table.md,speed.png}. See speed.py.

    python -m tokenswift.bench cpu-kind [--out-dir runs/cpu-kind] [--variants native avx2] [--no-smollm2]
        Every `bench speed` and `bench rows` run the README's speed table asks of this kind of CPU (the default model
        at 1K and 16K under each kernel variant, SmolLM2-135M at 1K beside HF and at 6K, SmolLM2's rows under each
        variant alternated), each in its own process, resumable; writes summary.md in the README's columns. About an
        hour on 2 vCPUs. See cpu_kind.py.

One module per command (ar_vs_hf, resident, context, drafts, rows, parts, bonus_head, speed, cpu_kind), the command line in
cli.py; `bench speed`'s conditions, prompts and report (table and chart, apart from the runs) in conditions.py,
prompts.py and report.py. A process's memory readers live in tokenswift/memory.py, outside the benchmarks.
"""
