"""Logits to a token: temperature, top-k and nucleus (top-p) filtering, greedy or random choice.

The decoding loop that feeds the model and calls these is gpt.inference.decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.errors import ConfigError


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse sampling settings that have no meaning, naming the setting."""
    if not temperature >= 0:  # NaN too
        raise ConfigError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and not top_k > 0:
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
        # Drop a token when the tokens ranked above it already reach top_p. The first always stays, also when
        # top_p is so small (subnormal) that it rounds to 0 in float32 and "0 >= top_p" would drop it too.
        drop_sorted = (cumulative - torch.softmax(sorted_logits.float(), dim=-1)) >= top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """The distribution a token is drawn from (temperature > 0): softmax of the filtered logits / temperature."""
    # The best logit is 0 before dividing, so a tiny temperature sends the others to -inf, never to +inf; one below
    # float32's smallest normal (a subnormal, which float32 reads as 0) is taken as that smallest normal: the same
    # all but greedy choice, where dividing by 0 made NaN probabilities.
    logits = logits.float()
    logits = logits - logits.max(dim=-1, keepdim=True).values
    logits = filter_logits(logits / max(temperature, torch.finfo(torch.float32).tiny), top_k, top_p)
    return torch.softmax(logits, dim=-1)


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
    return torch.multinomial(probabilities(logits, temperature, top_k, top_p), num_samples=1, generator=generator)


def sample_rows(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generators: list[torch.Generator]) -> Tensor:
    """Like sample_next, but row i draws with generators[i]: each row gets the token sample_next would give it alone
    with that generator (a server's requests, batched, each with its own seed). Returns (B, 1)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = probabilities(logits, temperature, top_k, top_p)  # (B, vocab), computed once for the rows
    return torch.cat([torch.multinomial(probs[i : i + 1], 1, generator=g) for i, g in enumerate(generators)])
