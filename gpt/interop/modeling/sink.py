"""The sink logit's part of a remote-code export (gpt/designs/sink.py): a learned logit per head in every softmax."""

import torch
from torch import nn


class Part:
    def build(self, layer, mc):
        layer.sink = nn.Parameter(torch.zeros(mc["n_head"]))  # (nh,) logits

    def sink(self, layer):
        return layer.sink
