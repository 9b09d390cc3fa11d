"""Rotary position embeddings (RoPE): rotate each pair of q/k features by an angle proportional to position.

Feature pair (x[i], x[i + D/2]) at position p is rotated by p * base^(-2i/D). The dot product of a
rotated query at p and a rotated key at p' then depends only on p - p': relative positions for
free, no learned position table. The angles come from explicit positions, so a caller that
processes tokens 100..107 (a KV cache, later) passes those positions.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_angles(positions: Tensor, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotation angles, each (T, head_dim // 2), for integer positions (T,)."""
    if head_dim % 2 != 0:
        raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., T, D) by the angles (T, D/2): first half of the features paired with the second."""
    dtype = torch.promote_types(x.dtype, torch.float32)  # rotate bf16/fp16 in fp32
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    cos, sin = cos.to(dtype), sin.to(dtype)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)
