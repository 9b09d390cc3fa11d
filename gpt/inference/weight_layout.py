"""Weights stored for decoding on a CPU: every Linear's matrix contiguous along its longer side (one sequence's
steps), or packed for oneDNN's matrix products (``onednn_linears``: a server's batched steps, and a sequence's
steps at more than one thread, ``decode_layout``).

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


PACKED_MIN_WEIGHTS = 1 << 18  # smaller matrices (the default model's) stay MKL's: oneDNN's call costs more there
MKL_ONE_ROW_THREADS = 1  # one row at this many threads or fewer keeps MKL's product: its gemv was faster there


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear (x86 and most CPU builds; private ops, so checked)."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


@torch.no_grad()
def onednn_linears(model: nn.Module, rows: int = 32, smallest: int = PACKED_MIN_WEIGHTS) -> int:
    """Give each float32 CPU Linear of ``smallest`` weights or more a copy of its weight packed in oneDNN's blocked
    layout (as vLLM's CPU build and torch.compile's freezing do), which its forward uses outside autograd and
    autocast, except for one row at one thread (``_packed_forward``); ``rows`` is the batch oneDNN lays it out for
    (a server's slots, a sequence's 1). Returns how many were packed (0 where oneDNN is missing). Measured on this
    project's 2-core AMD EPYC: at 1 thread and 32 rows GPT-2's lm_head took 29 ms against F.linear's 63-70 ms, its
    blocks' matrices 1.3-1.4x faster; all of GPT-2's matrices for one row at 2 threads 21-26 ms against 40-45 ms
    for F.linear and 30-40 ms for MKL's gemv on (in, out) storage (docs/benchmarks.md); a 128 x 512 matrix (the
    default model's) 63 us against 50 us, the crossover near 512 x 512. The weights are untouched (state dict,
    tying); the copies cost the Linears' memory once more, and the sums run in another order (the last bits of
    float32). For a model that only decodes or serves: a weight changed later misses its copy."""
    if not onednn_available():
        return 0
    done = 0
    for module in model.modules():
        if (not isinstance(module, nn.Linear) or module.weight.device.type != "cpu"
                or module.weight.dtype != torch.float32 or module.weight.numel() < smallest
                or "forward" in vars(module)):
            continue
        packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach().contiguous(), rows)
        module.forward = _packed_forward(module, packed)
        done += 1
    return done


def packed_forward(module: nn.Module):
    """The forward onednn_linears gave this Linear (a plain function: callers may skip the module call), or None."""
    forward = vars(module).get("forward")
    return forward if getattr(forward, "packed", None) is not None else None


def _packed_forward(module: nn.Linear, packed: torch.Tensor):
    """A Linear's forward through its packed weight where that is exact to use (no autograd, no autocast) and pays
    (not one row at one thread, where MKL's gemv on the Linear's own storage was faster), else nn.Linear's own."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        if (x.dtype != torch.float32 or x.device.type != "cpu"
                or (x.numel() == x.size(-1) and torch.get_num_threads() <= MKL_ONE_ROW_THREADS)
                or (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad))
                or torch.is_autocast_enabled("cpu")):
            return nn.functional.linear(x, module.weight, module.bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")
    forward.packed = packed
    return forward


@torch.no_grad()
def decode_layout(model: nn.Module, onednn: bool = True) -> None:
    """Store a decoding model's weights for a CPU's one-token steps (generate and chat): gemv_layout, and with
    ``onednn`` and more than one torch thread oneDNN's packed copies for one row (onednn_linears(rows=1)), through
    which GPT-2's one-row products at 2 threads ran 1.15x to 1.9x as fast as MKL's gemv, and its whole decoding 1.13x
    (docs/benchmarks.md). At one thread nothing is packed: a step's one-row products would keep MKL's gemv anyway,
    and the copies cost the large Linears' memory."""
    gemv_layout(model)
    if onednn and torch.get_num_threads() > MKL_ONE_ROW_THREADS:
        onednn_linears(model, rows=1)
