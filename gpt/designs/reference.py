"""Float64 references: each attention layer written out one query and one head at a time, without the model's
helpers, for the contract tests (tests/designs/test_designs.py) to hold every kernel and design to.

The core's softmax attention is here, and calls the parts' reference hooks (Design.ref_qk, ref_score, ref_sink,
ref_keys) where the model calls their hooks; a layer design writes its whole layer (Design.reference) from the
same pieces. Slow on purpose: tiny models only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from gpt.model import design as registry


def layer(attn: nn.Module, x: Tensor, config: Any) -> Tensor:
    """The float64 output (B, T, C) of the attention layer ``attn`` of ``config`` for the input x (B, T, C)."""
    own = next((d for d in registry.active(config) if d.layer is not None), None)
    return own.reference(attn, x, config) if own is not None else softmax_layer(attn, x, config)


def project(linear: nn.Linear, x: Tensor) -> Tensor:
    """x W^T + b in float64."""
    out = x @ linear.weight.double().T
    return out if linear.bias is None else out + linear.bias.double()


def output(attn: nn.Module, config: Any, x: Tensor, y: Tensor) -> Tensor:
    """The heads' outputs y (B, T, H, D) through the parts' output changes (a gate, given the layer input x), then
    c_proj: the end of every layer's reference."""
    y = y.flatten(2)
    for part in registry.active(config):
        y = part.ref_output(attn, y, x)
    return project(attn.c_proj, y)


def heads(attn: nn.Module, x: Tensor, config: Any) -> tuple[Tensor, Tensor, Tensor]:
    """c_attn's q (B, T, H, D), k and v (B, T, Hkv, D)."""
    H, D, C, Hkv = config.n_head, config.head_dim, config.n_embd, config.n_kv_head
    qkv = project(attn.c_attn, x)
    k, v = qkv[..., C:].unflatten(-1, (2 * Hkv, D)).split(Hkv, dim=2)
    return qkv[..., :C].unflatten(-1, (H, D)), k, v


def queries(config: Any, x: Tensor) -> Iterator[tuple[int, int, int, int]]:
    """(b, h, kv, i) for every row b, query head h (reading key/value head kv) and query position i of x (B, T, C)."""
    group = config.n_head // config.n_kv_head
    for b in range(x.size(0)):
        for h in range(config.n_head):
            for i in range(x.size(1)):
                yield b, h, h // group, i


def keys_of(config: Any, i: int) -> list[int]:
    """The keys query i sees: the causal window, then what the parts add (sink tokens)."""
    first = 0 if config.window is None else max(0, i - config.window + 1)
    keys = list(range(first, i + 1))
    for part in registry.active(config):
        keys = part.ref_keys(config, i, keys)
    return keys


def transformed(attn: nn.Module, config: Any, x: Tensor, position: int, kind: str) -> Tensor:
    """One query or key vector through the parts' transforms, in their order (QK-norm, then RoPE)."""
    for part in registry.active(config):
        x = part.ref_qk(attn, x, position, kind)
    return x


def softmax(attn: nn.Module, config: Any, s: Tensor, i: int, keys: list[int], head: int, values: Tensor) -> Tensor:
    """The parts' score modifiers on query i's scores s (len(keys),), the softmax (with the parts' sinks in the
    denominator), the weighted sum of values (len(keys), Dv)."""
    return weights(attn, config, s, i, keys, head) @ values


def weights(attn: nn.Module, config: Any, s: Tensor, i: int, keys: list[int], head: int) -> Tensor:
    """Query i's attention weights (len(keys),): the parts' score modifiers on its scores s, then the softmax with
    the parts' sinks in the denominator."""
    parts = registry.active(config)
    for part in parts:
        s = part.ref_score(attn, s, i, keys, head)
    e = torch.exp(s)
    return e / (e.sum() + sum(part.ref_sink(attn, head) for part in parts))


def pattern(attn: nn.Module, x: Tensor, config: Any) -> Tensor:
    """The float64 attention pattern (B, H, T, T) the layer ``attn`` shows for x (B, T, C): what hook_pattern holds
    (gpt.interpret), the declared one of a layer design (Design.ref_pattern)."""
    own = next((d for d in registry.active(config) if d.layer is not None), None)
    return own.ref_pattern(attn, x, config) if own is not None else softmax_pattern(attn, x, config)


def softmax_pattern(attn: nn.Module, x: Tensor, config: Any) -> Tensor:
    """GPT-2's attention weights with the active parts, one query and head at a time: (B, H, T, T)."""
    q, k, _ = heads(attn, x, config)
    out = torch.zeros(x.size(0), config.n_head, x.size(1), x.size(1), dtype=torch.float64)
    for b, h, kv, i in queries(config, x):
        keys = keys_of(config, i)
        qi = transformed(attn, config, q[b, i, h], i, "q")
        s = torch.stack([transformed(attn, config, k[b, j, kv], j, "k") @ qi for j in keys]) / math.sqrt(q.size(-1))
        out[b, h, i, keys] = weights(attn, config, s, i, keys, h)
    return out


def softmax_layer(attn: nn.Module, x: Tensor, config: Any) -> Tensor:
    """GPT-2's attention with the active parts: softmax(q.k / sqrt(D)) v per query and head, then c_proj."""
    q, k, v = heads(attn, x, config)
    y = torch.zeros_like(q)  # (B, T, H, D)
    for b, h, kv, i in queries(config, x):
        keys = keys_of(config, i)
        qi = transformed(attn, config, q[b, i, h], i, "q")
        s = torch.stack([transformed(attn, config, k[b, j, kv], j, "k") @ qi for j in keys]) / math.sqrt(q.size(-1))
        y[b, i, h] = softmax(attn, config, s, i, keys, h, v[b, keys, kv])
    return output(attn, config, x, y)
