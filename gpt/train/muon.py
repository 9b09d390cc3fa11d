"""Muon for the transformer blocks' hidden matrices and AdamW for every other parameter, as one optimizer.

Muon (Keller Jordan, 2024; the optimizer of modded-nanogpt's records and of nanochat) keeps a Nesterov momentum of
each matrix's gradient and replaces the update by its nearest semi-orthogonal matrix, computed with five
Newton-Schulz iterations. It is meant for the 2-D weights of hidden layers; embeddings, the output head, norm gains,
biases and any other scalar or vector parameter stay with AdamW (:func:`split_parameters` holds the rule).

Under FSDP every rank holds a slice of each matrix, and the orthogonalisation needs the whole one: each matrix gets
an owner rank (round robin), which gathers the matrix's slices from all ranks, orthogonalises it and scatters the
slices back (:func:`orthogonalise_sharded`), so the work is spread over the ranks as in nanochat's and
modded-nanogpt's distributed Muon. The result equals the single-process update: elementwise work on slices is
elementwise work on the whole.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

# The quintic Newton-Schulz coefficients of Keller Jordan's Muon (also torch.optim.Muon's defaults).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def newton_schulz(grad: Tensor, dtype: torch.dtype, steps: int = NS_STEPS) -> Tensor:
    """The semi-orthogonal matrix nearest to ``grad`` (m, n), approximately (singular values in ~[0.7, 1.2]).

    The same iteration as torch.optim.Muon's, computed in ``dtype``: bfloat16 on a GPU (as the anchors), float32 on a
    CPU without bfloat16 matrix units, where bfloat16 matmuls are ~14x slower."""
    a, b, c = NS_COEFFICIENTS
    x = grad.to(dtype)
    wide = grad.size(0) > grad.size(1)
    if wide:
        x = x.T  # (n, m): the Gram matrix below is the smaller one
    x = x.div(x.norm().clamp(min=NS_EPS))  # spectral norm <= Frobenius norm = 1
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b G + c G^2) X
    return x.T if wide else x


def lr_scale(shape: torch.Size) -> float:
    """Muon's per-matrix step scale, sqrt(max(1, rows / cols)) (Keller Jordan's; torch.optim.Muon's "original")."""
    return math.sqrt(max(1.0, shape[0] / shape[1]))


