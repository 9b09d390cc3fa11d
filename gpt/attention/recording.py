"""Attention weights made visible: run a model with every layer's kernel swapped for one that records them.

Fused kernels (sdpa, flex) never materialise the weights, so the recorder recomputes them explicitly from
the q, k, v each layer hands its kernel (after RoPE, with GQA heads and the window and padding masks as
the kernel sees them). All kernels compute the same function, so the pictures hold for any of them.
A layer with causal linear attention (no kernel) has its ``linear_kernel`` swapped instead; a differential
layer (diff_attn) calls its kernel twice, so it records two maps (gpt.visualize combines them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from gpt.attention import scores as score_variants
from gpt.attention.linear import linear_weights
from gpt.attention.masks import combine, expand_kv


def attention_weights(
    q: Tensor, k: Tensor, *, causal: bool = True, mask: Tensor | None = None, window: int | None = None,
    scale: float | None = None, softcap: float | None = None, bias: Tensor | None = None, sink: Tensor | None = None,
) -> Tensor:
    """softmax(q k^T * scale) under the causal/window/padding rules and the score variants (soft-cap, bias, sink):
    (B, H, Tq, Tk), empty rows all zero."""
    k, _ = expand_kv(q, k, k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = score_variants.modify((q.float() @ k.float().transpose(-2, -1)) * scale, softcap, bias)
    allowed = combine(q.size(-2), k.size(-2), causal, mask, q.device, window)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = score_variants.softmax(scores, sink)
    return weights if allowed is None else weights.masked_fill(~allowed, 0.0)


@contextmanager
def record_attention(model: nn.Module) -> Iterator[list[Tensor]]:
    """Within the block, each forward pass appends every attention layer's weights (B, H, Tq, Tk), in order."""
    recorded: list[Tensor] = []
    layers = [m for m in model.modules() if hasattr(m, "kernel") and hasattr(m, "c_proj")]
    originals = [(layer.kernel, getattr(layer, "linear_kernel", None)) for layer in layers]

    def recorder(q, k, v, *, causal=True, mask=None, dropout_p=0.0, scale=None, window=None, **variants):
        weights = attention_weights(q, k, causal=causal, mask=mask, window=window, scale=scale, **variants)
        recorded.append(weights.detach())
        _, v = expand_kv(q, v, v)
        return (weights @ v.float()).to(q.dtype)

    def linear_recorder(original):
        def record(q, k, v, feature="elu1", state=None, key_mask=None):
            recorded.append(linear_weights(q, k, feature, key_mask).detach())  # these tokens' own keys
            return original(q, k, v, feature, state, key_mask)
        return record

    for layer, (_, linear) in zip(layers, originals):
        layer.kernel = recorder
        if linear is not None:
            layer.linear_kernel = linear_recorder(linear)
    try:
        yield recorded
    finally:
        for layer, (kernel, linear) in zip(layers, originals):
            layer.kernel = kernel
            if linear is not None:
                layer.linear_kernel = linear
