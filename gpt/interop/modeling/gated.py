"""Gated attention's part of a remote-code export (gpt/designs/gated.py): each head's output times a sigmoid gate
from the layer's input, before c_proj (Qiu et al. 2025, position G1)."""

import torch
from torch import nn


class Part:
    def build(self, layer, mc):
        layer.c_gate = nn.Linear(mc["n_embd"], mc["n_embd"], bias=mc["bias"])  # one gate per head feature

    def output(self, layer, y, x, ctx):
        """y (B, T, C), the heads side by side; x (B, T, C), the layer's input."""
        return y * torch.sigmoid(layer.c_gate(x))
