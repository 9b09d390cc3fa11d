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
    options = {"cap": 15.0}  # scores bounded in (-cap, cap) (Gemma 2's attention: 50.0)
    kernel_options = ("softcap",)
    preset = {"attention": "manual"}  # a kernel that forms the scores
    cases = {"alone": {"designs": ["softcap"], "design_options": {"softcap": {"cap": 2.0}}}}  # small: the cap bends

    def flops(self, config, seq, flops) -> int:
        """c tanh(s / c) is elementwise: the layer's count unchanged."""
        return flops

    def check(self, config) -> None:
        cap = self.option(config, "cap")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf:
            raise ConfigError(f"model.design_options.softcap.cap must be a positive number, got {cap!r}",
                              hint="Gemma 2 uses 50.0; leave softcap out of model.designs for no cap")

    def build(self, layer, config) -> None:
        layer.softcap = self.option(config, "cap")

    def scores(self, layer, ctx):
        return {"softcap": layer.softcap}

    def ref_score(self, layer, s, i, keys, head):
        return layer.softcap * torch.tanh(s / layer.softcap)


register(SoftCap())
