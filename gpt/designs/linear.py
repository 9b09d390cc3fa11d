"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax's e^(q.k) replaced by a
kernel phi(q).phi(k) with a positive feature map, so the weighted sum over earlier keys is a running state.

    y_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps),  S_i = sum_{j<=i} phi(k_j) v_j^T,  z_i = sum_{j<=i} phi(k_j)

Over a chunk of tokens this computes the masked (T x T) form, phi(Q) phi(K)^T with the future zeroed, plus what a
state (S, z) of earlier tokens contributes; it returns the state after the chunk, which is all a decoder keeps:
(D x Dv + D) numbers per key/value head, whatever the context length. A layer design with a cache kind of its own
(LinearState); no registry kernel runs it, so it forms no softmax scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt.designs import reference
from gpt.errors import ConfigError
from gpt.model import CausalSelfAttention
from gpt.model.design import Design, modeling_file, register
from gpt.model.flops import matmul

FEATURE_MAPS = {"elu1": "phi(x) = elu(x) + 1 (Katharopoulos et al. 2020): positive weights"}
EPS = 1e-6  # keeps a row whose keys are all padding at 0 / eps = 0


def feature_map(name: str, x: Tensor) -> Tensor:
    """phi(x) of the named feature map (FEATURE_MAPS), feature by feature."""
    if name == "elu1":
        return F.elu(x) + 1.0
    raise ValueError(f"unknown linear-attention feature map {name!r}; valid: {', '.join(FEATURE_MAPS)}")


def causal_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature: str = "elu1",
    state: tuple[Tensor, Tensor] | None = None,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) of T consecutive tokens after those summed in ``state``
    (S (B, Hkv, D, Dv), z (B, Hkv, D); None: the first tokens). key_mask (B, T): False for padding, which adds
    nothing. Query head h reads key/value head h // (H // Hkv). Returns y (B, H, T, Dv) and the state after the T."""
    group = q.size(1) // k.size(1)
    fq, fk = feature_map(feature, q), feature_map(feature, k)  # (B, H|Hkv, T, D), positive
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None].to(fk.dtype)  # padding keys: phi = 0, no weight, nothing in S or z
    weights = (fq @ fk.repeat_interleave(group, dim=1).transpose(-2, -1)).tril()  # (B, H, T, T): keys j <= i
    numerator = weights @ v.repeat_interleave(group, dim=1)  # (B, H, T, Dv)
    denominator = weights.sum(-1)  # (B, H, T)
    S, z = fk.transpose(-2, -1) @ v, fk.sum(dim=-2)  # (B, Hkv, D, Dv), (B, Hkv, D): this chunk's sums
    if state is not None:
        S0, z0 = state
        numerator = numerator + fq @ S0.repeat_interleave(group, dim=1)
        denominator = denominator + (fq @ z0.repeat_interleave(group, dim=1).unsqueeze(-1)).squeeze(-1)
        S, z = S0 + S, z0 + z
    return numerator / (denominator.unsqueeze(-1) + EPS), (S, z)


def linear_weights(q: Tensor, k: Tensor, feature: str = "elu1", key_mask: Tensor | None = None) -> Tensor:
    """The weights causal_linear_attention gives each earlier key (for pictures): (B, H, T, T), rows summing to ~1."""
    group, dtype = q.size(1) // k.size(1), torch.promote_types(q.dtype, torch.float32)  # a float64 model's stay
    fk = feature_map(feature, k.to(dtype))
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None].to(fk.dtype)
    weights = (feature_map(feature, q.to(dtype)) @ fk.repeat_interleave(group, dim=1).transpose(-2, -1)).tril()
    return weights / (weights.sum(-1, keepdim=True) + EPS)


class LinearState:
    """One layer's decoding state: S (B, Hkv, D, Dv) and z (B, Hkv, D), the sums over every token so far."""

    def __init__(self, config, cache) -> None:
        self.tokens = cache.size  # what its fixed bytes stand for: a full context
        self.state: tuple[Tensor, Tensor] | None = None

    @classmethod
    def bytes_per_token(cls, config, number_bytes: int) -> float:
        """The fixed state spread over a full context (block_size tokens)."""
        d = config.head_dim
        return config.n_kv_head * (d * d + d) * number_bytes / config.block_size

    def update(self, k: Tensor, v: Tensor, ctx) -> tuple[Tensor, Tensor]:
        """Keys and values are not kept: the layer folds them into the state (LinearAttention.attend)."""
        return k, v

    def held_bytes(self) -> int:
        """Bytes of the state: constant once the prompt is in, whatever the length."""
        return sum(t.numel() * t.element_size() for t in self.state) if self.state is not None else 0


