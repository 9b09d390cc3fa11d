"""Mask helpers shared by the kernels. Convention everywhere: True means "may attend"."""

from __future__ import annotations

import torch
from torch import Tensor


def check_window(window: int | None, causal: bool) -> None:
    """A sliding window is a causal band: refuse a window without the causal rule, or a window < 1."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer or None, got {window!r}")
    if not causal:
        raise ValueError("a sliding window is causal (query i sees keys i - window < j <= i); pass causal=True")


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None, window: int | None = None) -> Tensor:
    """(Tq, Tk) bool mask, bottom-right aligned: query i (at position p = i + Tk - Tq) sees keys j <= p.

    With a window, only the band p - window < j <= p: the last ``window`` positions, itself included.
    """
    q_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(1)
    k_pos = torch.arange(t_k, device=device).unsqueeze(0)
    allowed = k_pos <= q_pos
    if window is not None:
        allowed = allowed & (k_pos > q_pos - window)
    return allowed


def combine(
    t_q: int, t_k: int, causal: bool, mask: Tensor | None, device: torch.device, window: int | None = None
) -> Tensor | None:
    """The causal (or sliding-window) rule and a user mask as one bool mask broadcastable to (B, H, Tq, Tk)."""
    check_window(window, causal)
    allowed = causal_mask(t_q, t_k, device, window) if causal else None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"attention mask must be bool (True = may attend), got {mask.dtype}")
        allowed = mask if allowed is None else allowed & mask
    return allowed


def expand_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Repeat key/value heads so each of the H query heads has its own (grouped-query attention)."""
    group = kv_group(q, k)
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def kv_group(q: Tensor, k: Tensor) -> int:
    """How many query heads share one key/value head: H // Hkv (query head h reads kv head h // group)."""
    n_head, n_kv_head = q.size(1), k.size(1)
    if n_head % n_kv_head != 0:
        raise ValueError(f"query heads ({n_head}) must be a multiple of key/value heads ({n_kv_head})")
    return n_head // n_kv_head


def padding_mask(key_padding_mask: Tensor | None, attn_mask: Tensor | None) -> Tensor | None:
    """A (B, Tk) key mask and a (Tq, Tk) attention mask (both True = may attend) as one (B, 1, Tq, Tk) mask."""
    allowed = None
    if key_padding_mask is not None:
        allowed = key_padding_mask[:, None, None, :]
    if attn_mask is not None:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    return allowed
