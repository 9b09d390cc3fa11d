"""Multi-head latent attention (DeepSeek-V2, section 2.1; no query compression): keys and values are up-projected
from a small latent c_kv per token, and a decoupled rotary part of d_R features carries positions, shared by the
heads for keys. The KV cache keeps only c_kv and that rotated key part (LatentKV): d_c + d_R numbers per token
instead of 2 x n_head x head_dim.

A layer design: its projections replace c_attn, so it subclasses the core's layer; the score parts (soft-cap, a
sink) and the window still act through the kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gpt.designs import reference
from gpt.designs.rope import angles_for, apply_rope, rotate
from gpt.errors import ConfigError
from gpt.model import CausalSelfAttention
from gpt.model.design import Design, modeling_file, register
from gpt.model.flops import TRAIN, matmul
from gpt.model.kv_cache import keep


def latent_widths(config) -> tuple[int, int]:
    """d_c and d_R: the latent's width and the decoupled rotary features' (model.design_options.mla)."""
    return config.design_options["mla"]["latent"], config.design_options["mla"]["rope_dim"]


class LatentKV:
    """One layer's MLA latents: c_kv (B, size, d_c) and the rotated shared key part k_rope (B, size, d_R)."""

    def __init__(self, config, cache) -> None:
        self.size = self.tokens = cache.size
        self.c: Tensor | None = None
        self.k_rope: Tensor | None = None

    @classmethod
    def bytes_per_token(cls, config, number_bytes: int) -> float:
        return (sum(latent_widths(config))) * number_bytes

    def update(self, c: Tensor, k_rope: Tensor, ctx) -> tuple[Tensor, Tensor]:
        """Store c (B, T, d_c) and k_rope (B, T, d_R) of these tokens; return what the T queries attend to."""
        self.c, c = keep(self.c, c, ctx, 1, self.size)
        self.k_rope, k_rope = keep(self.k_rope, k_rope, ctx, 1, self.size)
        return c, k_rope

    def held_bytes(self) -> int:
        """Bytes of the buffers: (d_c + d_R) numbers per token."""
        return sum(t.numel() * t.element_size() for t in (self.c, self.k_rope) if t is not None)


