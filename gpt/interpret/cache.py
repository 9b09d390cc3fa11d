"""run_with_cache: one forward pass that keeps the activations asked for, by hook name (TransformerLens' layout)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from gpt.errors import UserError
from gpt.interpret.hooks import PATTERN_HOOKS, hook_points, hooks, layer_of, resolve
from gpt.interpret.patterns import own_layer, uses_kernel

MAPS = "_maps"  # a layer that calls its kernel more than once keeps each call's map under <hook name>_maps


class ActivationCache(dict):
    """Hook name -> activation: (B, T, C) residual-stream tensors, (B, T, H, D) heads, (B, H, Tq, Tk) scores and
    patterns. A layer with several maps per forward (differential attention) keeps its declared pattern (its
    ``attention_map``: w1 - lambda w2) under hook_pattern and the maps themselves stacked under hook_pattern_maps."""

    def pattern(self, layer: int) -> Tensor:
        """blocks.{layer}.attn.hook_pattern, or a UserError saying it was not asked for or the design shows none."""
        name = f"blocks.{layer}.attn.hook_pattern"
        if name not in self:
            raise UserError(f"no attention pattern for layer {layer} in this cache",
                            hint=f"ask run_with_cache for {name}")
        return self[name]


def check_tokens(model: nn.Module, tokens: Tensor, targets: bool = False) -> Tensor:
    """(B, T) or (T,) token ids the model can read: within its vocabulary and context (one more with ``targets``:
    the model reads all but the last, which only the loss reads)."""
    tokens = torch.as_tensor(tokens)
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    config = model.config
    if tokens.dim() != 2 or tokens.size(1) == 0:
        raise UserError(f"tokens must be a (batch, positions) tensor of ids, got shape {tuple(tokens.shape)}")
    if tokens.size(1) - targets > config.block_size:
        raise UserError(f"the prompt has {tokens.size(1)} tokens, more than the model's context of "
                        f"{config.block_size}" + (" and the token after it" if targets else ""),
                        hint="shorten the prompt")
    if tokens.min() < 0 or tokens.max() >= config.vocab_size:
        raise UserError(f"token ids must lie in 0..{config.vocab_size - 1}, got {int(tokens.min())}.."
                        f"{int(tokens.max())}")
    return tokens.to(next(model.parameters()).device)


@contextmanager
def caching(model: nn.Module, names: list[str] | str | None = None) -> Iterator[ActivationCache]:
    """Within the block, forward passes fill the cache (the last pass's activations); patterns as for run_with_cache."""
    picked = resolve(model, names)
    if names is None:  # everything: the scores only where the layers form them
        picked = [n for n in picked if uses_kernel(model.config) or not n.endswith("hook_attn_scores")]
    cache, calls = ActivationCache(), {}

    def keep(x: Tensor, hook: Any) -> None:
        calls.setdefault(hook.name, []).append(x.detach())

    with hooks(model, [(name, keep) for name in picked]):
        yield cache
        _fill(model, cache, calls, picked, strict=names is not None)


def run_with_cache(model: nn.Module, tokens: Tensor, names: list[str] | str | None = None,
                   **forward: Any) -> tuple[Tensor, ActivationCache]:
    """The logits of one forward pass (no gradients) and the activations of the hook names asked for (exact names
    or shell patterns; None: all). Patterns are computed for the layers asked for, whatever the kernel."""
    tokens = check_tokens(model, tokens)
    with caching(model, names) as cache, torch.no_grad():
        logits, _ = model(tokens, **forward)
    return logits, cache


def _fill(model: nn.Module, cache: ActivationCache, calls: dict[str, list[Tensor]], picked: list[str],
          strict: bool) -> None:
    """One entry per name from what its hook saw; several maps of one layer combined as the layer declares. A pattern
    asked for by name that no layer showed is a UserError (strict)."""
    for name in picked:
        seen = calls.get(name)
        if not seen:
            if strict and name.endswith(PATTERN_HOOKS):
                raise UserError(f"{own_layer(model.config)} shows no attention pattern ({name}): it computes "
                                "attention without a kernel and records no weights",
                                hint="a layer design shows its weights by appending them to self.recorded")
            continue
        if len(seen) == 1:
            cache[name] = seen[0]
            continue
        cache[name + MAPS] = torch.stack(seen)
        combine = getattr(layer_of(model, name), "attention_map", None)
        if name.endswith("hook_pattern") and combine is not None:
            cache[name] = combine(seen)
        else:
            cache[name] = torch.stack(seen)
    hook_points(model)  # names stay set for later hooks
