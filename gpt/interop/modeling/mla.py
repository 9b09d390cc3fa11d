"""Multi-head latent attention's layer in a remote-code export (gpt/designs/mla.py): keys and values up-projected
from a latent c_kv, a decoupled rotary part of d_R features (shared by the heads for keys). RoPE's functions are
repeated from rope.py: an export carries only the active designs' parts, and MLA never runs with the rope design."""

import math

import torch
from torch import nn


def rope_angles(positions, width, base=10000.0):
    """cos and sin, each (..., T, width/2), for integer positions (..., T)."""
    inv_freq = base ** (-torch.arange(0, width, 2, device=positions.device, dtype=torch.float32) / width)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate x (..., T, D): the first half of the features paired with the second."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


def angles_for(ctx, width, key="rope"):
    """The angles of this forward's positions, (T, width/2) or (B, 1, T, width/2), computed once per forward."""
    if key not in ctx.extras:
        cos, sin = rope_angles(ctx.positions, width)
        ctx.extras[key] = (cos, sin) if ctx.positions.dim() == 1 else (cos[:, None], sin[:, None])
    return ctx.extras[key]


class Part:
    def add_projections(self, layer, mc):
        C, heads = mc["n_embd"], mc["n_embd"]
        d_c, d_r = mc["design_options"]["mla"]["latent"], mc["design_options"]["mla"]["rope_dim"]
        layer.rope_dim = d_r
        layer.query = nn.Linear(C, heads, bias=mc["bias"])
        layer.q_rope = nn.Linear(C, mc["n_head"] * d_r, bias=mc["bias"])
        layer.kv_down = nn.Linear(C, d_c, bias=mc["bias"])
        layer.k_up = nn.Linear(d_c, heads, bias=mc["bias"])
        layer.v_up = nn.Linear(d_c, heads, bias=mc["bias"])
        layer.k_rope = nn.Linear(C, d_r, bias=mc["bias"])

    def build(self, layer, mc):
        layer.scale = 1.0 / math.sqrt(layer.head_dim + layer.rope_dim)

    def qkv(self, layer, x, ctx):
        """x (B, T, C) -> q, k (B, nh, T, hs + d_R), v (B, nh, T, hs)."""
        B, T, _ = x.shape
        nh, hs, d_r = layer.n_head, layer.head_dim, layer.rope_dim
        cos, sin = angles_for(ctx, d_r, key="mla")
        q_content = layer.query(x).view(B, T, nh, hs).transpose(1, 2)
        q_rotary = apply_rope(layer.q_rope(x).view(B, T, nh, d_r).transpose(1, 2), cos, sin)
        latent = layer.kv_down(x)  # (B, T, d_c)
        k_rotary = apply_rope(layer.k_rope(x)[:, None], cos, sin)[:, 0]  # (B, T, d_R)
        k_content = layer.k_up(latent).view(B, T, nh, hs).transpose(1, 2)
        v = layer.v_up(latent).view(B, T, nh, hs).transpose(1, 2)
        q = torch.cat([q_content, q_rotary], dim=-1)
        k = torch.cat([k_content, k_rotary[:, None].expand(B, nh, T, d_r)], dim=-1)
        return q, k, v
