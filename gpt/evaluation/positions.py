"""Long-context evaluation on held-out text: the loss by position (``task=positions``) and passkey retrieval at
lengths (``task=passkey``), both possibly past the model's training length (scripts/eval.py, docs/long-context.md).

Loss by position: ``windows`` windows of ``length + 1`` tokens spread evenly over the split; each position's loss is
the mean over windows of the cross-entropy of its next token, given what precedes it in its own window; the buckets
are equal slices of the positions. Passkey: the capability probe's layout (place_passkey, with which the probe's
synthetic passkey task builds its sequences too) on the corpus's own text, the key line in the corpus's tokens.
A model whose positions are a learned table (GPT-2's wpe) has none past its block_size: longer lengths are refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from gpt.errors import ConfigError, UserError
from gpt.model import GPT
from gpt.tokenizers.tokenizer import Tokenizer

IGNORE = -1  # gpt.model.gpt.GPT's cross-entropy ignore_index


def check_length(model: GPT, length: int) -> None:
    """Refuse a length past block_size for a model with a learned position table."""
    if length > model.config.block_size and "wpe" in model.transformer:
        raise ConfigError(f"length {length} is past the model's block_size {model.config.block_size} and its "
                          "positions are a learned table (no rope or alibi in model.designs) with no rows beyond it",
                          hint=f"lengths up to {model.config.block_size}, or a RoPE or ALiBi model")


def spread_starts(n_tokens: int, length: int, windows: int) -> np.ndarray:
    """``windows`` start offsets spread evenly over a split of n_tokens for windows of length + 1 tokens."""
    last = n_tokens - length - 1
    if last < 0:
        raise UserError(f"the split has {n_tokens} tokens, fewer than one window of length + 1 = {length + 1}",
                        hint="a shorter length, or a larger split")
    return np.linspace(0, last, num=windows).round().astype(np.int64)


@torch.no_grad()
def token_losses(model: GPT, inputs: torch.Tensor, targets: torch.Tensor, autocast=None) -> torch.Tensor:
    """(B, T) float64 cross-entropy of each target (0 where IGNORE), positions 0 .. T - 1 (past block_size too)."""
    model.eval()
    positions = torch.arange(inputs.size(1), device=inputs.device).expand_as(inputs)
    with autocast or contextlib.nullcontext():
        logits, _ = model(inputs, positions=positions)
    losses = F.cross_entropy(logits.double().flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                             reduction="none")
    return losses.view_as(targets)


def loss_by_position(model: GPT, tokens, length: int, windows: int, buckets: int, batch_size: int,
                     device: torch.device, autocast=None,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    """Mean loss at each position over the windows, in ``buckets`` equal slices of [0, length), and overall."""
    check_length(model, length)
    if buckets > length:
        raise ConfigError(f"buckets={buckets} is more than the {length} positions", hint=f"buckets <= {length}")
    starts = spread_starts(len(tokens), length, windows)
    total = torch.zeros(length, dtype=torch.float64)
    for first in range(0, len(starts), batch_size):
        group = starts[first:first + batch_size]
        xy = torch.from_numpy(np.stack([np.asarray(tokens[s:s + length + 1], dtype=np.int64) for s in group]))
        xy = xy.to(device)
        total += token_losses(model, xy[:, :-1], xy[:, 1:], autocast).sum(0).cpu()
        if progress:
            progress(min(first + batch_size, len(starts)), len(starts))
    per_position = total / len(starts)
    edges = np.linspace(0, length, buckets + 1).round().astype(int)
    table = [{"start": int(a), "end": int(b), "loss": float(per_position[a:b].mean())}
             for a, b in zip(edges[:-1], edges[1:])]
    return {"length": length, "windows": len(starts), "loss": float(per_position.mean()), "buckets": table}


def place_passkey(seq: np.ndarray, key: np.ndarray, query: np.ndarray, digits: np.ndarray,
                  depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Passkey sequences from (n, L + 1) filler ``seq`` (changed in place): ``key`` then the (n, d) ``digits`` at each
    row's ``depth``, ``query`` then the digits again at the end; next-token inputs and targets, the targets IGNORE but
    on the final digits (Mohtashami and Jaggi's task: the answer is the key seen earlier)."""
    n, d = digits.shape
    rows = np.arange(n)[:, None]
    seq[rows, depth[:, None] + np.arange(len(key) + d)] = np.concatenate([np.broadcast_to(key, (n, len(key))), digits],
                                                                         axis=1)
    tail = seq.shape[1] - d - len(query)
    seq[:, tail:tail + len(query)] = query
    seq[:, tail + len(query):] = digits
    targets = np.full((n, seq.shape[1] - 1), IGNORE, dtype=seq.dtype)
    targets[:, -d:] = digits
    return seq[:, :-1].copy(), targets


