"""A sink logit per head (attention sinks, as in gpt-oss): a learned logit joins every softmax and takes its share of
the weight without a value, so a head may attend "nowhere"."""

from __future__ import annotations

import torch
from torch import nn

from gpt.model.design import Design, modeling_file, register


class Sink(Design):
    name = "sink"
    modeling = modeling_file("sink")
    about = "a learned sink logit per head joins every softmax (the weight may go nowhere)"
    paper = "Xiao et al. 2023 (attention sinks); OpenAI 2025, gpt-oss (a learned sink per head)"
    kernel_options = ("sink",)
    preset = {"attention": "manual"}
    cases = {"alone": {"designs": ["sink"]}}

    def flops(self, config, seq, flops) -> int:
        """One more logit per softmax row, which carries no value: no matrix product, the count unchanged."""
        return flops

    def build(self, layer, config) -> None:
        layer.sink = nn.Parameter(torch.zeros(config.n_head))  # (nh,) logits

    def scores(self, layer, ctx):
        return {"sink": layer.sink}

    def ref_sink(self, layer, head):
        return torch.exp(layer.sink[head].double())


register(Sink())
