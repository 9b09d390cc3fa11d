"""Gated DeltaNet's layer in a remote-code export (gpt/designs/deltanet.py): q, k, v through a causal depthwise
convolution and silu, the gated delta rule token by token in float32 (its recurrent form), a per-head RMS norm times
silu(c_gate(x)), c_proj."""

import torch
import torch.nn.functional as F
from torch import nn


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class Part:
    def add_projections(self, layer, mc):
        C, H, Hk, D = mc["n_embd"], mc["n_head"], layer.n_kv_head, layer.head_dim
        width = (2 * Hk + H) * D
        layer.c_attn = nn.Linear(C, width, bias=mc["bias"])
        layer.conv = nn.Conv1d(width, width, mc["design_options"]["deltanet"]["conv"], groups=width, bias=False)
        layer.c_gate = nn.Linear(C, C, bias=mc["bias"])
        layer.c_beta = nn.Linear(C, H, bias=mc["bias"])
        layer.c_decay = nn.Linear(C, H, bias=mc["bias"])
        layer.A_log = nn.Parameter(torch.zeros(H))
        layer.dt_bias = nn.Parameter(torch.zeros(H))
        layer.o_norm = nn.RMSNorm(D, eps=1e-6)

    def forward(self, layer, x, ctx):
        """x (B, T, C) -> (B, T, C); padding (ctx.key_mask False) neither decays nor writes."""
        B, T, C = x.shape
        Hk, D = layer.n_kv_head, layer.head_dim
        mask = None if ctx.key_mask is None else ctx.key_mask[..., None].to(x.dtype)  # (B, T, 1)
        mixed = layer.c_attn(x) if mask is None else layer.c_attn(x) * mask
        K = layer.conv.kernel_size[0]
        mixed = F.silu(F.conv1d(F.pad(mixed.transpose(1, 2), (K - 1, 0)), layer.conv.weight, groups=mixed.size(-1)))
        q, k, v = (t.unflatten(-1, (-1, D)).float() for t in mixed.transpose(1, 2).split([Hk * D, Hk * D, C], -1))
        q, k = l2norm(q) * D ** -0.5, l2norm(k)  # (B, T, Hk, D)
        g = -layer.A_log.float().exp() * F.softplus(layer.c_decay(x).float() + layer.dt_bias.float())  # (B, T, H)
        beta = torch.sigmoid(layer.c_beta(x).float())
        if mask is not None:
            g, beta = g * mask, beta * mask
        group = v.size(2) // Hk
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)  # (B, T, H, D)
        state = x.new_zeros(B, v.size(2), D, D, dtype=torch.float32)  # (B, H, Dk, Dv)
        outs = []
        for t in range(T):
            state = state * g[:, t].exp()[..., None, None]
            stored = (k[:, t].unsqueeze(-2) @ state).squeeze(-2)  # (B, H, Dv)
            state = state + k[:, t].unsqueeze(-1) * (beta[:, t].unsqueeze(-1) * (v[:, t] - stored)).unsqueeze(-2)
            outs.append((q[:, t].unsqueeze(-2) @ state).squeeze(-2))
        o = torch.stack(outs, dim=1).to(x.dtype)  # (B, T, H, D)
        o = layer.o_norm(o) * F.silu(layer.c_gate(x)).unflatten(-1, (-1, D))
        return layer.c_proj(o.flatten(2))
