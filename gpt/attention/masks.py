"""Mask helpers shared by the kernels. Convention everywhere: True means "may attend"."""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> Tensor:
    """(Tq, Tk) bool mask, bottom-right aligned: query i sees keys j <= i + (Tk - Tq)."""
    q_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(1)
    k_pos = torch.arange(t_k, device=device).unsqueeze(0)
    return k_pos <= q_pos


def combine(t_q: int, t_k: int, causal: bool, mask: Tensor | None, device: torch.device) -> Tensor | None:
    """The causal rule and a user mask as one bool mask broadcastable to (B, H, Tq, Tk), or None."""
    allowed = causal_mask(t_q, t_k, device) if causal else None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"attention mask must be bool (True = may attend), got {mask.dtype}")
        allowed = mask if allowed is None else allowed & mask
    return allowed


def expand_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Repeat key/value heads so each of the H query heads has its own (grouped-query attention)."""
    n_head, n_kv_head = q.size(1), k.size(1)
    if n_head % n_kv_head != 0:
        raise ValueError(f"query heads ({n_head}) must be a multiple of key/value heads ({n_kv_head})")
    if n_head == n_kv_head:
        return k, v
    group = n_head // n_kv_head
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
