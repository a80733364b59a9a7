"""How much a head that sees the token it follows (EAGLE's and Hydra's idea) could add to the drafts auto has.

    python -m tokenswift.bench bonus-head [--train-tokens 240000] [--epochs 3] [--penalty 1.0] [--tokens 1000]

The shipped heads are Medusa-style (the paper's): head i reads the hidden state h_t whose logits gave the
bonus token x_{t+1} and guesses x_{t+2+i} without knowing x_{t+1} (top-1 about 0.12 on this model). Hydra
(arXiv 2402.05109) and EAGLE (arXiv 2401.15077) condition each draft on the tokens before it. This probe trains
such a head for two depths on the frozen model, then asks along our own AR continuation of a held-out prompt
how often its first guess for x_{t+2} is right, beside the drafts auto already has there: the suffix match's and
the datastore's first guesses, given the text up to x_{t+1}. What matters is the share of positions where only
the new head is right: that is all it could add at depth 1, before paying for its rows and its own compute.

The probe (not shipped): per depth j, h <- h + W_out(SiLU(W_in [rmsnorm(h); E[x_j]])), then the model's final
norm and its tied LM head (frozen), trained with cross-entropy to the model's own argmax at that position
(self-distillation) on teacher-forced windows of the Austen train split. Drafts only: nothing here can change
what any generation produces.
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WINDOW = 1024  # teacher-forced training windows (the model's trained context)
BATCH = 512
LEARNING_RATE = 2e-3
DEPTHS = 2


class BonusHead(nn.Module):
    """Residual MLP blocks over the model's hidden state, one per depth, each reading the token it follows."""

    def __init__(self, embed: torch.Tensor, final_norm: torch.Tensor, eps: float, depths: int = DEPTHS) -> None:
        super().__init__()
        d = embed.shape[1]
        self.embed, self.final_norm, self.eps = embed, final_norm, eps  # frozen (plain tensors, not parameters)
        self.inp = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(depths))
        self.out = nn.ModuleList(nn.Linear(d, d) for _ in range(depths))
        for layer in self.out:  # each block starts as the identity: the model's own head on h
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """h (B, H) the hidden state before the final norm; tokens (B, k) the tokens each depth follows
        -> k logits (B, V): depth j guesses the token after tokens[:, j]."""
        out = []
        for j in range(tokens.shape[1]):
            z = torch.cat([F.rms_norm(h, (h.shape[-1],), eps=self.eps), self.embed[tokens[:, j]]], dim=-1)
            h = h + self.out[j](F.silu(self.inp[j](z)))
            out.append(F.rms_norm(h, (h.shape[-1],), self.final_norm, self.eps) @ self.embed.T)
        return out


