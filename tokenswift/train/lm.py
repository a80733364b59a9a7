"""Train the small Llama base language model on the Austen + KJV corpus (CPU, bf16 autocast).

Data: the train split of every source is tokenised once (cached in the run directory). Each source
stream is ``[<|endoftext|>] + ids(train text)`` and the six novels are concatenated into one Austen
stream. A training window of ``context + 1`` tokens is drawn from the Austen stream with probability
``austen_weight`` and from the KJV stream otherwise, at a uniformly random offset.

Schedule: linear warm-up over ``warmup_steps`` steps, then cosine decay to ``min_lr_ratio * lr`` over
the *progress* of the run, ``progress = max(elapsed / budget, step / max_steps)``. The elapsed
wall-clock time is stored in the checkpoint, so the schedule continues where it stopped on resume.

Validation: each validation text is encoded as ``[<|endoftext|>] + ids(text)`` and cut into
non-overlapping windows of ``context`` predicted tokens (consecutive windows share one token, the
input of the next window's first prediction), so every validation token is predicted exactly once.
Bits per character = total NLL (nats) / ln 2 / characters of the validation text.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from .checkpoint import load_state, save_state
from .corpus import AUSTEN_SOURCES, KJV_SOURCE, SourceSplit
from .tokenizer import ENDOFTEXT, load_tokenizer

CHECKPOINT_NAME = "checkpoint.pt"
TOKEN_CACHE_NAME = "train_tokens.pt"
LOG_NAME = "log.jsonl"
BEST_DIR_NAME = "best"


def _opt(default: Any, help_text: str) -> Any:
    """A dataclass field with a default and help text for the command line."""
    return field(default=default, metadata={"help": help_text})


@dataclass
class TrainSettings:
    """Model shape, optimisation and run-control settings for LM training."""

    # Model shape.
    hidden_size: int = _opt(384, "model width")
    num_layers: int = _opt(8, "transformer layers")
    num_heads: int = _opt(6, "query heads")
    num_kv_heads: int = _opt(2, "key/value heads (GQA)")
    head_dim: int = _opt(64, "dimension per head")
    intermediate_size: int = _opt(1024, "SwiGLU MLP width")
    rope_theta: float = _opt(100000.0, "RoPE base (large for long generations)")
    max_position_embeddings: int = _opt(32768, "config metadata only")
    attention_dropout: float = _opt(0.0, "attention dropout")
    # Data.
    context: int = _opt(1024, "training context in tokens")
    batch_size: int = _opt(8, "windows per step")
    austen_weight: float = _opt(0.75, "probability that a window is drawn from Austen (else KJV)")
    # Optimisation.
    lr: float = _opt(2e-3, "peak learning rate")
    min_lr_ratio: float = _opt(0.1, "final LR as a fraction of the peak")
    warmup_steps: int = _opt(100, "linear warm-up steps")
    weight_decay: float = _opt(0.1, "AdamW weight decay (matrices and embeddings only)")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.95, "AdamW beta2")
    grad_clip: float = _opt(1.0, "gradient-norm clip")
    bf16: bool = _opt(True, "bf16 autocast (fp32 master weights)")
    compile: bool = _opt(True, "torch.compile the transformer body for training (~25%% faster on CPU)")
    # Run control.
    minutes: float = _opt(70.0, "wall-clock budget in minutes (the LR schedule spans it)")
    max_steps: int = _opt(100000, "hard step limit (the LR schedule also ends here)")
    seed: int = _opt(1234, "random seed")
    threads: int = _opt(2, "torch CPU threads")
    log_every: int = _opt(10, "steps between train-loss log lines")
    eval_every: int = _opt(100, "steps between validation runs")
    eval_windows: int = _opt(24, "validation windows per group during training (0 = all); the end is full")
    checkpoint_minutes: float = _opt(5.0, "minutes between checkpoints")


# --------------------------------------------------------------------------- model


def model_config(s: TrainSettings, vocab_size: int, eot_id: int) -> LlamaConfig:
    """Build the ``LlamaConfig`` for the settings."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        max_position_embeddings=s.max_position_embeddings,
        rope_theta=s.rope_theta,
        tie_word_embeddings=True,
        attention_dropout=s.attention_dropout,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )


