"""Can the base copy a passkey at all? A short fine-tune of a RoPE checkpoint on its training split, half of each
batch plain windows, half passkey sequences (gpt.evaluation.positions.passkey_examples: the key line at a random
depth, again at the end, the loss on the final digits only), then passkey retrieval on the held-out split at the
trained length (the same measurement as scripts/eval.py task=passkey), the held-out loss at that length (the text
is still modelled), and the tuned weights with YaRN applied and no further tuning at ``--length``.

    python benchmarks/passkey_finetune.py runs/base900 --steps 150 \\
        --out benchmarks/results/long_context/ext900/passkey_finetune.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from gpt.evaluation.inputs import open_data  # noqa: E402
from gpt.evaluation.positions import IGNORE, loss_by_position, passkey, passkey_examples  # noqa: E402
from gpt.model import GPT  # noqa: E402
from gpt.weights.load import load  # noqa: E402

KEY = "\nPASSKEY = "


def measured(model: GPT, tokenizer, val, length: int) -> dict:
    """Passkey retrieval (100 held-out sequences, 4 digits) and the held-out loss (64 windows) at ``length``."""
    cpu = torch.device("cpu")
    model.eval()
    return {"passkey": passkey(model, tokenizer, val, [length], 100, 4, KEY, 0, 8, cpu)["lengths"][str(length)],
            "loss": loss_by_position(model, val, length, 64, 1, 8, cpu)["loss"]}


def batch(tokenizer, train, block: int, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n plain windows of the training split, then n passkey sequences on it: inputs and targets (block each)."""
    starts = rng.integers(0, len(train) - block - 1, size=n)
    plain = np.stack([np.asarray(train[s:s + block + 1], dtype=np.int64) for s in starts])
    x, y = passkey_examples(tokenizer, train, block, n, 4, KEY, rng)
    return (torch.from_numpy(np.concatenate([plain[:, :-1], x])),
            torch.from_numpy(np.concatenate([plain[:, 1:], y.astype(np.int64)])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--per-kind", type=int, default=8, help="plain windows and passkey sequences per batch")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--length", type=int, default=1024, help="the YaRN length measured after (no tuning)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer, _ = load(args.ckpt, "cpu")
    block = model.config.block_size
    train = open_data(None, None, args.ckpt, tokenizer, "train", block).splits["train"]
    val = open_data(None, None, args.ckpt, tokenizer, "val", args.length).splits["val"]
    result = {"ckpt": args.ckpt, "args": {k: str(v) for k, v in vars(args).items()},
              "load_average_start": os.getloadavg(), "before": measured(model, tokenizer, val, block)}
    print("before:", result["before"], flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng, started = np.random.default_rng(1), time.perf_counter()
    model.train()
    for step in range(args.steps):
        x, y = batch(tokenizer, train, block, args.per_kind, rng)
        logits, _ = model(x)
        n = args.per_kind  # the mean of the two halves' losses: the passkey's few targets weigh as much as the text
        loss = (F.cross_entropy(logits[:n].flatten(0, 1), y[:n].flatten())
                + F.cross_entropy(logits[n:].flatten(0, 1), y[n:].flatten(), ignore_index=IGNORE)) / 2
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}, {time.perf_counter() - started:.0f} s", flush=True)
    result["after"] = measured(model, tokenizer, val, block)
    print("after:", result["after"], flush=True)
    scaling = {"rope_type": "yarn", "factor": args.length / block, "original_max_position_embeddings": block}
    options = {**model.config.design_options, "rope": {**model.config.design_options["rope"], "scaling": scaling}}
    scaled = GPT(replace(model.config, block_size=args.length, design_options=options))
    scaled.load_state_dict(model.state_dict())
    result["yarn_untuned"] = measured(scaled, tokenizer, val, args.length)
    print(f"YaRN x{args.length / block:g}, no tuning, at {args.length}:", result["yarn_untuned"], flush=True)
    result["load_average_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
