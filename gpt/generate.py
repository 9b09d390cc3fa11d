"""Load a trained model from a checkpoint and print samples from it (the body of scripts/generate.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import DictConfig

from gpt import tokenizer as tok
from gpt.config import GPTConfig
from gpt.device import autocast, resolve_device, resolve_precision
from gpt.errors import UserError
from gpt.model import GPT
from gpt.sampling import generate, prompt_ids
from gpt.train import checkpoint


def load_model(
    ckpt: str | Path, device: torch.device | str = "cpu", attention: str | None = None, backend: str | None = None
) -> tuple[GPT, tok.Tokenizer]:
    """The model and tokenizer stored in a checkpoint, in eval mode; ``attention`` swaps the kernel.

    ``backend`` (sdpa's attention.backend) is a choice for this run: the one training used is not restored.
    """
    payload = checkpoint.load(checkpoint.resolve(ckpt))
    config = GPTConfig.from_dict(payload["model_config"])
    config = replace(config, attention=attention or config.attention, attention_backend=backend)
    model = GPT(config)
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tok.from_meta(payload["tokenizer"])


def run(cfg: DictConfig) -> None:
    if cfg.max_new_tokens <= 0:
        raise UserError(f"max_new_tokens must be positive, got {cfg.max_new_tokens}")
    if cfg.temperature < 0:
        raise UserError(f"temperature must be >= 0 (0 is greedy), got {cfg.temperature}")
    if cfg.top_k is not None and cfg.top_k <= 0:
        raise UserError(f"top_k must be positive or null, got {cfg.top_k}")
    if cfg.num_samples <= 0:
        raise UserError(f"num_samples must be positive, got {cfg.num_samples}")
    device = resolve_device(cfg.device.type)
    precision = resolve_precision(cfg.precision, device)
    model, tokenizer = load_model(
        cfg.ckpt, device, cfg.attention.name if cfg.attention else None, cfg.attention.backend if cfg.attention else None
    )
    start = torch.tensor([prompt_ids(tokenizer, cfg.prompt)], device=device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    for i in range(cfg.num_samples):
        with autocast(device, precision):
            out = generate(model, start, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                           generator=generator)
        print(tokenizer.decode(out[0].tolist()))
        if i < cfg.num_samples - 1:
            print("-" * 40)