def build_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """Create a randomly initialised fp32 model (SDPA attention) with a fixed seed."""
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def count_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- data


def encode_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Encode without special tokens, through the backend (no max-length warnings)."""
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def _fingerprint(tokenizer_dir: Path, texts: dict[str, str]) -> str:
    """Hash of the tokenizer file and the train texts, to validate the token cache."""
    h = hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes())
    for name in sorted(texts):
        h.update(name.encode())
        h.update(texts[name].encode("utf-8"))
    return h.hexdigest()


def tokenize_streams(
    tokenizer: PreTrainedTokenizerBase, texts: dict[str, str], eot_id: int
) -> dict[str, torch.Tensor]:
    """Return ``{"austen": ids, "kjv": ids}`` (int32, 1-D), each document preceded by EOT."""
    def stream(names: tuple[str, ...]) -> torch.Tensor:
        ids: list[int] = []
        for name in names:
            ids.append(eot_id)
            ids.extend(encode_ids(tokenizer, texts[name]))
        return torch.tensor(ids, dtype=torch.int32)

    return {"austen": stream(AUSTEN_SOURCES), "kjv": stream((KJV_SOURCE,))}


def load_or_build_streams(
    run_dir: Path, tokenizer_dir: Path, tokenizer: PreTrainedTokenizerBase,
    texts: dict[str, str], eot_id: int,
) -> dict[str, torch.Tensor]:
    """Load the cached train token streams from the run dir, or tokenise and cache them."""
    path = run_dir / TOKEN_CACHE_NAME
    fp = _fingerprint(tokenizer_dir, texts)
    if path.exists():
        cached = load_state(path)
        if cached.get("fingerprint") == fp:
            return cached["streams"]
    streams = tokenize_streams(tokenizer, texts, eot_id)
    save_state({"fingerprint": fp, "streams": streams}, path)
    return streams


class WindowSampler:
    """Draws random training windows of ``context + 1`` tokens, Austen with probability ``austen_weight``."""

    def __init__(self, streams: dict[str, torch.Tensor], context: int, austen_weight: float, seed: int):
        self.austen = streams["austen"].long()
        self.kjv = streams["kjv"].long()
        self.context = context
        self.austen_weight = austen_weight
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> torch.Tensor:
        """Return a ``[batch_size, context + 1]`` int64 batch."""
        span = self.context + 1
        from_austen = torch.rand(batch_size, generator=self.generator) < self.austen_weight  # [B]
        rows = []
        for use_austen in from_austen.tolist():
            src = self.austen if use_austen else self.kjv
            start = int(torch.randint(0, src.numel() - span + 1, (1,), generator=self.generator))
            rows.append(src[start : start + span])
        return torch.stack(rows)  # [B, T+1]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Sampler RNG state."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the sampler RNG state."""
        self.generator.set_state(state["generator"])


@dataclass
class ValGroup:
    """Validation windows of one group (Austen or KJV)."""

    name: str
    windows: list[torch.Tensor]  # each [n+1] int64, n <= context predicted tokens
    window_chars: list[int]  # characters decoded from each window's predicted tokens
    total_chars: int  # exact characters of the whole group's validation text


def make_val_group(
    name: str, texts: list[str], tokenizer: PreTrainedTokenizerBase, eot_id: int, context: int
) -> ValGroup:
    """Cut each text (``[EOT] + ids``) into windows predicting ``context`` tokens each."""
    windows: list[torch.Tensor] = []
    chars: list[int] = []
    for text in texts:
        ids = torch.tensor([eot_id] + encode_ids(tokenizer, text), dtype=torch.long)
        for start in range(0, ids.numel() - 1, context):
            w = ids[start : start + context + 1]
            windows.append(w)
            chars.append(len(tokenizer.decode(w[1:].tolist(), clean_up_tokenization_spaces=False)))
    return ValGroup(name, windows, chars, sum(len(t) for t in texts))


