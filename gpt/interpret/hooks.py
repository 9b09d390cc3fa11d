"""The model's hook points by TransformerLens' names, and attaching functions to them for the length of a block.

Names: ``hook_embed``, ``hook_pos_embed`` (models with a learned position table), ``blocks.{l}.hook_resid_pre``,
``blocks.{l}.attn.hook_q`` / ``hook_k`` / ``hook_v`` (as the kernel sees them: after RoPE or QK-norm, with the
cached keys), ``blocks.{l}.attn.hook_attn_scores``, ``blocks.{l}.attn.hook_pattern``, ``blocks.{l}.attn.hook_z``,
``blocks.{l}.hook_attn_out``, ``blocks.{l}.hook_resid_mid``, ``blocks.{l}.hook_mlp_out``,
``blocks.{l}.hook_resid_post``, ``ln_final.hook_normalized``. The scores and the pattern come from
gpt.interpret.patterns, installed only while a function watches them, so a forward pass with none attached runs the
kernel it always runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase

from torch import nn

from gpt.errors import UserError
from gpt.interpret import patterns
from gpt.model.hooks import HookFn, HookPoint

PATTERN_HOOKS = ("hook_attn_scores", "hook_pattern")
_RENAMED = {"hook_final": "ln_final.hook_normalized"}


def tl_name(path: str) -> str:
    """A HookPoint's module path as TransformerLens names it: transformer.h.3.attn.hook_q -> blocks.3.attn.hook_q
    (through a torch.compile or DDP wrapper too)."""
    path = re.sub(r"^(_orig_mod\.|module\.)+", "", path)
    return _RENAMED.get(path, re.sub(r"^transformer\.h\.(\d+)\.", r"blocks.\1.", path))


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of the model by name, in the order of the forward pass's modules."""
    points = {}
    for path, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.name = tl_name(path)
            points[module.name] = module
    return points


def valid_names(model: nn.Module) -> str:
    """The hook names, each layer's written once with {l} and the range: for error messages."""
    n_layer = model.config.n_layer
    names = []
    for name in hook_points(model):
        short = re.sub(r"^blocks\.\d+\.", "blocks.{l}.", name)
        if short not in names:
            names.append(short)
    return ", ".join(names) + f" (l = 0..{n_layer - 1})"


def resolve(model: nn.Module, names: list[str] | str | None) -> list[str]:
    """The hook names that ``names`` picks (exact names, or shell patterns like blocks.*.attn.hook_pattern; None:
    every one); an unknown name is a UserError listing the valid ones."""
    points = list(hook_points(model))
    if names is None:
        return points
    picked: list[str] = []
    for pattern in [names] if isinstance(names, str) else names:
        matched = [n for n in points if fnmatchcase(n, pattern)]
        if not matched:
            raise UserError(f"unknown hook name {pattern!r}; valid: {valid_names(model)}",
                            hint="layers count from 0; shell patterns such as blocks.*.attn.hook_pattern work too")
        picked += [n for n in matched if n not in picked]
    return picked


def layer_of(model: nn.Module, name: str) -> nn.Module:
    """The attention layer that owns a blocks.{l}.attn.* hook."""
    return model.transformer.h[int(name.split(".")[1])].attn


@contextmanager
def hooks(model: nn.Module, fns: list[tuple[str, HookFn]]) -> Iterator[dict[str, HookPoint]]:
    """Within the block, each fn(activation, hook) is called where its hook name (or pattern) is, and may return a
    replacement; the scores and pattern of a layer are computed while a function watches them. All removed after."""
    points = hook_points(model)
    attached: list[tuple[HookPoint, HookFn]] = []
    watched: list[nn.Module] = []
    try:
        for pattern, fn in fns:
            for name in resolve(model, pattern):
                if name.rsplit(".", 1)[-1] in PATTERN_HOOKS:
                    layer = layer_of(model, name)
                    patterns.check(layer, model.config, name)
                    if layer not in watched:
                        patterns.watch(layer, model.config)
                        watched.append(layer)
                points[name].add(fn)
                attached.append((points[name], fn))
        yield points
    finally:
        for point, fn in attached:
            point.remove(fn)
        for layer in watched:
            patterns.unwatch(layer)


ABLATIONS = ("zero", "mean")


def ablate_heads(heads: list[tuple[int, int]], how: str = "zero") -> list[tuple[str, Callable]]:
    """Hook functions that replace the output z of each (layer, head) before the out projection: by zeros
    (``how="zero"``), or by its mean over the batch and positions of the same pass (``how="mean"``, mean ablation:
    the head's average contribution stays, what it says about each token goes)."""
    if how not in ABLATIONS:
        raise ValueError(f"unknown ablation {how!r}; valid: {', '.join(ABLATIONS)}")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def ablate(chosen: list[int]) -> HookFn:
        def fn(z, hook):
            z = z.clone()  # (B, T, H, D)
            z[:, :, chosen] = 0.0 if how == "zero" else z[:, :, chosen].mean(dim=(0, 1), keepdim=True)
            return z
        return fn

    return [(f"blocks.{layer}.attn.hook_z", ablate(chosen)) for layer, chosen in by_layer.items()]
