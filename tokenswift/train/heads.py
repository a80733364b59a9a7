"""Train TokenSwift's multi-token heads on a frozen base model (any supported HF causal LM).

Head i learns, with cross-entropy, the token at offset +2+i from each position (the base LM head predicts
+1). Only the heads train; the model and its LM head stay frozen. This is how a user gives heads to their
own model:

    python -m tokenswift train-heads --model DIR --corpus DIR --out RUN_DIR [--save-model OUT_DIR]
    python -m tokenswift train-heads --model DIR --text-file book.txt --out RUN_DIR

Text is split 95/5 by lines into train/validation (per file, as the shared corpus README says). Progress
bar, fixed seeds, checkpoints every few minutes with automatic resume, a JSONL log of train loss and
validation per-head top-1/top-3 accuracy.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..heads import Heads, save_with_model
from .checkpoint import load_state, save_state
from .corpus import ALL_SOURCES, AUSTEN_SOURCES, load_corpus, split_text
from .head_training import last_layer_hidden, lr_at, optimizer_step


@dataclass
class HeadsTrainSettings:
    num_heads: int = field(default=3, metadata={"help": "number of extra heads (paper: 3)"})
    context: int = field(default=512, metadata={"help": "tokens per training window"})
    batch_size: int = field(default=8, metadata={"help": "windows per step"})
    steps: int = field(default=600, metadata={"help": "optimizer steps"})
    lr: float = field(default=5e-3, metadata={"help": "peak learning rate (paper: 5e-3)"})
    warmup: int = field(default=50, metadata={"help": "linear warm-up steps (paper: 50)"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (paper: 0.1)"})
    austen_weight: float = field(default=0.75, metadata={"help": "shared corpus only: share of windows from Austen"})
    val_windows: int = field(default=48, metadata={"help": "validation windows for accuracy"})
    eval_every: int = field(default=100, metadata={"help": "steps between validations"})
    checkpoint_minutes: float = field(default=5.0, metadata={"help": "minutes between checkpoints"})
    minutes: float = field(default=0.0, metadata={"help": "wall-clock budget in minutes (0: none)"})
    distill: float = field(default=0.0, metadata={"help": "weight of the KL term to the base model's own distribution "
                                                           "at the target position (self-distillation); 0: labels only"})
    bf16: bool = field(default=True, metadata={"help": "bf16 autocast for the frozen base model"})
    init_heads: str = field(default="", metadata={"help": "warm start: heads to start from (a safetensors file or a "
                                                          "checkpoint directory with heads); empty: fresh identity heads"})
    seed: int = field(default=0, metadata={"help": "random seed"})


def load_texts(corpus: str | None, text_file: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(train texts, validation texts) keyed by source name."""
    if (corpus is None) == (text_file is None):
        raise ValueError("give exactly one of --corpus DIR or --text-file FILE")
    if text_file is not None:
        train, val = split_text(Path(text_file).read_text(encoding="utf-8"))
        return {"text": train}, {"text": val}
    directory = Path(corpus)
    if all((directory / f"{name}.txt").exists() for name in ALL_SOURCES):
        splits = load_corpus(directory)
        return {k: s.train for k, s in splits.items()}, {k: s.val for k, s in splits.items()}
    files = sorted(directory.glob("*.txt"))
    if not files:
        raise ValueError(f"no .txt files in {directory}")
    pairs = {f.stem: split_text(f.read_text(encoding="utf-8")) for f in files}
    return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}


class Windows:
    """Random training windows; for the shared corpus, Austen with probability `austen_weight`."""

    def __init__(self, streams: dict[str, torch.Tensor], span: int, austen_weight: float, seed: int) -> None:
        austen = [s for k, s in streams.items() if k in AUSTEN_SOURCES]
        other = [s for k, s in streams.items() if k not in AUSTEN_SOURCES]
        self.groups = [torch.cat(g) for g in (austen, other) if g]
        self.weights = [austen_weight, 1 - austen_weight] if austen and other else [1.0]
        self.span = span
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self, batch: int) -> torch.Tensor:
        rows = []
        for _ in range(batch):
            g = self.groups[int(torch.multinomial(torch.tensor(self.weights), 1, generator=self.gen))]
            start = int(torch.randint(0, g.numel() - self.span, (1,), generator=self.gen))
            rows.append(g[start : start + self.span])
        return torch.stack(rows)  # (B, span)