def passkey_examples(tokenizer: Tokenizer, tokens, length: int, n: int, digits: int, key_text: str,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` passkey sequences of ``length`` tokens on the split's text, ``key_text`` and the digits at a random
    depth and again at the end: inputs and targets (the final digits; IGNORE elsewhere)."""
    starts = rng.integers(0, len(tokens) - length - 1, size=n)
    filler = np.stack([np.asarray(tokens[s:s + length + 1], dtype=np.int64) for s in starts])
    return draw_passkey(filler, *passkey_tokens(tokenizer, length, digits, key_text), digits, rng)


def passkey_tokens(tokenizer: Tokenizer, length: int, digits: int, key_text: str) -> tuple[np.ndarray, np.ndarray]:
    """The key line's tokens and the ten digits' (one token each), checked to fit twice in ``length`` tokens."""
    key = tokenizer.encode(key_text)
    digit_ids = [tokenizer.encode(str(d)) for d in range(10)]
    if any(len(ids) != 1 for ids in digit_ids):
        raise UserError("the tokenizer does not write each digit 0-9 as one token, which the passkey needs")
    if length + 1 - 2 * (len(key) + digits) < 1:
        raise ConfigError(f"passkey: the key line twice ({2 * (len(key) + digits)} tokens) does not fit in length "
                          f"{length}", hint=f"lengths above {2 * (len(key) + digits)}")
    return np.array(key, dtype=np.int64), np.array(digit_ids, dtype=np.int64)[:, 0]


def draw_passkey(filler: np.ndarray, key: np.ndarray, digit_ids: np.ndarray, digits: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Passkey sequences on (n, L + 1) ``filler`` (changed in place): random digits at a random depth (``rng``)."""
    n = len(filler)
    drawn = digit_ids[rng.integers(0, 10, size=(n, digits))]
    depth = rng.integers(0, filler.shape[1] - 2 * (len(key) + digits), size=n)
    return place_passkey(filler, key, key, drawn, depth)


@torch.no_grad()
def passkey(model: GPT, tokenizer: Tokenizer, tokens, lengths: list[int], examples: int, digits: int, key_text: str,
            seed: int, batch_size: int, device: torch.device, autocast=None) -> dict:
    """Per length: the fraction of passkey digits the model's argmax gets right, and of whole keys."""
    results = {}
    for length in lengths:
        check_length(model, length)
        if len(tokens) < length + 2:
            raise UserError(f"the split has {len(tokens)} tokens, fewer than one passkey sequence of {length + 1}")
        inputs, targets = passkey_examples(tokenizer, tokens, length, examples, digits, key_text,
                                           np.random.default_rng([seed, length]))
        right = []
        for first in range(0, examples, batch_size):
            x = torch.from_numpy(inputs[first:first + batch_size]).to(device)
            y = torch.from_numpy(targets[first:first + batch_size]).to(device)
            positions = torch.arange(x.size(1), device=device).expand_as(x)
            model.eval()
            with autocast or contextlib.nullcontext():
                logits, _ = model(x, positions=positions)
            right.append((logits.argmax(-1) == y)[:, -digits:].cpu())
        hits = torch.cat(right)
        results[str(length)] = {"digits": float(hits.double().mean()), "keys": float(hits.all(dim=1).double().mean())}
    return {"examples": examples, "digits": digits, "key": key_text, "lengths": results}
