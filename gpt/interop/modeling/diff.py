"""Differential attention's layer in a remote-code export (gpt/designs/diff.py): two softmax maps from the halves of
q and k, the second times lambda subtracted, RMS-normalised per head, times 1 - lambda_init."""

import math

import torch
from torch import nn


class Part:
    def qk_width(self, mc):
        return mc["n_embd"] // mc["n_head"] // 2

    def build(self, layer, mc):
        layer.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer.layer)
        half = layer.head_dim // 2
        layer.lambda_q1, layer.lambda_k1, layer.lambda_q2, layer.lambda_k2 = (
            nn.Parameter(torch.zeros(half)) for _ in range(4))  # (hs/2,) each
        layer.subln = nn.RMSNorm(layer.head_dim, eps=1e-5)

    def transform(self, layer, q, k, ctx):
        """The other parts' transforms on each half by itself."""
        (q1, q2), (k1, k2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)
        q1, k1 = layer.transform(q1, k1, ctx)
        q2, k2 = layer.transform(q2, k2, ctx)
        return torch.cat([q1, q2], dim=-1), torch.cat([k1, k2], dim=-1)

    def attend(self, layer, q, k, v, ctx):
        (q1, q2), (k1, k2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)
        # the core's softmax attention (with the parts' score changes) on each half; the values keep all hs
        a1, a2 = layer.softmax_attention(q1, k1, v, ctx), layer.softmax_attention(q2, k2, v, ctx)
        lam = (torch.exp(torch.dot(layer.lambda_q1, layer.lambda_k1))
               - torch.exp(torch.dot(layer.lambda_q2, layer.lambda_k2)) + layer.lambda_init)
        return layer.subln(a1 - lam.to(a1.dtype) * a2) * (1.0 - layer.lambda_init)
