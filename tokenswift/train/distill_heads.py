"""Heads by self-distillation from cached hidden states: fast enough for a 49,152-token model on a 2-vCPU CPU.

The heads read only the last decoder layer's output h0 at a position, so once the frozen model has run over the
training text (once: its hidden states are cached as bfloat16), training them is a small MLP problem over
independent positions. What made the plain trainer (`tokenswift.train.heads`) cost about 50 s a step for
SmolLM2-135M is gone: no forward of the frozen model per step, and the LM head restricted to a *drafting
vocabulary* (FR-Spec, arXiv 2502.14856: the ids that make up most of the model's own text), sized by measured
coverage and shipped with the heads, since the engine's drafts range over the same ids.

The text is the model's own continuations (`tokenswift.train.selfgen --save-ids`: greedy, greedy with the
penalty, the paper's sampling; book pages and general prompts), so a head learns what the model will say,
which is what verification accepts. Head i at position t learns the token at t+2+i of that text. With a root
input (the default; `--no-root-input`: the official heads alone) the heads also read the token at t+1, the root
the engine's next tree starts from (tokenswift/heads.py).

    python -m tokenswift train-heads --model smollm2-135m --selfgen runs/selfgen-* --out runs/heads-smollm2

Prints the time each phase took; writes heads.safetensors (official key layout plus the drafting vocabulary,
`tokenswift.draft_vocab`), a JSONL log and card.json (per head top-1 / top-3 on held-out own text, per mode,
and the accepted tokens a chain of top-1 drafts would give).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..heads import DRAFT_VOCAB_KEY, Heads
from .head_training import last_layer_hidden, lr_at, optimizer_step

HELD_OUT_EVERY = 16  # every 16th generated row is held out for validation


@dataclass
class DistillSettings:
    num_heads: int = 3
    coverage: float = 0.95  # the drafting vocabulary covers this share of the training text's tokens
    max_vocab: int = 16384
    vocab_multiple: int = 256
    batch_positions: int = 2048
    steps: int = 1500
    lr: float = 5e-3
    warmup: int = 50
    weight_decay: float = 0.1
    minutes: float = 0.0  # wall-clock budget for the optimisation (0: none)
    threads: int = 0
    seed: int = 0
    root_input: bool = True  # the heads also read the root token (tokenswift.heads, ROOT_INPUT_KEY)


@dataclass
class Row:
    ids: torch.Tensor  # (T,) prompt and continuation, no padding
    start: int  # index of the first generated token
    mode: str
    source: str  # the batch file it came from, "<folder>/<file>"


def load_rows(dirs: list[str]) -> list[Row]:
    """Every row of every selfgen batch file (batchNNN.pt) under the given folders, left padding removed."""
    rows: list[Row] = []
    for d in dirs:
        files = sorted(Path(d).rglob("batch*.pt"))
        if not files:
            raise ValueError(f"no selfgen batch files (batchNNN.pt) under {d}: run tokenswift.train.selfgen --save-ids")
        for file in files:
            saved = torch.load(file, weights_only=True)
            width = int(saved["prompt_tokens"])
            pads = saved.get("left_pad")
            for r, ids in enumerate(saved["ids"]):
                pad = int(pads[r]) if pads is not None else 0
                rows.append(Row(ids[pad:].clone(), width - pad, str(saved.get("mode", "?")),
                                f"{file.parent.name}/{file.stem}"))
    return rows


@dataclass
class Features:
    hidden: torch.Tensor  # (N, H) bfloat16: h0 at position t
    labels: torch.Tensor  # (N, K) int64: the token at t+2+i, -1 past the row's end
    row: torch.Tensor  # (N,) index of the row the position came from


def compute_features(model, rows: list[Row], num_heads: int, progress=None) -> Features:
    """h0 at every position t from the last prompt token on (whose t+2+i lie in the continuation)."""
    hidden, labels, owner = [], [], []
    groups: dict[tuple[int, int], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.ids.numel(), r.start), []).append(i)
    for (length, start), members in groups.items():
        for b in range(0, len(members), 8):
            chunk = members[b : b + 8]
            ids = torch.stack([rows[i].ids for i in chunk])  # (B, T)
            h = last_layer_hidden(model, ids, bf16=True)[:, start - 1 : length - 2]  # (B, P, H): t = start-1 .. T-3
            positions = torch.arange(start - 1, length - 2)
            for j, i in enumerate(chunk):
                targets = torch.full((positions.numel(), num_heads), -1, dtype=torch.long)
                for k in range(num_heads):
                    at = positions + 2 + k
                    ok = at < length
                    targets[ok, k] = rows[i].ids[at[ok]]
                hidden.append(h[j].to(torch.bfloat16))
                labels.append(targets)
                owner.append(torch.full((positions.numel(),), i, dtype=torch.long))
            if progress is not None:
                progress(len(chunk))
    return Features(torch.cat(hidden), torch.cat(labels), torch.cat(owner))


def cached_features(model, rows: list[Row], num_heads: int, folder: Path) -> Features:
    """compute_features per batch file, each cached in `folder` (a run that adds batch files computes only theirs)."""
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    by_source: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_source.setdefault(r.source, []).append(i)
    parts = []
    bar = tqdm(total=len(rows), desc="hidden states (cached per batch file)")
    for source, members in by_source.items():
        path = folder / (source.replace("/", "--") + f"-{num_heads}.pt")
        if path.exists():
            saved = torch.load(path, weights_only=True)
            part = Features(saved["hidden"], saved["labels"], saved["row"])
        else:
            part = compute_features(model, [rows[i] for i in members], num_heads)
            torch.save({"hidden": part.hidden, "labels": part.labels, "row": part.row}, path)
        part.row = torch.tensor(members)[part.row]  # local row numbers -> indices into `rows`
        parts.append(part)
        bar.update(len(members))
    bar.close()
    return Features(torch.cat([p.hidden for p in parts]), torch.cat([p.labels for p in parts]),
                    torch.cat([p.row for p in parts]))


def root_tokens(rows: list[Row], owner: torch.Tensor) -> torch.Tensor:
    """(N,) the token at t+1 for every cached position t: its tree's root. A row's positions are cached together
    and in order (t = start-1 .. T-3, `compute_features`), so its roots are ids[start .. T-2]."""
    roots = []
    runs, counts = torch.unique_consecutive(owner, return_counts=True)
    for i, n in zip(runs.tolist(), counts.tolist()):
        r = rows[i]
        part = r.ids[r.start : r.ids.numel() - 1]
        if part.numel() != n:
            raise ValueError(f"cached features of {r.source} do not match its rows: delete the features folder")
        roots.append(part)
    return torch.cat(roots) if roots else torch.zeros(0, dtype=torch.long)


def drafting_vocabulary(labels: torch.Tensor, vocab_size: int, s: DistillSettings,
                        held_out: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The training text's ids by decreasing count, as few as cover `s.coverage` of the held-out text's tokens
    (of the training text's where none is given; a multiple of `s.vocab_multiple`, at most `s.max_vocab`), and
    the held-out coverage of a few sizes. Coverage is measured on held-out text: on the text it was counted on,
    every id that occurred is covered, which flatters small vocabularies."""
    counts = torch.bincount(labels[:, 0][labels[:, 0] >= 0], minlength=vocab_size).double()
    order = torch.argsort(counts, descending=True, stable=True)
    check = labels if held_out is None else held_out
    check = check[:, 0][check[:, 0] >= 0]
    rank = torch.empty(vocab_size, dtype=torch.long)
    rank[order] = torch.arange(vocab_size)
    covered = torch.bincount(rank[check], minlength=vocab_size).cumsum(0).double() / max(1, check.numel())
    needed = int(torch.searchsorted(covered, torch.tensor(s.coverage, dtype=torch.float64))) + 1
    size = min(s.max_vocab, vocab_size, s.vocab_multiple * math.ceil(needed / s.vocab_multiple))
    table = {n: float(covered[min(n, vocab_size) - 1]) for n in (1024, 2048, 4096, 8192, 16384, size)}
    return order[:size].clone(), table


