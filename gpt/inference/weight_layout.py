"""Weights stored for one-token decoding on a CPU: every Linear's matrix contiguous along its longer side.

A decode step multiplies one row by each weight matrix (a matrix-vector product), so its speed is the speed of
streaming the weights from memory, and on a CPU that depends on how they lie. Measured with torch's MKL on this
project's 2-core AMD EPYC (1 thread, docs/benchmarks.md): GPT-2's lm_head (768 -> 50257) took 16.3 ms stored as
(in, out) against 34.3 ms as nn.Linear's (out, in), c_fc (768 -> 3072) 1.0 ms against 1.7; the MLP's c_proj
(3072 -> 768) was faster as (out, in), 1.0 ms against 1.4. The rule that fits each: keep the longer dimension
contiguous. ``gemv_layout`` re-strides the matrices in place: the same values and shapes (a state dict, a
checkpoint and every caller see no difference), each Parameter object kept (a tied head and embedding stay one
tensor); the multiplications sum in another order, so logits may differ from before in the last bits.

Only for a model that decodes: training, a batch's matrix products or another device gain nothing from it.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def gemv_layout(model: nn.Module) -> int:
    """Store each Linear weight of a CPU model with more outputs than inputs as (in, out) in memory (a transposed
    view of a contiguous (in, out) tensor); returns how many were re-strided. Runs once after loading; a second call
    changes nothing."""
    done, seen = 0, set()
    for module in model.modules():
        if not isinstance(module, nn.Linear) or id(module.weight) in seen:
            continue
        weight = module.weight
        seen.add(id(weight))
        out_features, in_features = weight.shape
        if weight.device.type == "cpu" and out_features > in_features and weight.is_contiguous():
            weight.data = weight.data.t().contiguous().t()
            done += 1
    return done
