"""The built-in attention kernels. Each is a separate, complete formulation of the same function."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt.attention.masks import combine, expand_kv
from gpt.attention.registry import register


@register("manual")
def manual(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Explicit scores, -inf where not allowed, softmax, dropout, weighted sum of the values."""
    k, v = expand_kv(q, k, v)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    allowed = combine(q.size(-2), k.size(-2), causal, mask, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if allowed is not None:
        # A row with nothing allowed is all NaN after softmax; zero it (and every masked entry).
        weights = weights.masked_fill(~allowed, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


@register("sdpa")
def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """torch's scaled_dot_product_attention, which dispatches to flash / memory-efficient kernels."""
    gqa = q.size(1) != k.size(1)
    t_q, t_k = q.size(-2), k.size(-2)
    if mask is None and (not causal or t_q == t_k):
        # The fast path: no explicit mask, so flash attention stays eligible.
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    # torch's is_causal is top-left aligned, so Tq < Tk (a cached decode step) needs an explicit mask.
    allowed = combine(t_q, t_k, causal, mask, q.device)
    empty_rows = ~allowed.any(dim=-1, keepdim=True)
    if empty_rows.any():
        # Let empty rows attend everywhere (keeps the softmax finite), then zero their output.
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed | empty_rows, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
        )
        return out.masked_fill(empty_rows, 0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
