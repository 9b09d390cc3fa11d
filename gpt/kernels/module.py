"""MultiHeadAttention: the general module for self- and cross-attention, on any registered kernel.

The GPT uses its own fused CausalSelfAttention (gpt.model) to keep GPT-2's parameter names; this is
the tool for everything else: encoders, decoders reading an encoder's output, padded batches.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from gpt.kernels.masks import padding_mask
from gpt.kernels.registry import get


class MultiHeadAttention(nn.Module):
    """Queries from ``x`` (B, Tq, embed_dim); keys and values from ``context`` (B, Tk, kv_dim), or from x.

    Masks follow the library's convention, True = "may attend" (the opposite of
    torch.nn.MultiheadAttention's key_padding_mask): ``key_padding_mask`` (B, Tk) is True for real
    keys and False for padding; ``attn_mask`` (Tq, Tk) is True where query i may see key j.
    ``causal`` and ``window`` add the (bottom-right aligned) causal / sliding-window rule.
    n_kv_head < n_head gives grouped-query attention. A query that may see no key returns zeros
    (before the output projection, so the result is the output projection's bias).
    """

    def __init__(
        self,
        embed_dim: int,
        n_head: int,
        *,
        n_kv_head: int | None = None,
        kv_dim: int | None = None,
        kernel: str = "sdpa",
        causal: bool = False,
        window: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if embed_dim % n_head != 0 or n_head % n_kv_head != 0:
            raise ValueError("need embed_dim % n_head == 0 and n_head % n_kv_head == 0, "
                             f"got {embed_dim}, {n_head}, {n_kv_head}")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, embed_dim // n_head
        self.causal, self.window, self.dropout = causal, window, dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.kv_proj = nn.Linear(kv_dim or embed_dim, 2 * n_kv_head * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.kernel = get(kernel)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        B, t_q, C = x.shape
        context = x if context is None else context
        t_k = context.size(1)
        for name, m, shape in (("key_padding_mask", key_padding_mask, (B, t_k)), ("attn_mask", attn_mask, (t_q, t_k))):
            if m is not None and (m.dtype != torch.bool or tuple(m.shape) != shape):
                raise ValueError(f"{name} must be a bool tensor of shape {shape} (True = may attend), "
                                 f"got {m.dtype} {tuple(m.shape)}")
        q = self.q_proj(x).view(B, t_q, self.n_head, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(context).split(self.n_kv_head * self.head_dim, dim=-1)
        k = k.view(B, t_k, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, t_k, self.n_kv_head, self.head_dim).transpose(1, 2)
        y = self.kernel(
            q, k, v,
            causal=self.causal,
            mask=padding_mask(key_padding_mask, attn_mask),
            dropout_p=self.dropout if self.training else 0.0,
            window=self.window,
        )
        return self.out_proj(y.transpose(1, 2).reshape(B, t_q, C))