class LatentAttention(CausalSelfAttention):
    """q = [q^C, RoPE(q^R)] per head; k = [W^UK c^KV, RoPE(k^R)] with k^R shared by the heads; v = W^UV c^KV."""

    def __init__(self, config, layer: int = 0) -> None:
        super().__init__(config, layer)
        self.scale = 1.0 / math.sqrt(self.head_dim + self.rope_dim)  # the kernel's default too (q's width): the paper's

    def add_projections(self, config) -> None:
        """DeepSeek-V2 eqs. 9-10, 14-18, with d_c and d_R from model.design_options.mla (latent, rope_dim)."""
        C, heads, d_c, d_r = config.n_embd, config.n_head * config.head_dim, *latent_widths(config)
        self.rope_dim = d_r
        self.query = nn.Linear(C, heads, bias=config.bias)  # W^Q: x -> q^C, head_dim per head
        self.q_rope = nn.Linear(C, config.n_head * d_r, bias=config.bias)  # W^QR: x -> q^R, d_R per head
        self.kv_down = nn.Linear(C, d_c, bias=config.bias)  # W^DKV: x -> c^KV, the latent the cache keeps
        self.k_up = nn.Linear(d_c, heads, bias=config.bias)  # W^UK: c^KV -> k^C, head_dim per head
        self.v_up = nn.Linear(d_c, heads, bias=config.bias)  # W^UV: c^KV -> v, head_dim per head
        self.k_rope = nn.Linear(C, d_r, bias=config.bias)  # W^KR: x -> k^R, one d_R part shared by every head

    def qkv(self, x: Tensor, ctx) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, C) -> q (B, nh, T, hs + d_R), k (B, nh, Tk, hs + d_R), v (B, nh, Tk, hs); the cache keeps c^KV and
        the rotated k^R of each token and returns those of every token the queries see."""
        B, T, _ = x.shape
        nh, hs, d_r = self.n_head, self.head_dim, self.rope_dim
        cos, sin = angles_for(ctx, d_r, key="mla")
        q_content = self.query(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        q_rotary = apply_rope(self.q_rope(x).view(B, T, nh, d_r).transpose(1, 2), cos, sin)  # (B, nh, T, d_R)
        latent = self.kv_down(x)  # (B, T, d_c)
        k_rotary = apply_rope(self.k_rope(x)[:, None], cos, sin)[:, 0]  # (B, T, d_R): one for all heads
        cache = ctx.layer_cache(self.layer)
        if cache is not None:
            latent, k_rotary = cache.update(latent, k_rotary, ctx)  # (B, Tk, d_c), (B, Tk, d_R)
        Tk = latent.size(1)
        k_content = self.k_up(latent).view(B, Tk, nh, hs).transpose(1, 2)  # (B, nh, Tk, hs)
        v = self.v_up(latent).view(B, Tk, nh, hs).transpose(1, 2)  # (B, nh, Tk, hs)
        q = torch.cat([q_content, q_rotary], dim=-1)  # (B, nh, T, hs + d_R)
        k = torch.cat([k_content, k_rotary[:, None].expand(B, nh, Tk, d_r)], dim=-1)  # (B, nh, Tk, hs + d_R)
        return q, k, v


class Latent(Design):
    name = "mla"
    modeling = modeling_file("mla")
    about = "multi-head latent attention: keys and values up-projected from a small cached latent"
    paper = "DeepSeek-AI 2024, DeepSeek-V2 (section 2.1)"
    # latent: d_c, the width the cache keeps per token (DeepSeek-V2: 4 x head_dim); rope_dim: d_R, the decoupled rotary
    # features per query and key (None: head_dim / 2, kept even)
    options = {"latent": 32, "rope_dim": None}
    layer = LatentAttention
    cache = LatentKV
    conflicts = {
        "rope": "MLA applies RoPE itself, to its decoupled query and key features (its rope_dim)",
        "alibi": "MLA encodes positions with its own decoupled rotary features",
        "qk_norm": "not implemented for keys up-projected from the latent",
        "diff": "differential attention splits the heads' queries and keys",
        "linear": "linear attention keeps a state, not a latent",
    }
    cases = {"alone": {"designs": ["mla"], "design_options": {"mla": {"latent": 12}}},
             "window+wide_rope": {"designs": ["mla"], "window": 4, "design_options": {"mla": {"latent": 12,
                                                                                              "rope_dim": 6}}},
             "softcap+sink": {"designs": ["mla", "softcap", "sink"],
                              "design_options": {"mla": {"latent": 12}, "softcap": {"cap": 3.0}}},
             "no_bias+wide_latent": {"designs": ["mla"], "bias": False,
                                     "design_options": {"mla": {"latent": 80, "rope_dim": 2}}}}

    def flops(self, config, seq, flops) -> int:
        """Its own layer: q^C, q^R, the latent, k^C and v up from it, the shared k^R, c_proj; scores over q's width
        head_dim + d_R, values over head_dim (replaces the count before it)."""
        C, H, D, d_c, d_r = config.n_embd, config.n_head, config.head_dim, *latent_widths(config)
        projections = (matmul(C, H * D) + matmul(C, H * d_r) + matmul(C, d_c) + 2 * matmul(d_c, H * D)
                       + matmul(C, d_r) + matmul(C, C))
        return TRAIN * (projections + H * matmul(seq, D + d_r) + H * matmul(seq, D))

    def check(self, config) -> None:
        """Its widths (d_R defaults to the paper's head_dim / 2, kept even), and one key/value head per head."""
        where, options = "model.design_options.mla", config.design_options["mla"]
        latent = options["latent"]
        if isinstance(latent, bool) or not isinstance(latent, int) or latent <= 0:
            raise ConfigError(f"{where}.latent must be a positive integer, got {latent!r}",
                              hint="DeepSeek-V2 uses 4 x head_dim")
        if options["rope_dim"] is None:
            options["rope_dim"] = max(2, config.head_dim // 4 * 2)
        rope = options["rope_dim"]
        if isinstance(rope, bool) or not isinstance(rope, int) or rope <= 0 or rope % 2 != 0:
            raise ConfigError(f"{where}.rope_dim must be a positive even integer, got {rope!r}",
                              hint="RoPE rotates pairs of features; null picks head_dim/2")
        if config.n_kv_head != config.n_head:
            raise ConfigError(f"model.designs=[mla] cannot be combined with model.n_kv_head={config.n_kv_head}: "
                              "every head's keys and values come from the one shared latent",
                              hint="unset model.n_kv_head, or leave mla out of model.designs")

    def activations(self, config, batch, seq, act, fused) -> int:
        """q, k of hs + d_R per head, the latent; no c_attn output, no log-sum-exp. SDPA's fused kernels refuse q and
        k wider than v on a CPU, so its math backend runs them, keeping float32 q, k, v and probabilities."""
        n, c, h, d_r = batch * seq, config.n_embd, config.n_head, config.design_options["mla"]["rope_dim"]
        math_map = batch * h * seq * seq * 4
        upcast = n * (4 - act) * (3 * c + 2 * h * d_r) if fused else 0
        latent = config.design_options["mla"]["latent"]
        return (math_map if fused else 0) + upcast + n * act * (latent + 2 * h * d_r) - n * 4 * h

    def reference(self, attn, x, config) -> Tensor:
        """DeepSeek-V2 eqs. 9-19 (no query compression) in float64, one query and one head at a time."""
        H, D, R = config.n_head, config.head_dim, config.design_options["mla"]["rope_dim"]
        q_c = reference.project(attn.query, x).unflatten(-1, (H, D))  # (B, T, H, D)   q^C = W^Q h
        q_r = reference.project(attn.q_rope, x).unflatten(-1, (H, R))  # (B, T, H, R)  q^R = W^QR h
        latent = reference.project(attn.kv_down, x)  # (B, T, d_c)                       c^KV = W^DKV h
        k_c = reference.project(attn.k_up, latent).unflatten(-1, (H, D))  # (B, T, H, D) k^C = W^UK c^KV
        v = reference.project(attn.v_up, latent).unflatten(-1, (H, D))  # (B, T, H, D)  v^C = W^UV c^KV
        k_r = reference.project(attn.k_rope, x)  # (B, T, R)                             k^R = W^KR h, for every head
        y = torch.zeros_like(q_c)  # (B, T, H, D)
        for b, h, _, i in reference.queries(config, x):
            keys = reference.keys_of(config, i)
            s = torch.stack([q_c[b, i, h] @ k_c[b, j, h] + rotate(q_r[b, i, h], i) @ rotate(k_r[b, j], j)
                             for j in keys]) / math.sqrt(D + R)  # (keys,)
            y[b, i, h] = reference.softmax(attn, config, s, i, keys, h, v[b, keys, h])
        return reference.output(attn, config, x, y)

    def ref_pattern(self, attn, x, config) -> Tensor:
        """Its softmax weights in float64 over the content and decoupled rotary scores: (B, H, T, T)."""
        H, D, R = config.n_head, config.head_dim, config.design_options["mla"]["rope_dim"]
        q_c = reference.project(attn.query, x).unflatten(-1, (H, D))
        q_r = reference.project(attn.q_rope, x).unflatten(-1, (H, R))
        k_c = reference.project(attn.k_up, reference.project(attn.kv_down, x)).unflatten(-1, (H, D))
        k_r = reference.project(attn.k_rope, x)
        out = torch.zeros(x.size(0), H, x.size(1), x.size(1), dtype=torch.float64)
        for b, h, _, i in reference.queries(config, x):
            keys = reference.keys_of(config, i)
            s = torch.stack([q_c[b, i, h] @ k_c[b, j, h] + rotate(q_r[b, i, h], i) @ rotate(k_r[b, j], j)
                             for j in keys]) / math.sqrt(D + R)
            out[b, h, i, keys] = reference.weights(attn, config, s, i, keys, h)
        return out


register(Latent())
