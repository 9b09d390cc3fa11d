"""QK-norm's part of a remote-code export (gpt/designs/qk_norm.py): RMS-normalised queries and keys, learned gains."""

from torch import nn


class Part:
    def build(self, layer, mc):
        layer.q_norm = nn.RMSNorm(layer.qk_dim, eps=1e-6)  # (qk_dim,) gains shared by the heads
        layer.k_norm = nn.RMSNorm(layer.qk_dim, eps=1e-6)

    def qk(self, layer, q, k, ctx):
        return layer.q_norm(q), layer.k_norm(k)
