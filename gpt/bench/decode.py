"""Decode speed: prefill and per-token decode, with the KV cache (eager, and with compile=true compiled) and with
full recomputation (eager).

The ways of decoding run interleaved, one after the other in every repeat, so that a shared machine's load falls on
all of them alike; each speed-up is the median of the repeats' own ratios, its column naming what it divides: the
eager cache over eager recomputation (like with like), and the compiled step over the same eager recomputation. The
compiled step's compilation is timed apart and reported with the number of tokens it takes to pay for itself.
Against transformers: gpt.bench.decode_hf.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import torch

from gpt import GPT
from gpt.bench.decode_hf import against_transformers
from gpt.bench.report import (
    compile_step,
    describe_device,
    first_call_seconds,
    interleaved,
    markdown_table,
    median_seconds,
    ratio,
    ratio_spread,
    sync,
)
from gpt.device import DeviceConfig, resolve_device
from gpt.errors import ConfigError, check_positive
from gpt.inference.decoding import decode_step, generate, prefill
from gpt.inference.weight_layout import gemv_layout
from gpt.model.config import ModelConfig, ScriptConfig
from gpt.model.kv_cache import KVCache
from gpt.weights.load import load


@dataclass
class BenchDecodeConfig(ScriptConfig):
    """scripts/bench_decode.py's settings (configs/bench_decode.yaml), checked as they are built."""

    ckpt: Optional[str] = None  # a trained model; default: random weights of `model`
    model: ModelConfig = field(default_factory=ModelConfig)
    vocab_size: int = 256  # for random weights
    device: DeviceConfig = field(default_factory=DeviceConfig)
    threads: Optional[int] = None  # CPU threads (torch.set_num_threads); None: torch's default
    new_tokens: int = 500
    prompt_lens: list[int] = field(default_factory=lambda: [1, 64])
    batch_size: int = 1
    repeats: int = 3
    compile: bool = False  # also time the cached step compiled once (gpt.inference.decoding.compiled_decode_step)
    transformers: bool = False  # also GPT-2 124M against transformers' generate (gpt.bench.decode_hf)
    hf_new_tokens: int = 100  # new tokens of the transformers comparison (after a 16-token prompt)
    hf_bf16: bool = False  # also both sides in bfloat16, a table of its own (gpt.bench.decode_hf.bf16_table)
    contexts: list[int] = field(default_factory=list)  # also: ms per decoded token with this many tokens cached
    context_steps: int = 64  # decoding steps timed at each of those contexts

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "new_tokens", "batch_size", "repeats", "hf_new_tokens")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be a positive count or null, got {self.threads}")
        if not self.prompt_lens or any(n < 1 for n in self.prompt_lens):
            raise ConfigError(f"prompt_lens must be positive token counts, got {self.prompt_lens}")
        if any(n < 1 for n in self.contexts) or self.context_steps < 1:
            raise ConfigError(f"contexts must be positive token counts and context_steps positive, got "
                              f"{self.contexts} and {self.context_steps}")


def run(cfg: BenchDecodeConfig) -> str:
    """Time greedy generation of cfg.new_tokens tokens after prompts of each length; return markdown tables."""
    device = resolve_device(cfg.device.type)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if cfg.ckpt:
        model = load(cfg.ckpt, device).model
        source = cfg.ckpt
    else:
        torch.manual_seed(0)
        model = GPT(cfg.model.build(cfg.vocab_size)).to(device).eval()
        source = "random weights"
    gemv_layout(model)  # as the generate and chat commands store a model's weights (on a CPU)
    mc = model.config
    header = (
        f"decode benchmark: {source}, {model.num_params() / 1e6:.2f}M parameters, block_size {mc.block_size}, "
        f"attention={mc.attention}, device {describe_device(device, cfg.threads)}, torch {torch.__version__}, "
        f"batch {cfg.batch_size}, {cfg.new_tokens} new tokens, {cfg.repeats} interleaved repeats (median); every way "
        f"eager but those named compiled"
    )
    out = [header, "", decode_table(cfg, model, device)]
    if cfg.contexts:
        out += ["", context_table(cfg, model, device)]
    if cfg.transformers:
        out += ["", against_transformers(cfg, device)]
    return "\n".join(out)


def decode_ways(cfg: BenchDecodeConfig, device: torch.device) -> dict[str, tuple[bool, object]]:
    """Each way of decoding: (whether it keeps a cache, its step). Eager: cached steps (a model without designs as
    straight calls, gpt.inference.plain_step) and recomputation; compile=true adds the cached step compiled
    (compiled_decode_step). Recomputation is eager only: torch.compile(model, dynamic=True) broke the forward into 9
    graphs and, warm, recomputed about 3x slower than eager (docs/benchmarks.md)."""
    ways = {"KV cache": (True, decode_step), "recompute": (False, decode_step)}
    if cfg.compile:
        ways["KV cache, compiled"] = (True, compile_step(device))
    return ways


PAIRS = {"KV cache over recompute, both eager": ("recompute", "KV cache"),
         "compiled KV cache over eager recompute": ("recompute", "KV cache, compiled")}


