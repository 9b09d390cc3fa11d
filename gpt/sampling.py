"""Autoregressive sampling: temperature, top-k, and a context window that slides past block_size."""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.model import GPT
from gpt.tokenizer import Tokenizer


def sample_next(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """Pick one token per row from (B, vocab) logits; temperature 0 means greedy."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.no_grad()
def generate(
    model: GPT,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Extend idx (B, T) by max_new_tokens tokens, recomputing the (last block_size) context each step."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    block_size = model.config.block_size
    for _ in range(max_new_tokens):
        context = idx[:, -block_size:]
        logits, _ = model(context)
        next_token = sample_next(logits[:, -1, :], temperature, top_k, generator)
        idx = torch.cat((idx, next_token), dim=1)
    return idx


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """Token ids of a prompt; an empty prompt starts from end-of-text (BPE) or a newline (characters)."""
    if prompt:
        return tokenizer.encode(prompt)
    if tokenizer.eot_token is not None:
        return [tokenizer.eot_token]
    if "\n" in getattr(tokenizer, "stoi", {}):
        return tokenizer.encode("\n")
    return [0]