class LinearAttention(CausalSelfAttention):
    """c_attn's q, k, v (QK-norm allowed), then causal linear attention over them after the cached state."""

    def __init__(self, config, layer: int = 0) -> None:
        super().__init__(config, layer)
        self.feature = config.design_options["linear"]["feature"]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx) -> Tensor:
        """q (B, nh, T, hs); k, v (B, nkv, T, hs) of these tokens only (earlier ones are in the state)."""
        cache = ctx.layer_cache(self.layer)
        y, state = causal_linear_attention(q, k, v, self.feature, cache.state if cache is not None else None,
                                           ctx.token_mask)
        if cache is not None:
            cache.state = state
        if self.recorded is not None:  # gpt.kernels.recording: these tokens' own weights
            self.recorded.append(linear_weights(q, k, self.feature, ctx.token_mask).detach())
        return y


class Linear(Design):
    name = "linear"
    modeling = modeling_file("linear")
    about = "causal linear attention: a feature map instead of the softmax, decoded from a running state"
    paper = "Katharopoulos et al. 2020, Transformers are RNNs"
    options = {"feature": "elu1"}  # the feature map phi (FEATURE_MAPS)
    layer = LinearAttention
    cache = LinearState
    uses_kernel = False
    view = "phi(q).phi(k) normalised over the earlier keys (the weights its running state sums)"
    conflicts = {
        "rope": "rotations do not survive the feature map; use the learned positions (neither rope nor alibi)",
        "alibi": "a score bias does not survive the feature map; use the learned positions (neither rope nor alibi)",
        "softcap": "linear attention forms no softmax scores", "sink": "linear attention forms no softmax scores",
        "diff": "differential attention subtracts two softmax maps",
    }
    cases = {"alone": {"designs": ["linear"]}, "gqa+qk_norm": {"designs": ["linear", "qk_norm"], "n_kv_head": 2},
             "mqa": {"designs": ["linear"], "n_kv_head": 1}}

    def flops(self, config, seq, flops) -> int:
        """phi(Q) phi(K)^T and weights @ v over the chunk, as the core's products; plus the state phi(K)^T V after it,
        which training computes and never differentiates (the loss does not read it): forward only."""
        return flops + matmul(config.head_dim, config.n_kv_head * config.head_dim)

    def check(self, config) -> None:
        feature = self.option(config, "feature")
        if feature not in FEATURE_MAPS:
            raise ConfigError(f"model.design_options.linear.feature must be one of {', '.join(FEATURE_MAPS)}, got "
                              f"{feature!r}", hint="model.design_options.linear.feature=elu1 (phi(x) = elu(x) + 1)")
        if config.window is not None:
            raise ConfigError("model.designs=[linear] cannot be combined with model.window: its running state "
                              "sums every earlier token",
                              hint="unset model.window, or leave linear out of model.designs")

    def activations(self, config, batch, seq, act, fused) -> int:
        """Its own (B, nh, T, T) weights instead of the kernel's maps; phi(q), phi(k), elu's outputs, the numerator."""
        n, c = batch * seq, config.n_embd
        kv = config.n_kv_head * config.head_dim
        one_map = batch * config.n_head * seq * seq * act
        return one_map - (0 if fused else 2 * one_map) + n * act * (4 * c + 2 * kv)

    def reference(self, attn, x, config) -> Tensor:
        """Katharopoulos et al. eq. 4 in float64, per query: sum_j w_j v_j / sum_j w_j with w_j = phi(q).phi(k_j)."""
        phi = lambda t: torch.where(t > 0, t + 1, torch.exp(t))  # noqa: E731  elu(x) + 1, written out
        q, k, v = reference.heads(attn, x, config)
        y = torch.zeros_like(q)  # (B, T, H, D)
        for b, h, kv, i in reference.queries(config, x):
            qi = phi(reference.transformed(attn, config, q[b, i, h], i, "q"))
            w = torch.stack([qi @ phi(reference.transformed(attn, config, k[b, j, kv], j, "k"))
                             for j in range(i + 1)])  # (i + 1,) positive
            y[b, i, h] = (w @ v[b, : i + 1, kv]) / (w.sum() + EPS)
        return reference.output(attn, config, x, y)

    def ref_pattern(self, attn, x, config) -> Tensor:
        """Its implied weights in float64: w_j / (sum_j w_j + eps), w_j = phi(q).phi(k_j), j <= i: (B, H, T, T)."""
        phi = lambda t: torch.where(t > 0, t + 1, torch.exp(t))  # noqa: E731  elu(x) + 1, written out
        q, k, _ = reference.heads(attn, x, config)
        out = torch.zeros(x.size(0), config.n_head, x.size(1), x.size(1), dtype=torch.float64)
        for b, h, kv, i in reference.queries(config, x):
            qi = phi(reference.transformed(attn, config, q[b, i, h], i, "q"))
            w = torch.stack([qi @ phi(reference.transformed(attn, config, k[b, j, kv], j, "k"))
                             for j in range(i + 1)])
            out[b, h, i, : i + 1] = w / (w.sum() + EPS)
        return out


register(Linear())
