"""The serving engine's decode step over its cache pool (gpt.serve.cache_pool.SlotPool.decode), two ways in turns:
the general step through the model's modules and the pool's view of its stores, and GPT-2's layers as straight calls
(SlotPool.straight, gpt.inference.plain_step.PlainStep.pooled), which give the same logits bit for bit
(tests/serve/test_engine.py). One row, and 32 rows of different lengths (masked), no HTTP, no sampling.

    python benchmarks/pool_step.py CKPT [CKPT ...] [--rounds 5] [--threads 1]

CKPT: any checkpoint scripts/generate.py reads (bench_serve.py's write_random=<folder> writes random weights; GPT-2's
vocabulary needs tiktoken's r50k_base file, TIKTOKEN_CACHE_DIR).
Prints, per checkpoint and row count, the median milliseconds a step over the rounds, each round's, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not

from gpt.errors import UserError, report_user_errors  # noqa: E402
from gpt.inference.decoding import prefill  # noqa: E402
from gpt.inference.weight_layout import gemv_layout  # noqa: E402
from gpt.model.kv_cache import KVCache  # noqa: E402
from gpt.serve.cache_pool import SlotPool  # noqa: E402
from gpt.weights.load import load  # noqa: E402


def filled_pool(model, rows: int, straight: bool) -> SlotPool:
    """A pool whose rows hold contexts of 8, 11, 14, ... random tokens; ``straight`` False forces the general step."""
    pool = SlotPool(model, rows, torch.device("cpu"))
    if not straight:
        pool.straight = lambda model: None
    g = torch.Generator().manual_seed(0)
    for row in range(rows):
        n = 8 + 3 * row
        cache = KVCache(model.config, 1, "cpu")
        prefill(model, torch.randint(0, model.config.vocab_size, (1, n), generator=g), torch.arange(n)[None], None,
                cache)
        pool.insert(row, cache, n, 5)
    return pool


def step_ms(model, rows: int, straight: bool, steps: int) -> float:
    pool = filled_pool(model, rows, straight)
    with torch.no_grad():
        pool.decode(model)  # warm up
        start = time.perf_counter()
        for _ in range(steps):
            pool.decode(model)
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpts", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1:
        raise UserError("--rounds and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    for ckpt in args.ckpts:
        model = load(ckpt, "cpu").model
        gemv_layout(model)  # as the server stores the weights
        for rows in (1, 32):
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for straight in (False, True):
                    times[straight].append(step_ms(model, rows, straight, 40 if rows == 1 else 10))
            general, straight = (statistics.median(times[way]) for way in (False, True))
            print(f"{ckpt} rows={rows}: general {general:.3f} ms a step, straight {straight:.3f} ms, "
                  f"{general / straight:.2f}x (rounds: {', '.join(f'{t:.3f}' for t in times[False])} / "
                  f"{', '.join(f'{t:.3f}' for t in times[True])})")


if __name__ == "__main__":
    report_user_errors(main)
