"""QK-norm: each head's queries and keys RMS-normalised, times a learned gain per feature, before the dot product,
so the attention logits cannot grow without bound (Henry et al. 2020; Dehghani et al. 2023; OLMo 2)."""

from __future__ import annotations

import torch
from torch import nn

from gpt.model.design import Design, modeling_file, register


class QKNorm(Design):
    name = "qk_norm"
    modeling = modeling_file("qk_norm")
    about = "queries and keys RMS-normalised per head (learned gains) before the dot product"
    paper = "Henry et al. 2020, Query-Key Normalization for Transformers; Dehghani et al. 2023 (ViT-22B)"
    cases = {"alone": {"designs": ["qk_norm"]}, "gqa+window": {"designs": ["qk_norm"], "n_kv_head": 2, "window": 5}}

    def flops(self, config, seq, flops) -> int:
        """RMS norms and gains are elementwise: no matrix product, the layer's count unchanged."""
        return flops

    def build(self, layer, config) -> None:
        layer.q_norm = nn.RMSNorm(layer.qk_dim, eps=1e-6)  # (qk_dim,) gains, shared by the heads
        layer.k_norm = nn.RMSNorm(layer.qk_dim, eps=1e-6)

    def qk(self, layer, q, k, ctx):
        return layer.q_norm(q), layer.k_norm(k)

    def activations(self, config, batch, seq, act, fused) -> int:
        """The norms' inputs and outputs beside the projections' (measured: 3C + 2 x the key/value width per token),
        and each query and key head's 1/rms in float32."""
        n, kv = batch * seq, config.n_kv_head * config.head_dim
        return n * act * (3 * config.n_embd + 2 * kv) + n * 4 * (config.n_head + config.n_kv_head)

    def ref_qk(self, layer, x, position, kind):
        gain = (layer.q_norm if kind == "q" else layer.k_norm).weight.double()
        return x / torch.sqrt((x * x).mean() + 1e-6) * gain


register(QKNorm())
