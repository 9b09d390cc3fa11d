"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax's e^(q.k) replaced by a
kernel phi(q).phi(k) with a positive feature map, so the weighted sum over earlier keys is a running state.

    y_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps),  S_i = sum_{j<=i} phi(k_j) v_j^T,  z_i = sum_{j<=i} phi(k_j)

Over a chunk of tokens this computes the masked (T x T) form, phi(Q) phi(K)^T with the future zeroed, plus what a
state (S, z) of earlier tokens contributes; it returns the state after the chunk, which is all a decoder keeps:
(D x Dv + D) numbers per key/value head, whatever the context length. Not a registry kernel: no softmax, no scale.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

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
    group = q.size(1) // k.size(1)
    fk = feature_map(feature, k.float())
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None].to(fk.dtype)
    weights = (feature_map(feature, q.float()) @ fk.repeat_interleave(group, dim=1).transpose(-2, -1)).tril()
    return weights / (weights.sum(-1, keepdim=True) + EPS)
