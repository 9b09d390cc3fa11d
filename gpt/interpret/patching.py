"""Activation patching: run the corrupted prompt with one activation taken from the clean run, and see how much of
the clean answer comes back. By layer x position (the residual stream entering each block) and by head (a head's
output z at every position). 1 = the clean run's metric, 0 = the corrupted run's."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gpt.errors import UserError
from gpt.interpret.cache import check_tokens, run_with_cache
from gpt.interpret.heads import evaluating
from gpt.interpret.hooks import hooks


def answer_metric(clean_logits: Tensor, corrupted_logits: Tensor):
    """The metric on the last position's logits: the clean answer's logit minus the corrupted answer's (their top
    tokens), or the clean answer's log-probability where both prompts answer the same. Returns (fn, description)."""
    clean, corrupted = int(clean_logits[0, -1].argmax()), int(corrupted_logits[0, -1].argmax())
    if clean != corrupted:
        return (lambda logits: float(logits[0, -1, clean] - logits[0, -1, corrupted]),
                {"metric": "logit difference", "clean_answer": clean, "corrupted_answer": corrupted})
    return (lambda logits: float(logits[0, -1].float().log_softmax(-1)[clean]),
            {"metric": "log-probability of the clean answer", "clean_answer": clean, "corrupted_answer": corrupted})


def patch(model: nn.Module, clean: Tensor, corrupted: Tensor) -> dict:
    """Patching results for one clean and one corrupted prompt of the same length (1, T) each."""
    clean, corrupted = check_tokens(model, clean), check_tokens(model, corrupted)
    if clean.shape != corrupted.shape:
        raise UserError(f"patching needs prompts of the same length: the clean one has {clean.size(1)} tokens, the "
                        f"corrupted one {corrupted.size(1)}", hint="change a token or two, keeping the length")
    n_layer, n_head = model.config.n_layer, model.config.n_head
    with evaluating(model):
        clean_logits, cache = run_with_cache(model, clean, ["blocks.*.hook_resid_pre", "blocks.*.attn.hook_z"])
        corrupted_logits, _ = run_with_cache(model, corrupted, [])
        metric, about = answer_metric(clean_logits, corrupted_logits)
        low, high = metric(corrupted_logits), metric(clean_logits)

        def restored(fns) -> float:
            with hooks(model, fns), torch.no_grad():
                value = metric(model(corrupted)[0])
            return (value - low) / (high - low) if high != low else float("nan")

        def resid(layer: int, position: int):
            def fn(x, hook):
                x = x.clone()
                x[:, position] = cache[f"blocks.{layer}.hook_resid_pre"][:, position]
                return x
            return [(f"blocks.{layer}.hook_resid_pre", fn)]

        def head(layer: int, h: int):
            def fn(z, hook):
                z = z.clone()
                z[:, :, h] = cache[f"blocks.{layer}.attn.hook_z"][:, :, h]
                return z
            return [(f"blocks.{layer}.attn.hook_z", fn)]

        by_position = torch.tensor([[restored(resid(layer, p)) for p in range(clean.size(1))]
                                    for layer in range(n_layer)])
        by_head = torch.tensor([[restored(head(layer, h)) for h in range(n_head)] for layer in range(n_layer)])
    return {**about, "clean_metric": high, "corrupted_metric": low, "resid_pre_by_layer_position": by_position,
            "z_by_head": by_head}