class RootEmbeddings:
    """The embedding rows of the cached positions' roots, looked up per batch: (positions,) -> (M, H) float32, or
    None for heads without a root input (tokens None)."""

    def __init__(self, table: torch.Tensor, tokens: torch.Tensor | None) -> None:
        self.table, self.tokens = table, tokens

    def __call__(self, idx: torch.Tensor) -> torch.Tensor | None:
        return None if self.tokens is None else self.table[self.tokens[idx]].float()


def head_logits(heads: Heads, lm_rows: torch.Tensor, h0: torch.Tensor, root_embedding: torch.Tensor | None = None
                ) -> torch.Tensor:
    """h0 (M, H) float32, root_embedding (M, H) or None -> (K, M, V') logits over the drafting vocabulary."""
    outs = heads(h0, root_embedding)  # (K, M, H)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.linear(outs, lm_rows).float()


@torch.no_grad()
def evaluate(heads: Heads, lm_rows: torch.Tensor, feats: Features, select: torch.Tensor, to_local: torch.Tensor,
             vocab: torch.Tensor, roots: RootEmbeddings) -> dict:
    """Per head top-1 / top-3 over the selected positions (an id outside the drafting vocabulary is a miss), and
    the mean tokens a chain of top-1 drafts adds per iteration when the base token is right (consecutive hits)."""
    K = heads.num_heads
    hit1 = torch.zeros(K)
    hit3 = torch.zeros(K)
    total = torch.zeros(K)
    chain = 0.0
    count = 0
    for b in range(0, select.numel(), 4096):
        idx = select[b : b + 4096]
        logits = head_logits(heads, lm_rows, feats.hidden[idx].float(), roots(idx))  # (K, M, V')
        top3 = vocab[torch.topk(logits, 3, dim=-1).indices]  # (K, M, 3) token ids
        labels = feats.labels[idx].T  # (K, M)
        valid = labels >= 0
        first = (top3[..., 0] == labels) & valid
        hit1 += first.sum(1)
        hit3 += ((top3 == labels[..., None]).any(-1) & valid).sum(1)
        total += valid.sum(1)
        full = valid.all(0)
        run = torch.cumprod(first.long(), dim=0).sum(0)  # consecutive top-1 hits from head 0
        chain += float(run[full].sum())
        count += int(full.sum())
    return {"top1": (hit1 / total.clamp(min=1)).tolist(), "top3": (hit3 / total.clamp(min=1)).tolist(),
            "chain": chain / max(1, count), "positions": int(total[0])}