def head_losses(model, heads: Heads, h0: torch.Tensor, ids: torch.Tensor, distill: float = 0.0) -> list[torch.Tensor]:
    """Per head: cross-entropy against the token at offset +2+i, mixed (weight `distill`) with the KL
    from the base model's own distribution for that token (its logits one position earlier, given the
    true prefix) to the head's. h0: (B, T, H); ids: (B, T)."""
    outs = heads(h0)  # (K, B, T, H)
    teacher = None
    if distill > 0:
        with torch.no_grad():
            teacher = F.log_softmax(model.lm_head(model.model.norm(h0)).float(), dim=-1)  # (B, T, V)
    losses = []
    for i in range(heads.num_heads):
        shift = 2 + i
        logits = model.lm_head(outs[i][:, :-shift].to(model.lm_head.weight.dtype)).float()  # (B, T-shift, V)
        loss = F.cross_entropy(logits.transpose(1, 2), ids[:, shift:])
        if teacher is not None:
            target = teacher[:, shift - 1 : -1]  # the base model's distribution of token t+2+i, (B, T-shift, V)
            kl = F.kl_div(F.log_softmax(logits, dim=-1), target, log_target=True, reduction="none").sum(-1).mean()
            loss = (1 - distill) * loss + distill * kl
        losses.append(loss)
    return losses


@torch.no_grad()
def head_accuracy(model, heads: Heads, windows: list[torch.Tensor], bf16: bool) -> list[dict[str, float]]:
    """Per head: top-1 and top-3 accuracy of predicting offset +2+i, over the validation windows."""
    hits1 = [0] * heads.num_heads
    hits3 = [0] * heads.num_heads
    total = [0] * heads.num_heads
    for w in windows:
        ids = w[None]
        outs = heads(last_layer_hidden(model, ids, bf16))
        for i in range(heads.num_heads):
            shift = 2 + i
            logits = model.lm_head(outs[i][0, :-shift].to(model.lm_head.weight.dtype)).float()
            target = ids[0, shift:]
            top3 = torch.topk(logits, 3, dim=-1).indices
            hits1[i] += int((top3[:, 0] == target).sum())
            hits3[i] += int((top3 == target[:, None]).any(-1).sum())
            total[i] += target.numel()
    return [{"head": i, "top1": hits1[i] / max(1, total[i]), "top3": hits3[i] / max(1, total[i])}
            for i in range(heads.num_heads)]


def train_heads(model_dir: str, out_dir: str, s: HeadsTrainSettings, corpus: str | None = None,
                text_file: str | None = None, save_model: str | None = None, device: str | None = None) -> Heads:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(s.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=False)
    if device:
        model = model.to(device)
    model.eval().requires_grad_(False)
    dev = model.lm_head.weight.device
    train_texts, val_texts = load_texts(corpus, text_file)
    streams = {k: torch.tensor(tokenizer.encode(t, add_special_tokens=False)) for k, t in train_texts.items()}
    sampler = Windows(streams, s.context, s.austen_weight, s.seed)
    val_ids = torch.cat([torch.tensor(tokenizer.encode(t, add_special_tokens=False)) for t in val_texts.values()])
    val_windows = [val_ids[i : i + s.context].to(dev) for i in range(0, val_ids.numel() - s.context, s.context)]
    if s.val_windows and len(val_windows) > s.val_windows:
        stride = len(val_windows) / s.val_windows
        val_windows = [val_windows[int(i * stride)] for i in range(s.val_windows)]

    if s.init_heads:
        heads = Heads.load(model, s.init_heads).float().train()
        if heads.root_input is not None:  # this path neither feeds nor trains it: U would no longer fit the blocks
            raise ValueError(f"--init-heads {s.init_heads}: heads with a root input train with --selfgen only")
        if heads.num_heads != s.num_heads:
            raise ValueError(f"--init-heads has {heads.num_heads} heads, --num-heads is {s.num_heads}")
        print(f"warm start from the heads in {s.init_heads}")
    else:
        heads = Heads.init(model, s.num_heads).float().train()
    opt = torch.optim.AdamW(heads.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.95))
    ckpt = out / "heads_checkpoint.pt"
    step, elapsed_before = 0, 0.0
    if ckpt.exists():
        state = load_state(ckpt)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        sampler.gen.set_state(state["sampler"])
        torch.set_rng_state(state["torch_rng"])
        step = state["step"]
        elapsed_before = state.get("elapsed_s", 0.0)
        print(f"resumed from {ckpt} at step {step}")
    (out / "settings.json").write_text(json.dumps(dataclasses.asdict(s), indent=2))
    log = (out / "heads_log.jsonl").open("a")
    start, last_ckpt = time.time(), time.time()
    bar = tqdm(total=s.steps, initial=step, desc="train-heads")
    out_of_time = False
    while step < s.steps and not out_of_time:
        lr = lr_at(s, step, elapsed_before + time.time() - start)
        for group in opt.param_groups:
            group["lr"] = lr
        ids = sampler.sample(s.batch_size).to(dev)
        h0 = last_layer_hidden(model, ids, s.bf16)
        losses = head_losses(model, heads, h0, ids, s.distill)
        loss = sum(losses) / len(losses)
        optimizer_step(opt, heads, loss)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", per_head=" ".join(f"{x.item():.2f}" for x in losses))
        log.write(json.dumps({"kind": "train", "step": step, "loss": loss.item(),
                              "per_head": [x.item() for x in losses], "lr": lr}) + "\n")
        out_of_time = bool(s.minutes) and elapsed_before + time.time() - start > s.minutes * 60
        last = step == s.steps or out_of_time
        if step % s.eval_every == 0 or last:
            heads.eval()
            acc = head_accuracy(model, heads, val_windows, s.bf16)
            heads.train()
            log.write(json.dumps({"kind": "val", "step": step, "accuracy": acc}) + "\n")
            bar.write(f"step {step}: " + ", ".join(f"head {a['head']} top1 {a['top1']:.3f} top3 {a['top3']:.3f}" for a in acc))
        log.flush()
        if time.time() - last_ckpt > s.checkpoint_minutes * 60 or last:
            save_state({"heads": heads.state_dict(), "optimizer": opt.state_dict(), "sampler": sampler.gen.get_state(),
                        "torch_rng": torch.get_rng_state(), "step": step,
                        "elapsed_s": elapsed_before + time.time() - start}, ckpt)
            last_ckpt = time.time()
    bar.close()
    if out_of_time:
        print(f"time budget reached at step {step}")
    heads.eval()
    path = heads.save(out / "heads.safetensors")
    print(f"saved heads to {path}")
    if save_model:
        source_dtype = AutoModelForCausalLM.from_pretrained(model_dir).dtype
        save_with_model(model.to(source_dtype), heads, tokenizer, save_model)
        print(f"saved model + heads (official layout) to {save_model}")
    return heads


