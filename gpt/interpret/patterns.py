"""Attention scores and patterns recomputed from q and k through each design's own score path, even where a fused
kernel (sdpa, flex) never forms them.

A layer whose attention goes through its kernel (the core with its parts, MLA, differential attention, which calls
it once per map) gets a wrapped kernel: the scores are formed as the manual kernel forms them (the scale, soft-cap,
bias, sink, causal window and padding masks it is handed), ``hook_attn_scores`` and ``hook_pattern`` see them, and
the original kernel computes the output, unless a hook replaced the scores or the pattern: then the output is the
pattern times the values, so patching a pattern changes what the layer computes. A layer that computes attention
itself (linear attention, a user's layer with ``uses_kernel = False``) shows the weights it appends to
``self.recorded`` (gpt.kernels.recording's protocol): read-only, since it does not compute from them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt.errors import UserError
from gpt.kernels import scores as score_variants
from gpt.kernels.masks import combine, expand_kv
from gpt.model import design as designs


def own_layer(config: Any) -> str:
    """The design whose layer this is, for messages ("the core" when none replaces it)."""
    return next((f"design {d.name}" for d in designs.active(config) if d.layer is not None), "the core layer")


def uses_kernel(config: Any) -> bool:
    """Whether this config's attention layers compute through their kernel (so the scores can be formed)."""
    return all(d.uses_kernel for d in designs.active(config))


def scores_of(q: Tensor, k: Tensor, causal: bool = True, mask: Tensor | None = None, window: int | None = None,
              scale: float | None = None, softcap: float | None = None, bias: Tensor | None = None) -> Tensor:
    """Scaled, modified scores (B, H, Tq, Tk) as the manual kernel forms them, masked positions -inf; float32 at
    least (a float64 model stays float64)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    k, _ = expand_kv(q, k, k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = score_variants.modify((q.to(dtype) @ k.to(dtype).transpose(-2, -1)) * scale, softcap, bias)
    allowed = combine(q.size(-2), k.size(-2), causal, mask, q.device, window)
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


def pattern_of(scores: Tensor, sink: Tensor | None = None) -> Tensor:
    """The softmax of the scores (with a sink's share dropped); rows with nothing to see all zero, not NaN."""
    weights = score_variants.softmax(scores, sink)
    return weights.masked_fill(scores == float("-inf"), 0.0)


def watched_kernel(layer: nn.Module, kernel):
    """``kernel`` with the layer's score and pattern hooks on the weights it computes (see the module's doc)."""

    def watched(q, k, v, *, causal=True, mask=None, dropout_p=0.0, scale=None, window=None, softcap=None,
                bias=None, sink=None, **rest):
        scores = scores_of(q, k, causal, mask, window, scale, softcap, bias)
        hooked_scores = layer.hook_attn_scores(scores)
        weights = pattern_of(hooked_scores, sink)
        hooked = layer.hook_pattern(weights)
        if hooked_scores is scores and hooked is weights:  # only read: the layer's own kernel computes the output
            return kernel(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p, scale=scale, window=window,
                          **{n: x for n, x in dict(softcap=softcap, bias=bias, sink=sink).items() if x is not None},
                          **rest)
        if dropout_p:
            hooked = F.dropout(hooked, dropout_p)
        _, v = expand_kv(q, v, v)
        return (hooked @ v.to(hooked.dtype)).to(q.dtype)

    return watched


class Recorded(list):
    """A layer's ``recorded`` list whose weights go through its hook_pattern as the layer appends them."""

    def __init__(self, layer: nn.Module, config: Any) -> None:
        super().__init__()
        self.layer, self.config = layer, config

    def append(self, weights: Tensor) -> None:
        if self.layer.hook_pattern(weights) is not weights:
            raise UserError(f"{own_layer(self.config)} computes its attention itself: its pattern can be read, "
                            "not written", hint="patch hook_z or hook_q/hook_k/hook_v instead")


def check(layer: nn.Module, config: Any, name: str) -> None:
    """Refuse the scores of a layer that forms none."""
    if name.endswith("hook_attn_scores") and not uses_kernel(config):
        raise UserError(f"{name}: {own_layer(config)} forms no softmax scores (it computes attention without a "
                        "kernel)", hint="ask for hook_pattern, the weights it shows")


def watch(layer: nn.Module, config: Any) -> None:
    """Make the layer show its scores and pattern to its hooks, until as many unwatch calls (watches nest)."""
    depth = vars(layer).get("_watched", 0)
    layer._watched = depth + 1
    if depth:
        return
    if uses_kernel(config):
        layer._unwatched = layer.kernel
        layer.kernel = watched_kernel(layer, layer.kernel)
    else:
        layer.recorded = Recorded(layer, config)


def unwatch(layer: nn.Module) -> None:
    """The layer as it was before the first watch, once every watch is undone."""
    layer._watched -= 1
    if layer._watched:
        return
    del layer._watched
    if "_unwatched" in vars(layer):
        layer.kernel = vars(layer).pop("_unwatched")
    elif "recorded" in vars(layer):
        del layer.recorded  # back to the class's None
