"""What the hook points cost with nothing attached (docs/interpret.md): one training step's forward and backward and
64 cached decoding steps of the default 96-wide, 4-layer model, one thread, median of 15 runs, plus the
cost of one idle hook point call. Run it once per source tree to compare:
PYTHONPATH=<tree> python benchmarks/hook_overhead.py <label>"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from gpt.model import GPT, GPTConfig
from gpt.model.kv_cache import KVCache


def median_ms(fn, reps: int = 15) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(label: str) -> None:
    torch.set_num_threads(1)
    config = GPTConfig(n_layer=4, n_head=4, n_embd=96, block_size=128, vocab_size=128, dropout=0.0)
    torch.manual_seed(0)
    model = GPT(config)
    x = torch.randint(0, 128, (8, 128))

    def train_step() -> None:
        model(x, x)[1].backward()

    def decode() -> None:
        with torch.no_grad():
            cache = KVCache(config, batch_size=1, device="cpu")
            for t in range(64):
                model(x[:1, t:t + 1], cache=cache)

    line = f"{label}: train step (8 x 128) {median_ms(train_step):.2f} ms, 64 decoding steps {median_ms(decode):.2f} ms"
    try:
        from gpt.model.hooks import HookPoint
    except ImportError:  # a tree from before the hook points
        print(line)
        return
    point, t = HookPoint(), torch.zeros(1)
    calls = sum(isinstance(m, HookPoint) for m in model.modules()) - 2 * config.n_layer  # scores, pattern: not called
    start = time.perf_counter()
    for _ in range(100_000):
        point(t)
    per_call_us = (time.perf_counter() - start) / 100_000 * 1e6
    print(f"{line}; an idle hook point {per_call_us:.3f} us a call, {calls} calls a forward pass")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this tree")