def distill_heads(model_dir: str, selfgen_dirs: list[str], out_dir: str, s: DistillSettings) -> Heads:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    try:
        from ..builtin import resolve_model
    except ImportError:  # pragma: no cover - built-in names need tokenswift.builtin
        resolve_model = str

    t_start = time.time()
    if s.threads:
        torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(model_dir), dtype=torch.bfloat16).eval()
    model.requires_grad_(False)
    rows = load_rows(selfgen_dirs)
    feats = cached_features(model, rows, s.num_heads, out / "features")
    t_features = time.time() - t_start
    print(f"hidden states: {feats.hidden.shape[0]:,} positions from {len(rows)} rows in {t_features / 60:.1f} min")

    held_out = feats.row % HELD_OUT_EVERY == 0
    train_idx = torch.nonzero(~held_out).squeeze(1)
    val_idx = torch.nonzero(held_out).squeeze(1)
    vocab_size = model.lm_head.weight.shape[0]
    vocab, table = drafting_vocabulary(feats.labels[train_idx], vocab_size, s, feats.labels[val_idx])
    print("drafting vocabulary, share of the held-out text's tokens it covers: "
          + ", ".join(f"{n:,} ids {c:.3f}" for n, c in table.items()) + f" -> {vocab.numel():,} ids")
    to_local = torch.full((vocab_size,), -1, dtype=torch.long)
    to_local[vocab] = torch.arange(vocab.numel())
    lm_rows = model.lm_head.weight.detach()[vocab].to(torch.bfloat16)  # (V', H)
    local_labels = torch.where(feats.labels >= 0, to_local[feats.labels.clamp(min=0)], torch.full_like(feats.labels, -1))

    heads = Heads.init(model, s.num_heads).float().train()
    if s.root_input:
        heads.add_root_input()
    roots = RootEmbeddings(model.get_input_embeddings().weight.detach(),
                           root_tokens(rows, feats.row) if s.root_input else None)
    opt = torch.optim.AdamW(heads.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.95))
    log = (out / "heads_log.jsonl").open("a")
    gen = torch.Generator().manual_seed(s.seed)
    t_train = time.time()
    bar = tqdm(total=s.steps, desc="train heads")
    step = 0
    while step < s.steps:
        elapsed = time.time() - t_train
        if s.minutes and elapsed > s.minutes * 60:
            print(f"time budget reached at step {step}")
            break
        lr = lr_at(s, step, elapsed)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = train_idx[torch.randint(0, train_idx.numel(), (s.batch_positions,), generator=gen)]
        logits = head_logits(heads, lm_rows, feats.hidden[idx].float(), roots(idx))  # (K, M, V')
        target = local_labels[idx].T  # (K, M), -1: outside the vocabulary or past the row
        losses = [F.cross_entropy(logits[k], target[k], ignore_index=-1) for k in range(s.num_heads)]
        loss = sum(losses) / s.num_heads
        optimizer_step(opt, heads, loss)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        log.write(json.dumps({"kind": "train", "step": step, "loss": loss.item(),
                              "per_head": [x.item() for x in losses], "lr": lr}) + "\n")
        if step % 250 == 0:
            heads.eval()
            acc = evaluate(heads, lm_rows, feats, val_idx, to_local, vocab, roots)
            heads.train()
            log.write(json.dumps({"kind": "val", "step": step, **acc}) + "\n")
            bar.write(f"step {step}: top1 " + " ".join(f"{a:.3f}" for a in acc["top1"])
                      + f", top3 " + " ".join(f"{a:.3f}" for a in acc["top3"]) + f", chain {acc['chain']:.2f}")
        log.flush()
    bar.close()
    t_train = time.time() - t_train
    heads = heads.to(torch.bfloat16).float().eval()  # shipped in bfloat16 (half the bytes; the engine's panels read
    # bfloat16-exact weights at bfloat16's cost): evaluate the rounded weights
    card = {"model": model_dir, "positions": int(feats.hidden.shape[0]), "rows": len(rows),
            "draft_vocab": int(vocab.numel()), "coverage": table, "steps": step, "root_input": s.root_input,
            "minutes": {"hidden_states": t_features / 60, "training": t_train / 60}}
    card["held_out"] = {"all": evaluate(heads, lm_rows, feats, val_idx, to_local, vocab, roots)}
    for mode in sorted({r.mode for r in rows}):
        members = torch.tensor([i for i, r in enumerate(rows) if r.mode == mode])
        mask = held_out & torch.isin(feats.row, members)
        card["held_out"][mode] = evaluate(heads, lm_rows, feats, torch.nonzero(mask).squeeze(1), to_local, vocab, roots)
    heads.draft_vocab = vocab
    path = heads.to(torch.bfloat16).save(out / "heads.safetensors")
    total = time.time() - t_start
    card["minutes"]["total"] = total / 60
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    for mode, acc in card["held_out"].items():
        print(f"held out ({mode}): top1 " + " ".join(f"{a:.3f}" for a in acc["top1"]) + ", top3 "
              + " ".join(f"{a:.3f}" for a in acc["top3"]) + f", chain of top-1 drafts {acc['chain']:.2f} tokens")
    print(f"saved heads to {path}; train-heads took {total / 60:.1f} min "
          f"(hidden states {t_features / 60:.1f}, training {t_train / 60:.1f})")
    return heads


__all__ = ["DistillSettings", "distill_heads", "DRAFT_VOCAB_KEY"]
