"""RoPE's part of a remote-code export (gpt/designs/rope.py): feature pair (x[i], x[i + D/2]) at position p rotated
by p * base^(-2i/D), on queries and keys; the base is the layer's (a layout's kind may set its own, default 10000)."""

import torch


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


def angles_for(ctx, width, key="rope", base=10000.0):
    """The angles of this forward's positions, (T, width/2) or (B, 1, T, width/2), computed once per forward (a
    layout's kinds each have a context of their own, so each its own base)."""
    if key not in ctx.extras:
        cos, sin = rope_angles(ctx.positions, width, base)
        ctx.extras[key] = (cos, sin) if ctx.positions.dim() == 1 else (cos[:, None], sin[:, None])
    return ctx.extras[key]


class Part:
    positional = True  # no learned position table

    def qk(self, layer, q, k, ctx):
        base = getattr(layer, "options", {}).get("rope", {}).get("base", 10000.0)  # the layer's kind's
        cos, sin = angles_for(ctx, layer.qk_dim, base=base)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)
