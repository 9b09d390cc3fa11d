"""Differential attention (Ye et al. 2024, Diff Transformer): each head's queries and keys split in two halves, each
pair gives a softmax map (through the kernel), and the second map, times a learned lambda, is subtracted from the
first; the result is RMS-normalised per head and scaled by 1 - lambda_init. Noise common to both maps cancels.

A layer design: it changes what the layer does with q and k, so it subclasses the core's layer. The parts (QK-norm,
RoPE, the score modifiers) act on each half as on a query or key of its own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gpt.designs import reference
from gpt.errors import ConfigError
from gpt.model import CausalSelfAttention
from gpt.model.design import Design, modeling_file, register
from gpt.model.flops import TRAIN, matmul


class DiffAttention(CausalSelfAttention):
    """softmax(q1 k1^T s) v - lambda softmax(q2 k2^T s) v, s = 1/sqrt(hs/2); ``layer`` (0-based) sets lambda_init."""

    def __init__(self, config, layer: int = 0) -> None:
        super().__init__(config, layer)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)  # the paper's schedule
        half = config.head_dim // 2  # lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init; the paper's init N(0, 0.1^2)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(half) * 0.1) for _ in range(4))  # (hs/2,) each
        self.subln = nn.RMSNorm(config.head_dim, eps=1e-5)  # per head over its hs features, gain shared by heads

    @classmethod
    def qk_width(cls, config) -> int:
        return config.head_dim // 2

    def transform(self, q: Tensor, k: Tensor, ctx) -> tuple[Tensor, Tensor]:
        """The parts' transforms on each half by itself. q (B, nh, T, hs), k (B, nkv, T, hs)."""
        (q1, q2), (k1, k2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)  # (B, heads, T, hs/2) each
        q1, k1 = super().transform(q1, k1, ctx)
        q2, k2 = super().transform(q2, k2, ctx)
        return torch.cat([q1, q2], dim=-1), torch.cat([k1, k2], dim=-1)

    def transform_cached(self, k: Tensor, ctx) -> Tensor:
        """The parts' transforms of the cached keys, each half by itself (as transform)."""
        k1, k2 = k.chunk(2, dim=-1)
        return torch.cat([super().transform_cached(k1, ctx), super().transform_cached(k2, ctx)], dim=-1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx) -> Tensor:
        """Each map through the kernel; q (B, nh, T, hs), k, v (B, nkv, Tk, hs) -> (B, nh, T, hs)."""
        kwargs = self.kernel_kwargs(ctx)
        (q1, q2), (k1, k2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)  # (B, heads, T, hs/2) each
        a1 = self.kernel(q1, k1, v, **kwargs)  # (B, nh, T, hs): the values keep their full width
        a2 = self.kernel(q2, k2, v, **kwargs)
        y = a1 - self.diff_lambda().to(a1.dtype) * a2
        return self.subln(y) * (1.0 - self.lambda_init)

    def diff_lambda(self) -> Tensor:
        """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init: a scalar per layer."""
        return (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
                - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)

    def attention_map(self, calls: list[Tensor]) -> Tensor:
        """The picture of this layer: the differential map w1 - lambda w2 of its two kernel calls."""
        return calls[0] - self.diff_lambda().detach().to(calls[0].dtype) * calls[1]


