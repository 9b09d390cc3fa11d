"""The optimizer (AdamW, or Muon for the blocks' matrices with AdamW for the rest) and the learning-rate schedule
(warmup, then cosine decay, warmup-stable-decay or constant)."""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from gpt.train.config import TrainConfig
from gpt.train.muon import MuonAdamW, split_parameters


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """train.optimizer=adamw: AdamW; 2-D parameters (matmul weights, embeddings) decay, biases and LayerNorm gains
    do not. train.optimizer=muon: Muon for the blocks' matrices (gpt.train.muon.split_parameters), AdamW for the
    rest."""
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    options = {"lr": cfg.learning_rate, "betas": (cfg.beta1, cfg.beta2), **({"fused": True} if fused else {})}
    if cfg.optimizer == "adamw":
        params = [p for p in model.parameters() if p.requires_grad]
        decays = [p.dim() >= 2 and not getattr(p, "no_decay", False) for p in params]  # gpt.weights.lora's rows
        groups = [
            {"params": [p for p, d in zip(params, decays) if d], "weight_decay": cfg.weight_decay},
            {"params": [p for p, d in zip(params, decays) if not d], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, **options)
    split = split_parameters(model)
    groups = [
        {"params": [p for _, p in split.muon], "muon": True, "lr": cfg.muon_lr, "weight_decay": cfg.muon_weight_decay,
         "momentum": cfg.muon_momentum, "nesterov": True},
        {"params": [p for _, p in split.adamw_decay], "muon": False, "weight_decay": cfg.weight_decay},
        {"params": [p for _, p in split.adamw_no_decay], "muon": False, "weight_decay": 0.0},
    ]
    ns_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPUs without bf16 units: fp32 ~14x faster
    return MuonAdamW([g for g in groups if g["params"]], ns_dtype=ns_dtype, **options)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float, cfg: TrainConfig) -> None:
    """Every group's learning rate for this step: AdamW's ``lr``, Muon's scaled alike (train.muon_lr at the peak)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * (cfg.muon_lr / cfg.learning_rate) if group.get("muon") else lr


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to learning_rate, then by train.schedule: cosine decay to min_lr at lr_decay_iters (then flat);
    wsd: stable, then linear decay to min_lr over the last decay_frac of max_iters; constant: stable."""
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if cfg.schedule == "constant":
        return cfg.learning_rate
    if cfg.schedule == "wsd":
        start = cfg.max_iters - decay_iters(cfg.max_iters, cfg.decay_frac)
        if step < start:
            return cfg.learning_rate
        progress = (step - start) / max(1, cfg.max_iters - start)  # 0 at the decay's first step
        return cfg.learning_rate + min(1.0, progress) * (final_lr(cfg) - cfg.learning_rate)
    min_lr = final_lr(cfg)
    decay_end = cfg.lr_decay_iters or cfg.max_iters
    if step >= decay_end:
        return min_lr
    progress = (step - cfg.warmup_iters) / max(1, decay_end - cfg.warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - min_lr)


def final_lr(cfg: TrainConfig) -> float:
    """The learning rate a decay ends at: train.min_lr, by default learning_rate / 10."""
    return cfg.learning_rate / 10 if cfg.min_lr is None else cfg.min_lr


def decay_iters(max_iters: int, decay_frac: float) -> int:
    """WSD: the number of final steps whose learning rate decays."""
    return round(decay_frac * max_iters)


def describe(model: nn.Module, cfg: TrainConfig) -> str:
    """The start-up line of the optimizer (Muon's split: which matrices, which parameters stay with AdamW) and of
    the schedule."""
    warmup = f"warmup {cfg.warmup_iters}, "
    schedule = {
        "cosine": f"cosine ({warmup}to {final_lr(cfg):.1e} at step {cfg.lr_decay_iters or cfg.max_iters})",
        "wsd": f"wsd ({warmup}stable, then linear to {final_lr(cfg):.1e} over the last "
               f"{decay_iters(cfg.max_iters, cfg.decay_frac)} steps)",
        "constant": f"constant ({warmup}then {cfg.learning_rate:.1e})",
    }[cfg.schedule]
    if cfg.optimizer == "adamw":
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return (f"optimizer: AdamW (lr {cfg.learning_rate:.1e}, weight decay {cfg.weight_decay:g} on 2-D parameters) "
                f"for all {n / 1e6:.2f}M parameters; schedule {schedule}")
    split = split_parameters(model)
    count = lambda named: sum(p.numel() for _, p in named) / 1e6  # noqa: E731
    kinds = sorted({name.split(".", 3)[-1] if name.startswith("transformer.h.") else name for name, _ in split.muon})
    return (f"optimizer: Muon (lr {cfg.muon_lr:g}, momentum {cfg.muon_momentum:g}, weight decay "
            f"{cfg.muon_weight_decay:g}) for {len(split.muon)} matrices of the blocks, {count(split.muon):.2f}M "
            f"parameters ({', '.join(kinds)}); AdamW (lr {cfg.learning_rate:.1e}) for "
            f"{count(split.adamw_decay) + count(split.adamw_no_decay):.2f}M parameters: "
            f"{', '.join(name for name, _ in split.adamw_decay)} (weight decay {cfg.weight_decay:g}) and "
            f"{len(split.adamw_no_decay)} vectors (gains, biases, ...); schedule {schedule}")
