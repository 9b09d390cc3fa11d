"""Rotary position embeddings (RoPE, Su et al. 2021): rotate each pair of q/k features by an angle proportional to
position, instead of GPT-2's learned position table.

Feature pair (x[i], x[i + D/2]) at position p is rotated by p * base^(-2i/D). The dot product of a rotated query at
p and a rotated key at p' then depends only on p - p': relative positions for free. The angles come from explicit
positions, so a caller that processes tokens 100..107 (a KV cache) passes those positions. MLA (gpt.designs.mla)
rotates its decoupled features with the same functions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpt.designs import rope_scaling
from gpt.errors import ConfigError
from gpt.model.design import Design, modeling_file, register


def rope_angles(positions: Tensor, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotation angles, each (..., T, head_dim // 2), for integer positions (..., T)."""
    if head_dim % 2 != 0:
        raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., T, D) by the angles (T, D/2): first half of the features paired with the second."""
    dtype = torch.promote_types(x.dtype, torch.float32)  # rotate bf16/fp16 in fp32
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    cos, sin = cos.to(dtype), sin.to(dtype)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


def angles_for(ctx, width: int, key: str = "rope", base: float = 10000.0, scaling: dict | None = None,
               positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The angles of this forward pass's positions (or of ``positions``) for ``width`` features, computed by the
    first layer that asks and kept in the context under ``key`` for the others (a layout's kinds each have their own
    context, so their own base and scaling): (T, width/2) each, or (B, 1, T, width/2) for per-row positions."""
    if key not in ctx.extras:
        positions = ctx.positions if positions is None else positions
        if scaling is None:
            cos, sin = rope_angles(positions, width, base)
        else:
            cos, sin = rope_scaling.angles(positions, width, base, scaling)
        ctx.extras[key] = (cos, sin) if positions.dim() == 1 else (cos[:, None], sin[:, None])
    return ctx.extras[key]


def rotate(x: Tensor, position: int, base: float = 10000.0, scaling: dict | None = None,
           length: int | None = None) -> Tensor:
    """Float64 reference: RoPE on one vector x (d,), feature i paired with i + d/2, angle position * base^(-2i/d)
    (or the scaled frequency, rope_scaling.inv_freq64, of a sequence of ``length`` tokens), times the scaling's
    attention factor."""
    d = x.numel()
    if scaling is None:
        angle = position * float(base) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    else:
        angle = position * rope_scaling.inv_freq64(scaling, d, base, length)
    a, b = x[: d // 2], x[d // 2:]
    m = rope_scaling.attention_factor(scaling)
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()]) * m


class Rope(Design):
    name = "rope"
    modeling = modeling_file("rope")
    about = "rotary position embeddings on q and k instead of the learned position table"
    paper = "Su et al. 2021, RoFormer"
    positional = True
    # base: the angles' (a layer kind may have its own: Gemma 3's 10k on local layers, 1M on global ones); scaling:
    # linear | dynamic | yarn | llama3, in transformers' rope_scaling form (gpt/designs/rope_scaling.py)
    options = {"base": 10000.0, "scaling": None}
    cases = {"alone": {"designs": ["rope"]}, "gqa+window": {"designs": ["rope"], "n_kv_head": 2, "window": 5},
             "mqa+qk_norm": {"designs": ["rope", "qk_norm"], "n_kv_head": 1},
             "yarn": {"designs": ["rope"], "design_options": {"rope": {"scaling": {
                 "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}}}}}

    def flops(self, config, seq, flops) -> int:
        """Rotations are elementwise (the angles an outer product done once per forward, not per token): unchanged."""
        return flops

    def check(self, config) -> None:
        if config.head_dim % 2 != 0:
            raise ConfigError(f"model.designs=[rope] needs an even head dimension, got n_embd/n_head = "
                              f"{config.head_dim}")
        where = "model.design_options.rope"
        base = self.option(config, "base")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
            raise ConfigError(f"{where}.base must be a number above 1, got {base!r}", hint=f"e.g. {where}.base=1000000")
        options = config.design_options["rope"]
        options["scaling"] = rope_scaling.check(options["scaling"], config.block_size, f"{where}.scaling")

    def no_cache(self, config) -> str | None:
        """Dynamic NTK's frequencies follow the sequence's length, so keys cached at a shorter length would be
        rotated by stale angles (transformers keeps them so; here cached decoding equals the full forward or is
        refused)."""
        scaling = self.option(config, "scaling")
        if scaling is not None and scaling["rope_type"] == "dynamic":
            return ("model.design_options.rope.scaling's rope_type dynamic changes every position's angle as the "
                    "sequence grows, so cached keys would go stale")
        return None

    def build(self, layer, config) -> None:
        layer.rope_base = float(self.option(config, "base"))
        layer.rope_scaling = self.option(config, "scaling")

    def context(self, ctx, config) -> None:
        """An endless cache (kv_cache.endless: a window's ring, with sink tokens or not) keeps keys un-rotated and
        numbers positions inside itself, as StreamingLLM does (Slots.renumbered): the keys are turned at those
        positions after the cache (cached), the query at its own, so no angle grows with the stream."""
        if ctx.cache is not None and ctx.cache.renumber:
            ctx.positions, ctx.key_positions = ctx.cache.renumbered(ctx)

    def qk(self, layer, q, k, ctx):
        cos, sin = angles_for(ctx, layer.qk_dim, base=layer.rope_base, scaling=layer.rope_scaling)
        return apply_rope(q, cos, sin), k if ctx.key_positions is not None else apply_rope(k, cos, sin)

    def cached(self, layer, k, ctx):
        if ctx.key_positions is None:
            return k
        cos, sin = angles_for(ctx, layer.qk_dim, "rope_keys", layer.rope_base, layer.rope_scaling, ctx.key_positions)
        return apply_rope(k, cos, sin)

    def activations(self, config, batch, seq, act, fused) -> int:
        return batch * seq * act * (config.n_embd + config.n_kv_head * config.head_dim)  # the rotated q and k

    def ref_qk(self, layer, x, position, kind):
        scaling = getattr(layer, "rope_scaling", None)
        if scaling is not None and scaling["rope_type"] == "dynamic":
            raise NotImplementedError("dynamic NTK's angles depend on the sequence's length, which ref_qk is not "
                                      "given: use rotate(x, position, base, scaling, length)")
        return rotate(x, position, getattr(layer, "rope_base", 10000.0), scaling)


register(Rope())
