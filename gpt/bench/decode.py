"""Decode speed: prefill and per-token decode, with the KV cache and with full recomputation."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import torch

from gpt import GPT
from gpt.bench.report import markdown_table, median_seconds
from gpt.device import DeviceConfig, resolve_device
from gpt.errors import ConfigError, check_positive
from gpt.inference.decoding import compiled_decode_step, decode_step, generate
from gpt.model.config import ModelConfig, ScriptConfig
from gpt.weights.load import load


@dataclass
class BenchDecodeConfig(ScriptConfig):
    """scripts/bench_decode.py's settings (configs/bench_decode.yaml), checked as they are built."""

    ckpt: Optional[str] = None  # a trained model; default: random weights of `model`
    model: ModelConfig = field(default_factory=ModelConfig)
    vocab_size: int = 256  # for random weights
    device: DeviceConfig = field(default_factory=DeviceConfig)
    new_tokens: int = 500
    prompt_lens: list[int] = field(default_factory=lambda: [1, 64])
    batch_size: int = 1
    repeats: int = 3
    compile: bool = False  # also time the cached step compiled once (gpt.inference.decoding.compiled_decode_step)

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "new_tokens", "batch_size", "repeats")
        if not self.prompt_lens or any(n < 1 for n in self.prompt_lens):
            raise ConfigError(f"prompt_lens must be positive token counts, got {self.prompt_lens}")


def run(cfg: BenchDecodeConfig) -> str:
    """Time greedy generation of cfg.new_tokens tokens after prompts of each length; return a markdown table."""
    device = resolve_device(cfg.device.type)
    if cfg.ckpt:
        model = load(cfg.ckpt, device).model
        source = cfg.ckpt
    else:
        torch.manual_seed(0)
        model = GPT(cfg.model.build(cfg.vocab_size)).to(device).eval()
        source = "random weights"
    mc = model.config
    header = (
        f"decode benchmark: {source}, {model.num_params() / 1e6:.2f}M parameters, block_size {mc.block_size}, "
        f"attention={mc.attention}, device {device}, batch {cfg.batch_size}, {cfg.new_tokens} new tokens, "
        f"median of {cfg.repeats}"
    )
    steps = {"KV cache": decode_step, **({"KV cache, compiled": compiled_decode_step()} if cfg.compile else {})}
    rows = []
    for prompt_len in cfg.prompt_lens:
        prompt = torch.randint(0, mc.vocab_size, (cfg.batch_size, min(prompt_len, mc.block_size)), device=device)
        with torch.no_grad():
            prefill = median_seconds(partial(model, prompt), device, cfg.repeats)
        speed = {}
        for name, kv_cache, step in [*((n, True, s) for n, s in steps.items()), ("recompute", False, decode_step)]:
            decode = partial(generate, model, prompt, cfg.new_tokens, temperature=0.0, kv_cache=kv_cache, step=step)
            if name.endswith("compiled"):
                decode()  # the one compilation, outside the timing
            speed[name] = cfg.new_tokens * cfg.batch_size / median_seconds(decode, device, cfg.repeats)
        rows.append([prompt.size(1), f"{prefill * 1e3:.1f}", f"{prompt.numel() / prefill:,.0f}",
                     *(f"{speed[name]:,.0f}" for name in speed),
                     *(f"{speed[name] / speed['recompute']:.1f}x" for name in steps)])
    table = markdown_table(
        ["prompt tokens", "prefill ms", "prefill tok/s", *(f"decode tok/s ({name})" for name in [*steps, "recompute"]),
         *(f"speed-up ({name})" for name in steps)],
        rows,
    )
    return header + "\n\n" + table
