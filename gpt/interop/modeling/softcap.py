"""Soft-capping's part of a remote-code export (gpt/designs/softcap.py): scores -> cap * tanh(scores / cap)."""

import torch


class Part:
    def build(self, layer, mc):
        layer.softcap = mc["attn_softcap"]

    def scores(self, layer, s, ctx):
        return layer.softcap * torch.tanh(s / layer.softcap)
