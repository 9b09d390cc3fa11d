"""KV bytes per token of a 5:1 local:global layout (window 512) and of the uniform global model, GPT-2 small's shape,
at a 4,096-token context: a real bf16 cache filled with 4,096 tokens, against gpt.memory's computed figure
(docs/layouts.md quotes its output).

    python benchmarks/layout_kv_bytes.py
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from gpt import GPT, GPTConfig, memory  # noqa: E402
from gpt.model.kv_cache import KVCache  # noqa: E402

CONTEXT = 4096
SHAPE = dict(n_layer=12, n_head=12, n_embd=768, block_size=CONTEXT, vocab_size=50257)
KINDS = {"S": {"window": 512, "designs": ["rope"]}, "L": {"designs": ["rope"], "options": {"rope": {"base": 1000000}}}}
CONFIGS = {"uniform global (RoPE)": dict(designs=["rope"]),
           "5:1 SSSSSL, window 512": dict(layers="SSSSSL", layer_kinds=KINDS)}


def measured_bytes_per_token(config: GPTConfig) -> float:
    """Bytes a bf16 cache holds once it has seen CONTEXT tokens (a prompt, then one decoding step), per token."""
    torch.manual_seed(0)
    model, cache = GPT(config).to(torch.bfloat16).eval(), KVCache(config, 1, "cpu")
    idx = torch.randint(0, config.vocab_size, (1, CONTEXT))
    with torch.no_grad():
        model(idx[:, :-1], cache=cache)
        model(idx[:, -1:], cache=cache)
    assert cache.length == CONTEXT
    return cache.held_bytes() / CONTEXT


def main() -> None:
    print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores")
    got = {}
    for name, settings in CONFIGS.items():
        config = GPTConfig(**SHAPE, **settings)
        started = time.perf_counter()
        got[name] = measured_bytes_per_token(config)
        computed = memory.kv_bytes_at_context(config, 2)
        print(f"{name}: measured {got[name]:,.0f} bytes per token, computed {computed:,.0f} "
              f"({'equal' if got[name] == computed else 'DIFFERENT'}; {time.perf_counter() - started:.0f} s)")
    uniform, layout = got.values()
    print(f"layout / uniform: {layout / uniform:.4f}")


if __name__ == "__main__":
    from gpt.cli import bring_designs

    bring_designs()  # GPT_DESIGNS' files, as every script loads them: one failing is one error line
    main()
