"""A full pass over held-out tokens: every token but the first scored exactly once.

The split is cut into windows of block_size tokens; window w reads tokens [a, b) and predicts [a + 1, b + 1).
With stride = block_size (the default) the windows do not overlap and each token's context is what precedes
it in its own window. A smaller stride overlaps them: each window scores only the targets no earlier window
scored, so those get at least block_size - stride tokens of context (the Hugging Face perplexity recipe).

Bits per byte divides the summed loss (in bits) by the UTF-8 bytes of the scored targets, so it compares
models whatever their tokenizer: a character model and a GPT-2-token model on the same text. End-of-text
and other special tokens count their loss but no bytes (they stand for no text).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gpt.tokenizers.tokenizer import Tokenizer


@dataclass
class HeldOut:
    """The result of a full pass; ``loss`` in nats per scored token."""

    loss: float
    ppl: float  # exp(loss)
    bpb: float  # total nats / ln 2 / bytes
    tokens: int  # targets scored (every token of the split but the first)
    bytes: int  # UTF-8 bytes of the scored targets
    windows: int
    block_size: int
    stride: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def byte_lengths(tokenizer: Tokenizer, vocab_size: int) -> np.ndarray:
    """UTF-8 bytes behind each token id (0 for end-of-text and other special tokens, and for ids past the
    tokenizer's, e.g. padding)."""
    lengths = np.zeros(vocab_size, dtype=np.int64)
    special = {tokenizer.eot_token, *getattr(tokenizer, "special_tokens", {}).values()}
    for token in range(min(vocab_size, tokenizer.vocab_size)):
        if token not in special:
            lengths[token] = len(tokenizer.token_bytes(token))
    return lengths


def window_plan(n_tokens: int, block_size: int, stride: int) -> list[tuple[int, int, int]]:
    """(a, b, first): window input tokens [a, b), targets [a + 1, b + 1), scored from target index ``first``."""
    if n_tokens < 2:
        return []
    plan, scored, a = [], 0, 0  # targets [1, scored] are done
    while scored < n_tokens - 1:
        b = min(a + block_size, n_tokens - 1)
        plan.append((a, b, scored - a))  # y[first:] are the targets after `scored`
        scored, a = b, a + stride
    return plan


@torch.no_grad()
def full_pass(model: nn.Module, tokens: Sequence[int] | np.ndarray, tokenizer: Tokenizer, *, block_size: int,
              batch_size: int = 8, stride: int | None = None, device: torch.device | str = "cpu",
              autocast: contextlib.AbstractContextManager | None = None,
              progress: Callable[[int, int], None] | None = None) -> HeldOut:
    """Score every target of ``tokens`` once with ``model`` (returns (logits, loss) like GPT); see the module doc."""
    stride = stride or block_size
    if not 0 < stride <= block_size:
        raise ValueError(f"stride must be in [1, block_size={block_size}], got {stride}")
    plan = window_plan(len(tokens), block_size, stride)
    table = torch.from_numpy(byte_lengths(tokenizer, model.config.vocab_size)).to(device)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # nats, bytes, targets
    model.eval()
    for done, group in batches(plan, batch_size):
        x, y, scored = stack(tokens, group, device)  # (B, T), (B, T), (B, T) bool
        with autocast or contextlib.nullcontext():
            logits, _ = model(x)  # (B, T, vocab)
        losses = F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="none").view_as(y)
        totals += torch.stack([losses[scored].sum(), table[y[scored]].sum().double(), scored.sum().double()])
        if progress is not None:
            progress(done, len(plan))
    nats, n_bytes, n_targets = totals.tolist()
    loss = nats / max(n_targets, 1)
    return HeldOut(loss=loss, ppl=math.exp(loss), bpb=nats / math.log(2) / max(n_bytes, 1), tokens=int(n_targets),
                   bytes=int(n_bytes), windows=len(plan), block_size=block_size, stride=stride)


def batches(plan: list[tuple[int, int, int]], batch_size: int) -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
    """Up to batch_size windows of one length at a time (only the last window may be shorter), with a running count."""
    done = 0
    while done < len(plan):
        length = plan[done][1] - plan[done][0]
        group = [w for w in plan[done : done + batch_size] if w[1] - w[0] == length]
        done += len(group)
        yield done, group


def stack(tokens, group: list[tuple[int, int, int]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, targets and the mask of targets to score of equal-length windows, as (B, T) tensors on ``device``."""
    chunks = torch.from_numpy(np.stack([np.asarray(tokens[a : b + 1], dtype=np.int64) for a, b, _ in group]))
    chunks = chunks.to(device)
    positions = torch.arange(chunks.shape[1] - 1, device=device)
    scored = positions[None, :] >= torch.tensor([first for _, _, first in group], device=device)[:, None]
    return chunks[:, :-1], chunks[:, 1:], scored