def subset(group: ValGroup, max_windows: int) -> ValGroup:
    """A fixed, evenly spaced subset of at most ``max_windows`` windows (0 = all)."""
    n = len(group.windows)
    if max_windows <= 0 or max_windows >= n:
        return group
    idx = np.linspace(0, n - 1, max_windows).round().astype(int).tolist()
    chars = [group.window_chars[i] for i in idx]
    return ValGroup(group.name, [group.windows[i] for i in idx], chars, sum(chars))


# --------------------------------------------------------------------------- evaluation


def window_nll(
    model: LlamaForCausalLM, batch: torch.Tensor, bf16: bool, body: torch.nn.Module | None = None
) -> torch.Tensor:
    """Per-token NLL in nats for a ``[B, n+1]`` batch; returns ``[B, n]`` float32.

    ``body`` optionally replaces ``model.model`` (e.g. a compiled version sharing its parameters).
    """
    inputs, targets = batch[:, :-1], batch[:, 1:]  # [B, n], [B, n]
    body = model.model if body is None else body
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = body(input_ids=inputs, use_cache=False).last_hidden_state  # [B, n, H]
        logits = model.lm_head(hidden)  # [B, n, V]
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # [B, n]
    return nll


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, group: ValGroup, bf16: bool, batch_size: int = 8) -> dict[str, float]:
    """Mean token loss, perplexity and bits per character of ``group``."""
    was_training = model.training
    model.eval()
    total_nll, total_tokens = 0.0, 0
    by_len: dict[int, list[torch.Tensor]] = {}
    for w in group.windows:
        by_len.setdefault(w.numel(), []).append(w)
    for same in by_len.values():
        for i in range(0, len(same), batch_size):
            nll = window_nll(model, torch.stack(same[i : i + batch_size]), bf16)
            total_nll += float(nll.double().sum())
            total_tokens += nll.numel()
    model.train(was_training)
    loss = total_nll / total_tokens
    return {
        "loss": loss,
        "ppl": math.exp(loss),
        "bpc": total_nll / math.log(2) / group.total_chars,
        "tokens": total_tokens,
        "chars": group.total_chars,
    }


# --------------------------------------------------------------------------- optimisation


def make_optimizer(model: torch.nn.Module, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW; weight decay on 2-D parameters (matrices, tied embedding), none on norms."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": s.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), eps=1e-8, fused=False)


def progress(s: TrainSettings, step: int, elapsed: float) -> float:
    """Fraction of the run done: the larger of the time fraction and the step fraction."""
    return max(elapsed / (s.minutes * 60.0), step / s.max_steps)


def lr_at(s: TrainSettings, step: int, frac: float) -> float:
    """Linear warm-up by steps, then cosine to ``min_lr_ratio * lr`` over the run progress ``frac``."""
    warm = min(1.0, (step + 1) / max(1, s.warmup_steps))
    cos = 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
    return s.lr * warm * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cos)


def train_step(
    model: LlamaForCausalLM, opt: torch.optim.Optimizer, batch: torch.Tensor, s: TrainSettings, lr: float,
    body: torch.nn.Module | None = None,
) -> tuple[float, float]:
    """One optimisation step on a ``[B, T+1]`` batch; returns (loss, grad norm)."""
    for g in opt.param_groups:
        g["lr"] = lr
    loss = window_nll(model, batch, s.bf16, body).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
    opt.step()
    return float(loss.detach()), float(gnorm)


# --------------------------------------------------------------------------- checkpoints and logs


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states, as tensors and plain values (they load with weights_only=True)."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = {"key": torch.from_numpy(key.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "gauss": gauss}
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from :func:`rng_state`."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])


