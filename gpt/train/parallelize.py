"""Memory-saving transformations applied to a built model from outside it (torchtitan style).

gpt/model.py knows nothing of them: activation checkpointing patches each Block's forward on the
instance, so parameter names (and so checkpoints) stay exactly those of the plain model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpt.model import GPT


def _checkpointed(forward: Callable[..., torch.Tensor], block: nn.Module) -> Callable[..., torch.Tensor]:
    """``forward`` recomputed in the backward pass when it runs for training; called as-is otherwise.

    Non-reentrant checkpointing with preserve_rng_state: the recomputation redraws the same dropout masks,
    so losses and gradients are bitwise those of the plain forward. Evaluation and generation (no grad,
    or a KV cache to fill) run the plain forward: nothing is saved for a backward there anyway.
    """

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> torch.Tensor:
        if not (block.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)

    return run


def apply_activation_checkpointing(model: GPT) -> GPT:
    """Recompute every transformer Block's activations in the backward pass instead of keeping them.

    Only each block's input stays saved between forward and backward (B x T x n_embd per block) in
    place of the ~17 tensors of that size its layers keep; the price is a second forward of each block.
    """
    for block in model.transformer.h:
        if getattr(block, "_activation_checkpointing", False):
            continue
        block.forward = _checkpointed(block.forward, block)  # an instance attribute: names stay the same
        block._activation_checkpointing = True
    return model
