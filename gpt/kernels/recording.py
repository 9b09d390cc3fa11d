"""Attention weights made visible: run a model with every layer's kernel swapped for one that records them.

Fused kernels (sdpa, flex) never materialise the weights, so the recorder recomputes them explicitly from
the q, k, v each layer hands its kernel (after RoPE, with GQA heads and the window and padding masks as
the kernel sees them). All kernels compute the same function, so the pictures hold for any of them.
A layer that computes its attention without a kernel (linear attention) appends its weights to ``recorded``
itself; a layer that calls its kernel more than once (differential attention) combines its calls into one
picture with its ``attention_map``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from gpt.kernels import scores as score_variants
from gpt.kernels.masks import combine, expand_kv


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


def recording_kernel(calls: list[Tensor]):
    """A kernel that appends its weights (B, H, Tq, Tk) to ``calls`` and returns what any kernel would."""

    def recorder(q, k, v, *, causal=True, mask=None, dropout_p=0.0, scale=None, window=None, **variants):
        weights = attention_weights(q, k, causal=causal, mask=mask, window=window, scale=scale, **variants)
        calls.append(weights.detach())
        _, v = expand_kv(q, v, v)
        return (weights @ v.float()).to(q.dtype)

    return recorder


@contextmanager
def record_attention(model: nn.Module) -> Iterator[list[Tensor]]:
    """Within the block, each forward pass appends every attention layer's weights (B, H, Tq, Tk), in order."""
    recorded: list[Tensor] = []
    layers = [m for m in model.modules() if hasattr(m, "kernel") and hasattr(m, "c_proj")]
    originals = [layer.kernel for layer in layers]
    hooks = []

    def finish(layer: nn.Module, calls: list[Tensor]) -> None:
        """After a layer's forward: its picture, from what it recorded (one map, or its own combination)."""
        if calls:
            combined = getattr(layer, "attention_map", None)
            recorded.append(combined(calls) if combined is not None and len(calls) > 1 else calls[0])
        calls.clear()

    for layer in layers:
        calls: list[Tensor] = []
        layer.kernel, layer.recorded = recording_kernel(calls), calls
        hooks.append(layer.register_forward_hook(lambda module, args, out, calls=calls: finish(module, calls)))
    try:
        yield recorded
    finally:
        for layer, kernel, hook in zip(layers, originals, hooks):
            layer.kernel = kernel
            del layer.recorded  # back to the class's None
            hook.remove()
