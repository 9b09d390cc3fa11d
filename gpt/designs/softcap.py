"""Logit soft-capping (Gemma 2): scores -> cap * tanh(scores / cap), bounded in (-cap, cap), inside the kernel."""

from __future__ import annotations

import math

import torch

from gpt.errors import ConfigError
from gpt.model.design import Design, modeling_file, register


class SoftCap(Design):
    name = "softcap"
    modeling = modeling_file("softcap")
    about = "soft-capped attention scores: cap * tanh(scores / cap)"
    paper = "Gemma Team 2024, Gemma 2 (logit soft-capping)"
    switch = "attn_softcap"
    kernel_options = ("softcap",)
    preset = {"attn_softcap": 15.0, "attention": "manual"}  # a kernel that forms the scores
    cases = {"alone": {"attn_softcap": 2.0}}  # small, so the cap bends the scores

    def flops(self, config, seq, flops) -> int:
        """c tanh(s / c) is elementwise: the layer's count unchanged."""
        return flops

    def check(self, config) -> None:
        cap = config.attn_softcap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
            raise ConfigError(f"model.attn_softcap must be a positive number or null, got {cap!r}",
                              hint="Gemma 2 uses 50.0; null turns the cap off")

    def build(self, layer, config) -> None:
        layer.softcap = config.attn_softcap

    def scores(self, layer, ctx):
        return {"softcap": layer.softcap}

    def ref_score(self, layer, s, i, keys, head):
        return layer.softcap * torch.tanh(s / layer.softcap)


register(SoftCap())