def orthogonalise_sharded(updates: list[DTensor], dtype: torch.dtype) -> list[Tensor]:
    """Each rank's slice of the orthogonalised matrices, for updates sharded on dim 0 (FSDP2's Shard(0)).

    Matrix i belongs to rank i % world: every rank sends it its slice (gather, padded to equal size), the owner
    orthogonalises the whole matrix and sends every rank its slice back (scatter). All transfers of a phase are
    in flight together."""
    if not updates:
        return []
    mesh = updates[0].device_mesh
    if mesh.ndim != 1 or any(u.placements != (Shard(0),) for u in updates):
        raise NotImplementedError("Muon under FSDP expects parameters sharded on dim 0 over one mesh dimension")
    group, world, rank = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    owner = [dist.get_global_rank(group, i % world) for i in range(len(updates))]
    chunks = [-(-u.shape[0] // world) for u in updates]  # rows of each rank's padded slice (torch.chunk's split)
    gathered: list[list[Tensor] | None] = []
    pending = []
    for i, u in enumerate(updates):
        local = u.to_local()
        padded = local.new_zeros((chunks[i], *u.shape[1:]))
        padded[:local.shape[0]] = local
        mine = i % world == rank
        parts = [torch.empty_like(padded) for _ in range(world)] if mine else None
        gathered.append(parts)
        pending.append(dist.gather(padded, parts, dst=owner[i], group=group, async_op=True))
    for work in pending:
        work.wait()
    slices, pending = [], []
    for i, u in enumerate(updates):
        local_rows = u.to_local().shape[0]
        out = u.to_local().new_empty((chunks[i], *u.shape[1:]), dtype=dtype)
        parts = None
        if gathered[i] is not None:
            full = torch.cat(gathered[i])[:u.shape[0]]  # (rows, cols): the whole update
            ortho = newton_schulz(full, dtype)
            parts = list(torch.cat([ortho, ortho.new_zeros(chunks[i] * world - u.shape[0], *u.shape[1:])])
                         .split(chunks[i]))
        pending.append(dist.scatter(out, parts, src=owner[i], group=group, async_op=True))
        slices.append((out, local_rows))
    for work in pending:
        work.wait()
    return [out[:rows] for out, rows in slices]


@contextmanager
def only_groups(optimizer: torch.optim.Optimizer, groups: list[dict]) -> Iterator[None]:
    """The optimizer sees only ``groups`` for the duration (its state stays shared)."""
    every = optimizer.param_groups
    optimizer.param_groups = groups
    try:
        yield
    finally:
        optimizer.param_groups = every


class MuonAdamW(torch.optim.AdamW):
    """torch's AdamW for the groups marked ``muon: False``, Muon for those marked ``muon: True``.

    One optimizer, so the training loop, the gradient scaler and the checkpoints (single file, or sharded with
    torch.distributed.checkpoint) treat it as they treat AdamW: AdamW's parameters keep exp_avg, exp_avg_sq and
    step, Muon's a momentum_buffer. Muon groups also hold ``momentum`` and ``nesterov``; ``ns_dtype`` is the dtype of
    the Newton-Schulz iteration (a choice of the device, so not saved with the state)."""

    def __init__(self, params: list[dict], ns_dtype: torch.dtype = torch.bfloat16, **adamw: Any) -> None:
        super().__init__(params, **adamw)
        self.ns_dtype = ns_dtype

    def __setstate__(self, state: dict) -> None:
        """AdamW's (which checks every parameter's state for a ``step``), with Muon's momentum buffers put back
        after it."""
        muon = {p: s for p, s in state["state"].items() if "momentum_buffer" in s}
        adamw = defaultdict(dict, {p: s for p, s in state["state"].items() if p not in muon})
        super().__setstate__({**state, "state": adamw})
        self.state.update(muon)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        muon = [g for g in self.param_groups if g["muon"]]
        with only_groups(self, [g for g in self.param_groups if not g["muon"]]):
            super().step()
        for group in muon:
            self.muon_step(group)
        return loss

    def muon_step(self, group: dict) -> None:
        """Nesterov momentum, then the orthogonalised update with decoupled weight decay (as torch.optim.Muon)."""
        params = [p for p in group["params"] if p.grad is not None]
        updates = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - group["momentum"])
            updates.append(p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf)
        dtype = self.ns_dtype
        sharded = [u for u in updates if isinstance(u, DTensor)]
        plain = iter([newton_schulz(u, dtype) for u in updates if not isinstance(u, DTensor)])
        shards = iter(orthogonalise_sharded(sharded, dtype))
        lr, decay = group["lr"], group["weight_decay"]
        for p, u in zip(params, updates):
            ortho = next(shards) if isinstance(u, DTensor) else next(plain)
            local = p.to_local() if isinstance(p, DTensor) else p
            local.mul_(1 - lr * decay)
            local.add_(ortho, alpha=-lr * lr_scale(p.shape))


@dataclass
class ParameterSplit:
    """Which parameters Muon takes and which AdamW keeps (with or without weight decay), by name."""

    muon: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    adamw_decay: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    adamw_no_decay: list[tuple[str, nn.Parameter]] = field(default_factory=list)


def split_parameters(model: nn.Module) -> ParameterSplit:
    """Muon: the 2-D weight of every nn.Linear inside the transformer blocks (``transformer.h``): the attention and
    MLP projections of any design, including one a user brings. AdamW: everything else; embeddings and the head
    (2-D, outside the blocks, or an nn.Embedding inside one) with weight decay, norm gains, biases and every other
    vector or scalar parameter without.

    Parameters shared by two modules (a tied head) are counted once, under their first name."""
    blocks = model.transformer.h
    in_blocks = {id(p) for m in blocks.modules() if isinstance(m, nn.Linear) for p in [m.weight] if p.dim() == 2}
    split, seen = ParameterSplit(), set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in in_blocks:
            split.muon.append((name, p))
        elif p.dim() >= 2:
            split.adamw_decay.append((name, p))
        else:
            split.adamw_no_decay.append((name, p))
    return split
