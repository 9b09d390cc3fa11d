"""Gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv:2505.06708): each head's
attention output is multiplied, feature by feature, by a sigmoid gate computed from the layer's input, before the
output projection. The paper's best position, G1 (after the scaled dot-product attention), head-specific and
elementwise; it adds non-linearity between the value and output projections and lets a head's output go to zero
for a query (sparse gating), which removes the attention sink and massive activations they report.

    y = softmax(q k^T / sqrt(D)) v          (B, T, C): the heads side by side
    y = y * sigmoid(x W_gate + b_gate)      x (B, T, C): the layer's input (the block's normed hidden state)

A part, not a layer: it only adds c_gate (C -> C, one gate per head feature) and acts through Design.output, so it
combines with every design whose layer runs the core's forward (QK-norm and RoPE, as Qwen3-Next's full-attention
layers do, differential, latent, linear attention). Qwen3-Next computes the same gate inside q_proj: its output is
[query, gate] per head, so its q_proj rows of head h are this c_attn's query rows of head h followed by c_gate's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gpt.model.design import Design, modeling_file, register
from gpt.model.flops import TRAIN, matmul


class Gated(Design):
    name = "gated"
    modeling = modeling_file("gated")
    about = "gated attention: a sigmoid gate from the layer input on each head's output, before c_proj"
    paper = "Qiu et al. 2025, Gated Attention for Large Language Models (arXiv:2505.06708), position G1"
    view = "the softmax weights of each head (the gate then scales each head's output, which they do not show)"
    cases = {"alone": {"designs": ["gated"]},
             "gqa+rope+qk_norm (Qwen3-Next)": {"designs": ["gated", "rope", "qk_norm"], "n_kv_head": 2,
                                               "bias": False},
             "window+softcap+sink": {"designs": ["gated", "softcap", "sink"], "window": 4,
                                     "design_options": {"softcap": {"cap": 3.0}}},
             "diff": {"designs": ["gated", "diff"]},
             "mla": {"designs": ["gated", "mla"], "design_options": {"mla": {"latent": 12}}},
             "linear": {"designs": ["gated", "linear"]}}

    def build(self, layer, config) -> None:
        layer.c_gate = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # one gate per head feature

    def output(self, layer, y, x, ctx) -> Tensor:
        """y (B, T, C), the heads side by side, times sigmoid(c_gate(x)): each head's features gated apart."""
        return y * torch.sigmoid(layer.c_gate(x))

    def flops(self, config, seq, flops) -> int:
        """c_gate, a (C x C) product the loss depends on; the sigmoid and the product are elementwise."""
        return flops + TRAIN * matmul(config.n_embd, config.n_embd)

    def activations(self, config, batch, seq, act, fused) -> int:
        """The gate (the sigmoid's output, which its backward and the product's read) and the gated output, which
        c_proj keeps instead of the heads' outputs (those the product keeps)."""
        return 2 * batch * seq * config.n_embd * act

    def ref_output(self, layer, y, x) -> Tensor:
        gate = x @ layer.c_gate.weight.double().T
        if layer.c_gate.bias is not None:
            gate = gate + layer.c_gate.bias.double()
        return y / (1 + torch.exp(-gate))


register(Gated())
