"""Soft-capping's part of a remote-code export (gpt/designs/softcap.py): scores -> cap * tanh(scores / cap)."""

import torch


class Part:
    def build(self, layer, mc):
        layer.softcap = mc["design_options"]["softcap"]["cap"]

    def scores(self, layer, s, ctx):
        return layer.softcap * torch.tanh(s / layer.softcap)
