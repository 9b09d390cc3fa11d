"""The training loop: data, model, AdamW, periodic evaluation, checkpoints, TensorBoard, a summary."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from gpt import attention
from gpt.config import GPTConfig
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.device import autocast, resolve_device, resolve_precision
from gpt.model import GPT
from gpt.sampling import prompt_ids
from gpt.schema import model_config
from gpt.train import checkpoint
from gpt.train.config import TrainConfig
from gpt.train.optim import learning_rate, make_optimizer


@dataclass
class Summary:
    params: int
    tokens: int
    best_val_loss: float
    final_val_loss: float
    wall_s: float
    ckpt: Path


@torch.no_grad()
def evaluate(model: GPT, data: TokenData, cfg: TrainConfig, gen: torch.Generator, device, ctx) -> dict[str, float]:
    """Mean loss over eval_iters random batches of each split (model in eval mode: no dropout)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(cfg.eval_iters)
        for i in range(cfg.eval_iters):
            x, y = data.batch(split, cfg.batch_size, model.config.block_size, gen, device)
            with ctx:
                _, loss = model(x, y)
            losses[i] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def train(cfg: DictConfig, run_dir: Path, log=print) -> Summary:
    """Train the model described by a composed train config, writing everything into run_dir."""
    from torch.utils.tensorboard import SummaryWriter  # imported late: tensorboard is slow to import

    t_start = time.time()
    tcfg = TrainConfig(**OmegaConf.to_container(cfg.train, resolve=True))
    tcfg.validate()
    device = resolve_device(cfg.device.type)
    attention.check_trainable(cfg.model.attention, device, cfg.model.dropout)
    precision = resolve_precision(cfg.precision, device)
    data_dir = prepare(DataConfig(**OmegaConf.to_container(cfg.data, resolve=True)), log=log)
    data = TokenData(data_dir)
    mcfg: GPTConfig = model_config(cfg.model, data.tokenizer.vocab_size)
    data.check_block_size(mcfg.block_size)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(cfg.seed)
    model = GPT(mcfg).to(device)
    optimizer = make_optimizer(model, tcfg, device)
    ctx = autocast(device, precision)
    train_gen = torch.Generator().manual_seed(cfg.seed)
    eval_gen = torch.Generator().manual_seed(cfg.seed + 1)

    run_dir.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(log_dir=str(run_dir))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    writer.add_text("config", "```yaml\n" + OmegaConf.to_yaml(cfg, resolve=True) + "\n```")
    tokens_per_step = tcfg.batch_size * tcfg.grad_accum * mcfg.block_size
    log(
        f"model: {model.num_params() / 1e6:.2f}M parameters ({mcfg.n_layer} layers, {mcfg.n_head} heads, "
        f"{mcfg.n_embd} wide, context {mcfg.block_size}, attention={mcfg.attention}); "
        f"device {device} ({precision}); {tokens_per_step:,} tokens per step"
    )

    def payload(step: int, best_val: float, with_optimizer: bool) -> dict[str, Any]:
        state = {
            "model": model.state_dict(),
            "model_config": mcfg.to_dict(),
            "tokenizer": data.tokenizer.to_meta(),
            "step": step,
            "best_val_loss": best_val,
            "config": resolved,
        }
        if with_optimizer:
            state["optimizer"] = optimizer.state_dict()
        return state

    interactive = sys.stderr.isatty()
    bar = tqdm(total=tcfg.max_iters, disable=not interactive, unit="step", dynamic_ncols=True)
    best_val = math.inf
    losses: dict[str, float] = {}
    t_log, tokens_since_log = time.time(), 0
    for step in range(tcfg.max_iters + 1):
        if step % tcfg.eval_interval == 0 or step == tcfg.max_iters:
            losses = evaluate(model, data, tcfg, eval_gen, device, ctx)
            writer.add_scalar("val/loss", losses["val"], step)
            writer.add_scalar("train/eval_loss", losses["train"], step)
            improved = losses["val"] < best_val
            best_val = min(best_val, losses["val"])
            checkpoint.save(payload(step, best_val, with_optimizer=True), run_dir / checkpoint.LATEST)
            if improved:
                checkpoint.save(payload(step, best_val, with_optimizer=False), run_dir / checkpoint.BEST)
            line = f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
            bar.write(line) if interactive else log(line)
        if step == tcfg.max_iters:
            break

        lr = learning_rate(step, tcfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        for _ in range(tcfg.grad_accum):
            x, y = data.batch("train", tcfg.batch_size, mcfg.block_size, train_gen, device)
            with ctx:
                _, loss = model(x, y)
            (loss / tcfg.grad_accum).backward()
            loss_sum += loss.detach()
        if tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_since_log += tokens_per_step

        if (step + 1) % tcfg.log_interval == 0:
            train_loss = float(loss_sum) / tcfg.grad_accum
            tok_s = tokens_since_log / (time.time() - t_log)
            t_log, tokens_since_log = time.time(), 0
            writer.add_scalar("train/loss", train_loss, step + 1)
            writer.add_scalar("lr", lr, step + 1)
            writer.add_scalar("tokens_per_sec", tok_s, step + 1)
            bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        bar.update(1)
    bar.close()
    writer.close()

    summary = Summary(
        params=model.num_params(),
        tokens=tcfg.max_iters * tokens_per_step,
        best_val_loss=best_val,
        final_val_loss=losses["val"],
        wall_s=time.time() - t_start,
        ckpt=run_dir / checkpoint.LATEST,
    )
    if tcfg.sample_tokens > 0:
        start = torch.tensor([prompt_ids(data.tokenizer, "")], device=device)
        model.eval()
        sample = model.generate(start, tcfg.sample_tokens, temperature=0.8, top_k=200,
                                generator=torch.Generator(device=device).manual_seed(cfg.seed))
        log("sample:\n" + data.tokenizer.decode(sample[0].tolist()) + "\n" + "-" * 40)
    log(
        f"done: {summary.params / 1e6:.2f}M parameters, {summary.tokens:,} tokens seen, "
        f"best val loss {summary.best_val_loss:.4f}, {summary.wall_s:.0f}s wall time\n"
        f"checkpoint: {summary.ckpt} (best: {run_dir / checkpoint.BEST})\n"
        f"sample from it: python scripts/generate.py ckpt={run_dir}"
    )
    return summary
