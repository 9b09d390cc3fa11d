"""Autoregressive sampling: temperature, top-k, nucleus (top-p), stop tokens, a sliding context window."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from gpt.errors import ConfigError
from gpt.model import GPT
from gpt.tokenizer import Tokenizer


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse sampling settings that have no meaning, naming the setting."""
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k <= 0:
        raise ConfigError(f"top_k must be a positive integer or null, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def filter_logits(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Set to -inf every logit outside the top k, and outside the smallest set whose probability exceeds top_p."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits.float(), dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits.float(), dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row from (B, vocab) logits; temperature 0 means greedy. Returns (B, 1)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1, generator=generator)


@torch.no_grad()
def stream(
    model: GPT,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    stop_token: int | None = None,
) -> Iterator[Tensor]:
    """Yield the next token of every row of idx (B, T) as a (B, 1) tensor, one step at a time.

    The context is the last block_size tokens. Stops early once every row has produced stop_token.
    """
    check_sampling(temperature, top_k, top_p)
    block_size = model.config.block_size
    finished = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -block_size:])
        next_token = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)
        idx = torch.cat((idx, next_token), dim=1)
        yield next_token
        if stop_token is not None:
            finished |= next_token.squeeze(1) == stop_token
            if finished.all():
                return


def generate(model: GPT, idx: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
    """idx (B, T) extended by up to max_new_tokens sampled tokens; keyword arguments as for stream()."""
    new = list(stream(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx, *new], dim=1)


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """Token ids of a prompt; an empty prompt starts from end-of-text (BPE) or a newline (characters)."""
    if prompt:
        return tokenizer.encode(prompt)
    if tokenizer.eot_token is not None:
        return [tokenizer.eot_token]
    if "\n" in getattr(tokenizer, "stoi", {}):
        return tokenizer.encode("\n")
    return [0]