class Diff(Design):
    name = "diff"
    modeling = modeling_file("diff")
    about = "differential attention: two softmax maps from the halves of q and k, the second subtracted"
    paper = "Ye et al. 2024, Differential Transformer"
    layer = DiffAttention
    view = "the differential map w1 - lambda w2 of each head (weights may be negative)"
    cases = {"alone": {"designs": ["diff"]}, "gqa+window": {"designs": ["diff"], "n_kv_head": 2, "window": 4},
             "mqa+rope+qk_norm": {"designs": ["diff", "rope", "qk_norm"], "n_kv_head": 1},
             "alibi+softcap+sink": {"designs": ["diff", "alibi", "softcap", "sink"],
                                    "design_options": {"softcap": {"cap": 3.0}}}}

    def flops(self, config, seq, flops) -> int:
        """Two kernel calls: q k^T from the halves (together the width of one), weights @ v twice at full width,
        so one more weights @ v than the core (lambda and the RMS norm are elementwise)."""
        return flops + TRAIN * config.n_head * matmul(seq, config.head_dim)

    def check(self, config) -> None:
        rope = "rope" in config.designs
        need = 4 if rope else 2
        if config.head_dim % need != 0:
            raise ConfigError(
                f"model.designs=[diff] needs a head dimension (n_embd/n_head) divisible by {need}, got "
                f"{config.head_dim}: it splits each head's queries and keys in two halves"
                + (", and rope rotates each half" if rope else ""),
                hint="change model.n_head or model.n_embd, or leave diff out of model.designs")

    def activations(self, config, batch, seq, act, fused) -> int:
        """A second kernel call; both halves' q and k, both outputs, their difference. SDPA's fused kernels refuse
        q and k narrower than v on a CPU, so its math backend runs them, keeping float32 probabilities."""
        n, c, h = batch * seq, config.n_embd, config.n_head
        kv = config.n_kv_head * config.head_dim
        one_map, math_map = batch * h * seq * seq * act, batch * h * seq * seq * 4
        upcast = n * (4 - act) * 2 * 2 * c if fused else 0  # each call's float32 q, k (hs/2 each) and v
        return 2 * (math_map if fused else one_map) + upcast + n * act * (4 * c + 2 * (c - kv))

    def reference(self, attn, x, config) -> Tensor:
        """The paper's layer in float64, one query and one head at a time; each half through the parts."""
        q, k, v = reference.heads(attn, x, config)
        D, d = config.head_dim, config.head_dim // 2
        lq1, lk1, lq2, lk2 = (getattr(attn, f"lambda_{n}").detach().double() for n in ("q1", "k1", "q2", "k2"))
        lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + attn.lambda_init
        y = torch.zeros_like(q)  # (B, T, H, D)
        for b, h, kv, i in reference.queries(config, x):
            keys, out = reference.keys_of(config, i), []
            for half in (slice(0, d), slice(d, D)):  # map 1 from q1, k1; map 2 from q2, k2
                qi = reference.transformed(attn, config, q[b, i, h, half], i, "q")
                s = torch.stack([reference.transformed(attn, config, k[b, j, kv, half], j, "k") @ qi
                                 for j in keys]) / math.sqrt(d)
                out.append(reference.softmax(attn, config, s, i, keys, h, v[b, keys, kv]))  # values keep all D
            diff = out[0] - lam * out[1]
            y[b, i, h] = diff / torch.sqrt((diff * diff).mean() + 1e-5) * attn.subln.weight.double() * (
                1 - attn.lambda_init)
        return reference.output(attn, config, x, y)

    def ref_pattern(self, attn, x, config) -> Tensor:
        """Its declared pattern in float64: the differential map w1 - lambda w2 of each head (B, H, T, T)."""
        w1, w2 = self.ref_maps(attn, x, config)
        lq1, lk1, lq2, lk2 = (getattr(attn, f"lambda_{n}").detach().double() for n in ("q1", "k1", "q2", "k2"))
        return w1 - (math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + attn.lambda_init) * w2

    def ref_maps(self, attn, x, config) -> tuple[Tensor, Tensor]:
        """Its two softmax maps in float64, each from one half of q and k through the parts: (B, H, T, T) each."""
        q, k, _ = reference.heads(attn, x, config)
        D, d = config.head_dim, config.head_dim // 2
        maps = torch.zeros(2, x.size(0), config.n_head, x.size(1), x.size(1), dtype=torch.float64)
        for b, h, kv, i in reference.queries(config, x):
            keys = reference.keys_of(config, i)
            for m, half in enumerate((slice(0, d), slice(d, D))):
                qi = reference.transformed(attn, config, q[b, i, h, half], i, "q")
                s = torch.stack([reference.transformed(attn, config, k[b, j, kv, half], j, "k") @ qi
                                 for j in keys]) / math.sqrt(d)
                maps[m, b, h, i, keys] = reference.weights(attn, config, s, i, keys, h)
        return maps[0], maps[1]


register(Diff())