def add_train_heads_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-heads", help="train TokenSwift heads on a frozen model",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="model directory (HF format)")
    p.add_argument("--corpus", help="directory of .txt files (each split 95/5 by lines)")
    p.add_argument("--text-file", help="one UTF-8 text file (split 95/5 by lines)")
    p.add_argument("--out", required=True, help="run directory: log, checkpoint, heads.safetensors")
    p.add_argument("--save-model", help="also write model + tokenizer + heads in the official layout here")
    p.add_argument("--device", default=None, help="cpu or cuda (default: where the model loads)")
    p.add_argument("--selfgen", nargs="+", default=None,
                   help="self-distillation from the model's own text: folders written by tokenswift.train.selfgen "
                        "--save-ids (hidden states cached once, a drafting vocabulary by coverage; see "
                        "tokenswift.train.distill_heads). Then --corpus / --text-file are not used")
    p.add_argument("--coverage", type=float, default=0.95,
                   help="with --selfgen: the drafting vocabulary covers this share of the text's tokens")
    p.add_argument("--batch-positions", type=int, default=2048, help="with --selfgen: positions per step")
    p.add_argument("--root-input", action=argparse.BooleanOptionalAction, default=None,
                   help="with --selfgen (on by default there): the heads also read the token their tree starts from "
                        "(tokenswift.heads; --no-root-input: the official heads alone)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    for f in dataclasses.fields(HeadsTrainSettings):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            p.add_argument(flag, type=lambda x: x.lower() in ("1", "true", "yes"), default=f.default, help=f.metadata["help"])
        else:
            p.add_argument(flag, type=type(f.default), default=f.default, help=f.metadata["help"])
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.root_input and not args.selfgen:
        raise ValueError("--root-input trains with --selfgen only (the corpus path trains the official heads alone)")
    args.root_input = bool(args.selfgen) if args.root_input is None else args.root_input
    if args.selfgen:
        from .distill_heads import DistillSettings, distill_heads

        given = {f.name for f in dataclasses.fields(DistillSettings)}
        steps = args.steps if args.steps != HeadsTrainSettings.steps else DistillSettings.steps
        settings = DistillSettings(**{k: v for k, v in vars(args).items() if k in given and k != "steps"}, steps=steps)
        distill_heads(args.model, args.selfgen, args.out, settings)
        return 0
    names = {f.name for f in dataclasses.fields(HeadsTrainSettings)}
    settings = HeadsTrainSettings(**{k: v for k, v in vars(args).items() if k in names})
    train_heads(args.model, args.out, settings, args.corpus, args.text_file, args.save_model, args.device)
    return 0
