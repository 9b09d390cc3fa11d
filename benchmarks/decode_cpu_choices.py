"""The two measurements behind CPU decoding's choices (docs/benchmarks.md, Decode speed):

  python benchmarks/decode_cpu_choices.py gemv      one row times each of GPT-2 124M's weight matrices, stored as
                                                    nn.Linear's (out, in) and as (in, out): gpt.inference.weight_layout
  python benchmarks/decode_cpu_choices.py threads   the default model's cached decoding at 2 threads with its steps on
                                                    both threads and on one (gpt.inference.decoding.step_threads)
  python benchmarks/decode_cpu_choices.py plain     the default model's one-token steps through its modules
                                                    (decode_step) and as straight calls (gpt.inference.plain_step)

Each takes turns in every round (a shared machine's load falls on all alike); 1 thread for gemv and plain.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

GPT2_MATRICES = {"c_attn": (768, 2304), "attn.c_proj": (768, 768), "c_fc": (768, 3072), "mlp.c_proj": (3072, 768),
                 "lm_head": (768, 50257)}


def gemv(rounds: int = 5) -> None:
    """Microseconds of one row times each matrix (enough copies to pass 300 MB, so every read comes from memory)."""
    torch.set_num_threads(1)
    print("| matrix (in -> out) | stored (out, in), us | stored (in, out), us | (out, in) GB/s | (in, out) GB/s |")
    print("| --- | --- | --- | --- | --- |")
    for name, (n_in, n_out) in GPT2_MATRICES.items():
        copies = max(3, int(300e6 / (n_in * n_out * 4)))
        linear = [torch.randn(n_out, n_in) for _ in range(copies)]
        stored = [w.t().contiguous().t() for w in linear]  # gemv_layout's storage, the same values
        x = torch.randn(1, n_in)
        best = {"linear": float("inf"), "stored": float("inf")}
        for _ in range(rounds):
            for way, weights in (("linear", linear), ("stored", stored)):
                start = time.perf_counter()
                for w in weights:
                    F.linear(x, w)
                best[way] = min(best[way], (time.perf_counter() - start) / copies)
        gbs = {way: n_in * n_out * 4 / s / 1e9 for way, s in best.items()}
        print(f"| {name} ({n_in} -> {n_out}) | {best['linear'] * 1e6:,.0f} | {best['stored'] * 1e6:,.0f} | "
              f"{gbs['linear']:.1f} | {gbs['stored']:.1f} |")


def threads(rounds: int = 3, n: int = 200) -> None:
    """Tokens/s of the default model's greedy decoding at 2 threads: cached steps on both threads, on one, and
    recomputation."""
    import gpt.inference.decoding as decoding
    from gpt import GPT
    from gpt.model.config import GPTConfig

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256)).eval()
    prompt = torch.randint(0, 256, (1, 1))
    small = decoding.SMALL_STEP

    def both_threads():
        decoding.SMALL_STEP = 0  # every step counts as large: torch's 2 threads
        try:
            return decoding.generate(model, prompt, n, temperature=0.0)
        finally:
            decoding.SMALL_STEP = small

    ways = {"KV cache, steps on 2 threads": both_threads,
            "KV cache, steps on 1 (step_threads)": lambda: decoding.generate(model, prompt, n, temperature=0.0),
            "recompute, 2 threads": lambda: decoding.generate(model, prompt, n, temperature=0.0, kv_cache=False)}
    tokens = {name: fn() for name, fn in ways.items()}
    assert all(torch.equal(t, tokens["recompute, 2 threads"]) for t in tokens.values()), "tokens differ"
    print(f"default model (4 x 128), greedy, {n} new tokens after 1, 2 threads; tokens/s per round")
    for _ in range(rounds):
        row = []
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            row.append(f"{name} {n / (time.perf_counter() - start):,.0f}")
        print("; ".join(row))


def plain(rounds: int = 7) -> None:
    """Microseconds per one-token step of the default model, 1 thread, from 1 to 127 cached tokens: the general
    step (the model's modules) and PlainStep, each on its own cache after the same prefill; their logits must be
    equal at every step."""
    from gpt import GPT
    from gpt.inference.decoding import decode_step, prefill
    from gpt.inference.plain_step import plain_step
    from gpt.inference.weight_layout import gemv_layout
    from gpt.model.config import GPTConfig
    from gpt.model.kv_cache import KVCache

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256)).eval()
    gemv_layout(model)
    ways = {"modules (decode_step)": decode_step, "straight calls (PlainStep)": plain_step(model, decode_step)}

    @torch.no_grad()
    def steps(step) -> tuple[float, list[torch.Tensor]]:
        cache, token = KVCache(model.config, 1, "cpu"), torch.zeros(1, 1, dtype=torch.long)
        positions = torch.zeros(1, 1, dtype=torch.long)
        prefill(model, token, positions, None, cache)
        logits, start = [], time.perf_counter()
        for _ in range(model.config.block_size - 1):
            positions = positions + 1
            logits.append(step(model, token, positions, cache))
            token = logits[-1].argmax(-1, keepdim=True)
        return (time.perf_counter() - start) / (model.config.block_size - 1), logits

    print("default model (4 x 128), one-token steps after 1 cached token to 127, 1 thread; us per step per round")
    for _ in range(rounds):
        each = {name: steps(step) for name, step in ways.items()}
        same = all(map(torch.equal, *(logits for _, logits in each.values())))
        (a, _), (b, _) = each.values()
        print("; ".join(f"{name} {s * 1e6:,.0f}" for name, (s, _) in each.items())
              + f"; ratio {a / b:.2f}x; logits {'equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    {"gemv": gemv, "threads": threads, "plain": plain}[sys.argv[1]]()