@torch.inference_mode()
def hidden_states(gen, ids: list[int], window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced over windows of `window` tokens: (n, H) float32 hidden states before the final norm and
    (n,) the model's argmax at each position (no penalty)."""
    from ..run_state import PREFILL_CHUNK
    from ..kv_cache import KVCache

    a, lean = gen.adapter, gen.adapter.lean
    hs, picks = [], []
    for w0 in range(0, len(ids), window):
        part = ids[w0 : w0 + window]
        cache = KVCache(a.layer_devices, len(part), a.num_kv_heads, a.head_dim, a.cache_dtype)
        for s in range(0, len(part), PREFILL_CHUNK):
            chunk = torch.tensor(part[s : s + PREFILL_CHUNK])
            t = chunk.shape[0]
            h, _ = lean.forward(chunk, torch.arange(s, s + t), cache, s, torch.ones(t, t, dtype=torch.bool).tril())
            hs.append(h.float())
            picks.append(lean.logits(h).argmax(-1))
    return torch.cat(hs), torch.cat(picks)


def train_head(gen, ids: list[int], epochs: int, seed: int, log=None) -> tuple[BonusHead, dict]:
    """Train a BonusHead on teacher-forced windows of `ids`; returns it and {seconds, steps, last loss}."""
    lean = gen.adapter.lean
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))  # stdout carries the JSON result
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    hidden, picks = hidden_states(gen, ids, WINDOW)
    tokens = torch.tensor(ids)
    starts = torch.arange(len(ids) - DEPTHS)
    starts = starts[(starts % WINDOW) < WINDOW - DEPTHS]  # every depth's target inside the same window
    head = BonusHead(lean.embed.float(), lean.norm.float(), lean.shape.eps)
    steps = max(1, epochs * (len(starts) // BATCH))
    opt = torch.optim.AdamW(head.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, LEARNING_RATE, total_steps=steps, pct_start=0.05)
    done, loss = 0, torch.tensor(0.0)
    while done < steps:
        order = starts[torch.randperm(len(starts))]
        for i in range(0, max(1, len(order) - BATCH + 1), BATCH):
            p = order[i : i + BATCH]
            follow = torch.stack([tokens[p + 1 + j] for j in range(DEPTHS)], dim=1)  # (B, depths)
            logits = head(hidden[p], follow)
            loss = sum(F.cross_entropy(lg, picks[p + 1 + j]) for j, lg in enumerate(logits))
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            done += 1
            if done % 200 == 0:
                log(f"step {done}/{steps} loss {loss.item():.3f}")
            if done >= steps:
                break
    return head.eval(), {"seconds": round(time.perf_counter() - t0, 1), "steps": steps,
                         "last_loss": round(loss.item(), 3), "train_tokens": len(ids)}


@torch.no_grad()
def coverage(gen, head: BonusHead, prompt: list[int], out: list[int]) -> dict:
    """Along prompt + out (our AR's continuation): at each output position whose token x_{t+2} follows a known
    bonus x_{t+1}, the share where each first guess is right: the head's (depth 1, and depths 1 and 2), the
    suffix match's, the datastore's, either of those two, any of the three, and the head alone."""
    from ..kinds import Source
    from ..suffix import SuffixIndex

    seq = prompt + out
    hidden, _ = hidden_states(gen, seq, len(seq))
    index = SuffixIndex()
    index.extend(seq[: len(prompt) + 1])
    store = gen.datastore
    hits = dict.fromkeys((Source.HEAD, "head_two_deep", Source.SUFFIX, Source.DATASTORE, "suffix_or_datastore", "any", "head_only"), 0)
    n = 0
    for t in range(len(prompt) - 1, len(seq) - 3):  # the text known: seq[: t + 2]; the target seq[t + 2]
        index.extend(seq[len(index.tokens) : t + 2])
        first, second = (lg.argmax(-1).item() for lg in head(hidden[t : t + 1], torch.tensor([[seq[t + 1], seq[t + 2]]])))
        target = seq[t + 2]
        cont = index.lookup(1)[1]
        found = store.lookup(seq[: t + 2])[1] if store is not None else ()
        by_text = bool(cont) and cont[0] == target
        by_store = bool(found) and found[0][0] == target
        by_head = first == target
        n += 1
        hits[Source.HEAD] += by_head
        hits["head_two_deep"] += by_head and second == seq[t + 3]
        hits[Source.SUFFIX] += by_text
        hits[Source.DATASTORE] += by_store
        hits["suffix_or_datastore"] += by_text or by_store
        hits["any"] += by_text or by_store or by_head
        hits["head_only"] += by_head and not (by_text or by_store)
    return {"positions": n, "top1": {str(k): round(v / max(1, n), 3) for k, v in hits.items()}}


def bonus_head(model: str, train_tokens: int, epochs: int, penalty: float, context: int, tokens: int,
               seed: int = 0) -> dict:
    from .prompts import held_out_prompts
    from ..generator import Generator
    from ..kinds import Method
    from ..settings import Settings
    from ..train.corpus import AUSTEN_SOURCES, load_corpus, resolve_corpus_dir

    gen = Generator.from_pretrained(model)
    if gen.adapter.lean is None:
        raise SystemExit("this model does not run through the lean step (see tokenswift/lean.py)")
    corpus = load_corpus(resolve_corpus_dir(None))
    ids: list[int] = []
    for name in AUSTEN_SOURCES:  # the same share of each novel's train split
        ids += gen.encode(corpus[name].train)[: train_tokens // len(AUSTEN_SOURCES)]
    head, training = train_head(gen, ids, epochs, seed)
    prompt = held_out_prompts(gen.encode, [context])[context]["ids"]
    out = gen.generate(prompt, Settings(temperature=0.0, penalty=penalty), tokens, method=Method.AR).token_ids
    return {"benchmark": "bonus-head", "model": model, "penalty": penalty, "context": len(prompt),
            "new_tokens": tokens, "training": training, **coverage(gen, head, prompt, out),
            "reading": "top1.head_only: positions where only the new head's first guess is the next token, the most "
                       "it could add at depth 1 to the suffix match and the datastore"}
