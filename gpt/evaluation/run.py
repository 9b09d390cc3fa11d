"""The body of scripts/eval.py: load the model, run the task, print a table, write the JSON file atomically."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gpt.device import autocast, resolve_device, resolve_precision
from gpt.errors import ConfigError, UserError
from gpt.evaluation import hellaswag, positions
from gpt.evaluation.config import EvalConfig
from gpt.evaluation.heldout import full_pass
from gpt.evaluation.inputs import open_data
from gpt.files import atomic_write
from gpt.model import GPT
from gpt.tokenizers.tokenizer import Tokenizer
from gpt.weights.load import load


@contextlib.contextmanager
def progress_bar(what: str, unit: str) -> Iterator[Callable[[int, int], None]]:
    """A progress callback (done, total) drawing a bar on stderr when it is a terminal."""
    bar = tqdm(desc=what, unit=unit, disable=None, file=sys.stderr, leave=False, dynamic_ncols=True)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.refresh()
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


def run(cfg: EvalConfig) -> dict[str, Any]:
    """scripts/eval.py: score cfg.ckpt on cfg.task; prints a table, writes cfg.out; returns the results."""
    out = Path(cfg.out) if cfg.out is not None else None
    if out is not None and not out.parent.is_dir():  # before any work
        raise UserError(f"the folder of out={out} does not exist", hint="create it or write elsewhere")
    device = resolve_device(cfg.device.type)
    precision = resolve_precision(cfg.precision, device)
    ctx = autocast(device, precision)
    model, tokenizer, _ = load(cfg.ckpt, device, init_path=cfg.init_path)
    started = time.perf_counter()
    task = {"heldout": run_heldout, "hellaswag": run_hellaswag, "positions": run_positions,
            "passkey": run_passkey}[cfg.task]
    results = {"ckpt": cfg.ckpt, **task(cfg, model, tokenizer, device, ctx),
               "seconds": round(time.perf_counter() - started, 3), "device": str(device),
               "precision": precision}
    print(table(results))
    if out is not None:
        text = json.dumps(results, indent=2) + "\n"
        atomic_write(out, lambda f: f.write(text.encode()), what="the evaluation results")
        print(f"wrote {out}")
    return results


def run_heldout(cfg: EvalConfig, model: GPT, tokenizer: Tokenizer, device: torch.device, ctx) -> dict[str, Any]:
    """The full pass over cfg.split of the data (the first cfg.limit windows only, if given)."""
    block = model.config.block_size
    stride = cfg.stride or block
    if stride > block:
        raise ConfigError(f"stride must be at most the model's block_size {block}, got {stride}")
    data = open_data(cfg.data, cfg.data_dir, cfg.ckpt, tokenizer, cfg.split, block)
    tokens = data.splits[cfg.split]
    if cfg.limit is not None:  # exactly `limit` windows
        tokens = tokens[: (cfg.limit - 1) * stride + block + 1]
    with progress_bar("held-out pass", "window") as progress:
        result = full_pass(model, tokens, tokenizer, block_size=block, batch_size=cfg.batch_size, stride=stride,
                           device=device, autocast=ctx, progress=progress)
    return {"task": "heldout", "data": str(data.dir), "split": cfg.split, **result.as_dict()}


def run_hellaswag(cfg: EvalConfig, model: GPT, tokenizer: Tokenizer, device: torch.device, ctx) -> dict[str, Any]:
    """HellaSwag scored as lm-evaluation-harness does (the first cfg.limit examples only, if given)."""
    path = hellaswag.locate(cfg.hellaswag.path, cfg.hellaswag.cache_dir)
    examples = hellaswag.read(path, cfg.limit)
    with progress_bar("hellaswag", "choice") as progress:
        scores = hellaswag.evaluate(model, tokenizer, examples, batch_size=cfg.batch_size, device=device,
                                    autocast=ctx, progress=progress)
    return {"task": "hellaswag", "data": str(path), **scores}


def run_positions(cfg: EvalConfig, model: GPT, tokenizer: Tokenizer, device: torch.device, ctx) -> dict[str, Any]:
    """Loss by position over windows of cfg.long.length (past block_size for RoPE and ALiBi) of cfg.split."""
    length = cfg.long.length or model.config.block_size
    data = open_data(cfg.data, cfg.data_dir, cfg.ckpt, tokenizer, cfg.split, length)
    with progress_bar("loss by position", "window") as progress:
        result = positions.loss_by_position(model, data.splits[cfg.split], length, cfg.long.windows,
                                            cfg.long.buckets, cfg.batch_size, device, ctx, progress)
    return {"task": "positions", "data": str(data.dir), "split": cfg.split, **result}


def run_passkey(cfg: EvalConfig, model: GPT, tokenizer: Tokenizer, device: torch.device, ctx) -> dict[str, Any]:
    """Passkey retrieval on cfg.split's text at each of cfg.long.lengths (default: the model's block_size)."""
    lengths = list(cfg.long.lengths) or [model.config.block_size]
    data = open_data(cfg.data, cfg.data_dir, cfg.ckpt, tokenizer, cfg.split, max(lengths) + 1)
    result = positions.passkey(model, tokenizer, data.splits[cfg.split], lengths, cfg.long.examples,
                               cfg.long.digits, cfg.long.key, cfg.long.seed, cfg.batch_size, device, ctx)
    return {"task": "passkey", "data": str(data.dir), "split": cfg.split, **result}


LABELS = {
    "loss": "loss (nats per token)", "ppl": "perplexity", "bpb": "bits per byte", "tokens": "tokens scored",
    "bytes": "bytes of those tokens", "windows": "windows", "block_size": "block size", "stride": "stride",
    "acc": "acc (summed log-likelihood)", "acc_stderr": "acc standard error",
    "acc_norm": "acc_norm (log-likelihood / characters)", "acc_norm_stderr": "acc_norm standard error",
    "examples": "examples", "length": "window length", "digits": "passkey digits", "seconds": "time (s)",
}


def table(results: dict[str, Any]) -> str:
    """The results as a two-column Markdown table under a title line."""
    title = f"{results['task']}: {results['ckpt']} on {results['data']}" + (
        f" ({results['split']} split)" if "split" in results else "")
    rows = [(LABELS[k], format_value(v)) for k, v in results.items() if k in LABELS]
    rows += [(f"loss at positions {b['start']}-{b['end'] - 1}", format_value(b["loss"]))
             for b in results.get("buckets", [])]
    for length, scores in results.get("lengths", {}).items():
        rows += [(f"passkey at {int(length):,}: digits right", format_value(scores["digits"])),
                 (f"passkey at {int(length):,}: whole keys right", format_value(scores["keys"]))]
    if results.get("stride") is not None and results["stride"] < results.get("block_size", 0):
        rows.append(("windows overlap", "yes"))
    width, value_width = max(len(label) for label, _ in rows), max(len("value"), *(len(v) for _, v in rows))
    lines = [f"| {label.ljust(width)} | {value.rjust(value_width)} |" for label, value in rows]
    head = f"| {'metric'.ljust(width)} | {'value'.rjust(value_width)} |"
    return "\n".join([title, head, f"|{'-' * (width + 2)}|{'-' * (value_width + 1)}:|", *lines])


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"