def decode_table(cfg: BenchDecodeConfig, model: GPT, device: torch.device) -> str:
    """One row per prompt length: prefill, tokens/s of each way of decoding, the cache's speed-up over recomputation
    (eager over eager; the compiled step's over the same eager recomputation, labelled so), whether every way gave
    the same tokens."""
    mc = model.config
    ways = decode_ways(cfg, device)
    pairs = {kind: pair for kind, pair in PAIRS.items() if pair[1] in ways}
    rows, firsts, note = [], {}, ""
    for prompt_len in cfg.prompt_lens:
        prompt = torch.randint(0, mc.vocab_size, (cfg.batch_size, min(prompt_len, mc.block_size)), device=device)
        with torch.no_grad():
            prefill = median_seconds(partial(model, prompt), device, cfg.repeats)
        fns = {name: partial(generate, model, prompt, cfg.new_tokens, temperature=0.0, kv_cache=kv, step=step)
               for name, (kv, step) in ways.items()}
        for name in (n for n in fns if "compiled" in n and n not in firsts):  # compiles at the first prompt only
            firsts[name] = (first_call_seconds(fns[name], device), prompt.size(1))
        tokens = {name: fn() for name, fn in fns.items()}
        times = interleaved(fns, device, cfg.repeats)
        speed = {name: cfg.new_tokens * cfg.batch_size / statistics.median(t) for name, t in times.items()}
        same = all(torch.equal(t, tokens["recompute"]) for t in tokens.values())
        rows.append([prompt.size(1), f"{prefill * 1e3:.1f}", f"{prompt.numel() / prefill:,.0f}",
                     *(f"{speed[name]:,.0f}" for name in ways),
                     *(ratio_spread(times, slow, fast, 1) for slow, fast in pairs.values()), "yes" if same else "NO"])
        if cfg.compile and len(rows) == 1:
            note = "\n\n" + _compiled_note(cfg, times, firsts)
    table = markdown_table(
        ["prompt tokens", "prefill ms", "prefill tok/s", *(f"decode tok/s ({name})" for name in ways),
         *(f"speed-up: {kind} (lowest-highest repeat)" for kind in pairs),
         "same tokens"],
        rows,
    )
    return table + note


def _compiled_note(cfg: BenchDecodeConfig, times: dict[str, list[float]], firsts: dict[str, tuple[float, int]]) -> str:
    """What compiling cost (the compiled step's first call) and when it pays for itself."""
    compiled, eager = statistics.median(times["KV cache, compiled"]), statistics.median(times["KV cache"])
    saved = (eager - compiled) / (cfg.new_tokens * cfg.batch_size)
    first, prompt_len = firsts["KV cache, compiled"]
    pays = f"{(first - compiled) / saved:,.0f} tokens" if saved > 0 else "never (not faster)"
    return (f"compiled: the first call (compilation and one decode of {cfg.new_tokens} tokens after {prompt_len}) "
            f"took {first:.1f} s; the compiled step is {ratio(times, 'KV cache', 'KV cache, compiled'):.2f}x as fast "
            f"as the eager one here, so its compilation pays for itself after {pays}")


def context_table(cfg: BenchDecodeConfig, model: GPT, device: torch.device) -> str:
    """Milliseconds per decoded token (eager KV-cache steps) once each of cfg.contexts tokens is cached, and the
    cache's bytes there: a softmax cache grows with the context, a recurrent state (Gated DeltaNet) does not. The
    contexts take turns in every repeat (each a fresh prefill, untimed) so that the machine's load falls alike."""
    mc = model.config
    too_long = [n for n in cfg.contexts if n + cfg.context_steps > mc.block_size]
    if too_long:
        raise ConfigError(f"contexts: {too_long[0]} cached tokens + {cfg.context_steps} steps exceed block_size "
                          f"{mc.block_size}", hint="raise model.block_size, or lower contexts or context_steps")
    times: dict[int, list[float]] = {n: [] for n in cfg.contexts}
    held: dict[int, int] = {}
    for repeat in range(cfg.repeats + 1):  # the first round warms up, untimed
        for n in cfg.contexts:
            seconds, held[n] = _steps_after(model, n, cfg, device)
            if repeat:
                times[n].append(seconds / cfg.context_steps)
    first = statistics.median(times[cfg.contexts[0]])
    rows = [[n, f"{statistics.median(t) * 1e3:.2f}", f"{statistics.median(t) / first:.2f}x", f"{held[n]:,}"]
            for n, t in times.items()]
    return (f"decoding {cfg.context_steps} tokens after a cached context, batch {cfg.batch_size}, eager steps, "
            f"median of {cfg.repeats}\n\n" + markdown_table(
                ["context tokens", "ms per token", f"vs {cfg.contexts[0]} tokens", "cache bytes"], rows))


@torch.no_grad()
def _steps_after(model: GPT, n: int, cfg: BenchDecodeConfig, device: torch.device) -> tuple[float, int]:
    """Seconds of cfg.context_steps greedy decode steps after an n-token prefill, and the cache's bytes then."""
    B = cfg.batch_size
    prompt = torch.randint(0, model.config.vocab_size, (B, n), device=device)
    cache = KVCache(model.config, batch_size=B, device=device)
    positions = torch.arange(n, device=device).expand(B, n)
    token = prefill(model, prompt, positions, None, cache).argmax(-1, keepdim=True)
    positions = positions[:, -1:]
    sync(device)
    start = time.perf_counter()
    for _ in range(cfg.context_steps):
        positions = positions + 1
        token = decode_step(model, token, positions, cache).argmax(-1, keepdim=True)
    sync(device)
    return time.perf_counter() - start, sum(layer.held_bytes() for layer in cache.layers)