@dataclass
class RunState:
    """Counters that survive a resume."""

    step: int = 0
    elapsed: float = 0.0  # wall-clock seconds of training so far, over all sessions
    best_bpc: float = float("inf")
    best_step: int = -1


def save_checkpoint(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sampler: WindowSampler,
    state: RunState, s: TrainSettings,
) -> None:
    """Save everything needed to resume, atomically."""
    save_state(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "sampler": sampler.state_dict(),
            "rng": rng_state(),
            "run_state": dataclasses.asdict(state),
            "settings": dataclasses.asdict(s),
        },
        path,
    )


def load_checkpoint(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sampler: WindowSampler, s: TrainSettings,
) -> RunState:
    """Restore model, optimiser, sampler and RNG states; returns the run counters."""
    ckpt = load_state(path)
    shape_keys = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
    for key in shape_keys:
        if ckpt["settings"][key] != getattr(s, key):
            raise ValueError(f"checkpoint {key}={ckpt['settings'][key]} differs from settings {getattr(s, key)}")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    sampler.load_state_dict(ckpt["sampler"])
    set_rng_state(ckpt["rng"])
    return RunState(**ckpt["run_state"])


def save_best(
    run_dir: Path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, metrics: dict[str, Any]
) -> None:
    """Save a bf16 copy of the model plus the tokenizer to ``run_dir/best`` (replaced atomically)."""
    best, tmp, old = run_dir / BEST_DIR_NAME, run_dir / "best.tmp", run_dir / "best.old"
    for d in (tmp, old):
        if d.exists():
            shutil.rmtree(d)
    export = copy.deepcopy(model).to(torch.bfloat16)
    export.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    (tmp / "train_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    if best.exists():
        os.replace(best, old)
    os.replace(tmp, best)
    if old.exists():
        shutil.rmtree(old)


def log_line(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON record to the run log and echo it above the progress bar."""
    with open(run_dir / LOG_NAME, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    tqdm.write(json.dumps(record))


# --------------------------------------------------------------------------- main loop


def run_validation(
    model: LlamaForCausalLM, groups: list[ValGroup], s: TrainSettings, state: RunState, full: bool
) -> dict[str, Any]:
    """Evaluate every group (a subset during training, all windows when ``full``) into one record."""
    t0 = time.time()
    record: dict[str, Any] = {"kind": "val", "step": state.step, "elapsed_min": round(state.elapsed / 60, 2),
                              "full": full}
    for g in groups:
        m = evaluate(model, g if full else subset(g, s.eval_windows), s.bf16)
        for k in ("loss", "ppl", "bpc"):
            record[f"{g.name}_{k}"] = round(m[k], 5)
    record["eval_s"] = round(time.time() - t0, 1)
    return record


def train(
    s: TrainSettings, splits: dict[str, SourceSplit], tokenizer_dir: str | Path, run_dir: str | Path
) -> RunState:
    """Train (or resume) the LM in ``run_dir`` until the time budget or step limit is reached."""
    torch.set_num_threads(s.threads)
    run_dir, tokenizer_dir = Path(run_dir), Path(tokenizer_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer_dir)
    eot_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)

    random.seed(s.seed)
    np.random.seed(s.seed)
    config = model_config(s, len(tokenizer), eot_id)
    model = build_model(config, s.seed)
    model.train()
    opt = make_optimizer(model, s)
    streams = load_or_build_streams(run_dir, tokenizer_dir, tokenizer, {n: sp.train for n, sp in splits.items()},
                                    eot_id)
    sampler = WindowSampler(streams, s.context, s.austen_weight, s.seed)
    groups = [
        make_val_group("austen", [splits[n].val for n in AUSTEN_SOURCES], tokenizer, eot_id, s.context),
        make_val_group("kjv", [splits[KJV_SOURCE].val], tokenizer, eot_id, s.context),
    ]

    ckpt_path = run_dir / CHECKPOINT_NAME
    if ckpt_path.exists():
        state = load_checkpoint(ckpt_path, model, opt, sampler, s)
        log_line(run_dir, {"kind": "resume", "step": state.step, "elapsed_min": round(state.elapsed / 60, 2)})
    else:
        state = RunState()
        torch.manual_seed(s.seed + 1)  # dropout RNG, independent of the init stream
        (run_dir / "settings.json").write_text(json.dumps(dataclasses.asdict(s), indent=2) + "\n")
        log_line(run_dir, {"kind": "start", "params": count_params(model), "config": config.to_dict(),
                           "austen_train_tokens": int(streams["austen"].numel()),
                           "kjv_train_tokens": int(streams["kjv"].numel()),
                           "val_windows": {g.name: len(g.windows) for g in groups}})

    # Training runs the compiled body (fixed shapes); evaluation uses the eager model.
    body = torch.compile(model.model, dynamic=False) if s.compile else model.model
    session_start = time.time() - state.elapsed  # so that elapsed = now - session_start
    last_ckpt = time.time()
    tokens_per_step = s.batch_size * s.context
    bar = tqdm(total=s.max_steps, initial=state.step, dynamic_ncols=True, mininterval=5.0)
    window_t, window_steps, loss_sum = time.time(), 0, 0.0
    while progress(s, state.step, state.elapsed) < 1.0:
        lr = lr_at(s, state.step, progress(s, state.step, state.elapsed))
        loss, gnorm = train_step(model, opt, sampler.sample(s.batch_size), s, lr, body)
        state.step += 1
        state.elapsed = time.time() - session_start
        window_steps += 1
        loss_sum += loss
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")

        if state.step % s.log_every == 0:
            dt = time.time() - window_t
            log_line(run_dir, {"kind": "train", "step": state.step, "loss": round(loss_sum / window_steps, 4),
                               "lr": lr, "grad_norm": round(gnorm, 3),
                               "tok_per_s": round(window_steps * tokens_per_step / dt),
                               "elapsed_min": round(state.elapsed / 60, 2)})
            window_t, window_steps, loss_sum = time.time(), 0, 0.0

        if state.step % s.eval_every == 0:
            _validate_and_keep_best(model, groups, s, state, run_dir, tokenizer, full=False)
            window_t, window_steps, loss_sum = time.time(), 0, 0.0

        if time.time() - last_ckpt >= s.checkpoint_minutes * 60:
            state.elapsed = time.time() - session_start
            save_checkpoint(ckpt_path, model, opt, sampler, state, s)
            last_ckpt = time.time()
            window_t, window_steps, loss_sum = time.time(), 0, 0.0
    bar.close()

    _validate_and_keep_best(model, groups, s, state, run_dir, tokenizer, full=True)
    state.elapsed = time.time() - session_start
    save_checkpoint(ckpt_path, model, opt, sampler, state, s)
    log_line(run_dir, {"kind": "done", "step": state.step, "elapsed_min": round(state.elapsed / 60, 2),
                       "best_austen_bpc": state.best_bpc, "best_step": state.best_step})
    return state


def _validate_and_keep_best(
    model: LlamaForCausalLM, groups: list[ValGroup], s: TrainSettings, state: RunState,
    run_dir: Path, tokenizer: PreTrainedTokenizerBase, full: bool,
) -> None:
    """Validate, log, and save ``best/`` when Austen bpc improves.

    Subset and full evaluations are not comparable, so the final full evaluation always re-scores
    the saved best model's figures: it replaces ``best/`` if it beats the best *subset* figure.
    """
    record = run_validation(model, groups, s, state, full)
    log_line(run_dir, record)
    bpc = record["austen_bpc"]
    if bpc < state.best_bpc or (full and not (run_dir / BEST_DIR_NAME).exists()):
        state.best_bpc, state.best_step = bpc, state.step
        save_best(run_dir, model, tokenizer, record)
        log_line(run_dir, {"kind": "best", "step": state.step, "austen_bpc": bpc})
