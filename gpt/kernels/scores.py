"""The score variants, for kernels that form the scores explicitly: logit soft-capping, an additive bias, a sink.

scores (..., Tq, Tk) are the scaled dot products q.k / sqrt(D). ``modify`` caps them (Gemma 2) and adds the
bias (ALiBi); ``softmax`` normalises each row, with an optional sink logit that joins the row's softmax and
takes its share of the weight but carries no value, so a query may attend "nowhere" (attention sinks).
"""

from __future__ import annotations

import torch
from torch import Tensor


def modify(scores: Tensor, softcap: float | None = None, bias: Tensor | None = None) -> Tensor:
    """softcap * tanh(scores / softcap) (bounded in (-softcap, softcap)), then + bias (broadcast to the scores)."""
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias  # a float32 bias promotes bf16 scores: ALiBi's large distances keep their precision
    return scores


def softmax(scores: Tensor, sink: Tensor | None = None) -> Tensor:
    """Softmax over the last dimension; with sink (H,) for scores (B, H, Tq, Tk) (or (1,) for one head's (B, Tq, Tk))
    each row is normalised together with exp(sink[h]), whose weight is then dropped: rows sum to less than one.

    A row whose scores are all -inf gives all its weight to the sink (zeros, not NaN).
    """
    if sink is None:
        return torch.softmax(scores, dim=-1)
    column = sink.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)  # (..., H, Tq, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
