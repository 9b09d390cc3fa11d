"""Memory-saving transformations applied to a built model from outside it (torchtitan style), and the
state-dict and gradient helpers that work whether the model is sharded or not.

gpt/model/gpt.py knows nothing of them: activation checkpointing patches each Block's forward on the
instance and FSDP2's fully_shard registers hooks, so parameter names (and so checkpoints) stay
exactly those of the plain model.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from gpt.model import GPT
from gpt.train.config import TrainConfig
from gpt.train.distributed import AbortRun, Ranks


def _dcp_state_dict():
    """torch.distributed.checkpoint.state_dict, imported where a sharded model needs it: a single-process run
    never does, and the import costs it about 0.2 s and 4 MiB of resident memory (docs/benchmarks.md)."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


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


def check_fsdp(train: TrainConfig, precision: str, ranks: Ranks) -> None:
    """Refuse train.fsdp=true where it cannot run, with the fix, before anything is built (every rank agrees)."""
    if not train.fsdp:
        return
    if not ranks.enabled:
        raise AbortRun("train.fsdp=true shards the model over several processes, but this is a single one",
                        hint="launch with torchrun --nproc_per_node=<GPUs> scripts/train.py ... train.fsdp=true")
    if precision == "fp16":
        raise AbortRun("train.fsdp=true does not support precision=fp16 (its gradient scaler is not shard-aware)",
                        hint="use precision=bf16 (or fp32) with train.fsdp=true")
    if train.compile:
        raise AbortRun("train.fsdp=true with train.compile=true is not supported", hint="drop train.compile=true")
    if train.eval_iters % ranks.world_size:  # every rank must run as many forwards: each gathers the weights
        raise AbortRun(f"train.fsdp=true needs train.eval_iters ({train.eval_iters}) to be a multiple of the "
                       f"number of processes ({ranks.world_size})",
                       hint=f"e.g. train.eval_iters={-(-train.eval_iters // ranks.world_size) * ranks.world_size}")


def apply_fsdp(model: GPT, device: torch.device, precision: str) -> GPT:
    """FSDP2: fully_shard each Block, then the root (embeddings, final LayerNorm, tied head) over all ranks.

    Each rank keeps 1/world_size of every weight, gradient and AdamW moment; a block's weights are gathered
    just before it runs and freed after. On CUDA with bf16 the gathered weights are bf16 while the shards,
    the optimizer and the gradient reduction stay fp32 (MixedPrecisionPolicy).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if device.type == "cuda" and precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def gradient_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """DDP all-reduces only on the ``last`` micro-step (no_sync before); FSDP reduce-scatters every micro-step,
    which keeps only sharded gradients between them."""
    if not last and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm_(parameters: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_, also for sharded (DTensor) gradients: the norm over all shards, as a plain
    tensor, by which every shard is scaled alike."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's full state dict: gathered to CPU from every rank when sharded (every rank must call this;
    only rank 0 receives the tensors), the usual one otherwise."""
    if not is_sharded(model):
        return model.state_dict()
    sd = _dcp_state_dict()
    return sd.get_model_state_dict(model, options=sd.StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state dict (keyed by parameter name when sharded); every rank calls it."""
    if not is_sharded(model):
        return optimizer.state_dict()
    if not optimizer.state:  # before the first step: get_optimizer_state_dict would take a step of zeros to make one
        return {"state": {}, "param_groups": named_param_groups(model, optimizer)}
    sd = _dcp_state_dict()
    return sd.get_optimizer_state_dict(model, optimizer,
                                       options=sd.StateDictOptions(full_state_dict=True, cpu_offload=True))


def named_param_groups(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's hyperparameters per group, its parameters given by name."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [{**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
            for group in optimizer.param_groups]


def sharded_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This rank's part of every model and optimizer tensor, flat-keyed as gpt.weights.sharded stores them
    (``model.<name>``, ``optim.state.<name>.<key>``); no optimizer entries before its first step."""
    from gpt.weights.sharded import MODEL_PREFIX, OPTIM_PREFIX

    sd = _dcp_state_dict()
    tensors = {MODEL_PREFIX + name: t for name, t in sd.get_model_state_dict(model).items()}
    if optimizer.state:
        for name, state in sd.get_optimizer_state_dict(model, optimizer)["state"].items():
            tensors.update({f"{OPTIM_PREFIX}{name}.{key}": t for key, t in state.items()})
    return tensors


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str,
                 param_groups: list[dict[str, Any]]) -> None:
    """Every rank reads its part of a sharded checkpoint into the model and the optimizer (any world size, with
    or without FSDP: DCP reshards). An optimizer saved before its first step keeps its fresh state."""
    from gpt.weights.sharded import MODEL_PREFIX, OPTIM_PREFIX, dcp_load, tensor_shapes, unflatten

    sd = _dcp_state_dict()
    with_optimizer = bool(tensor_shapes(Path(folder), OPTIM_PREFIX))
    if with_optimizer and not optimizer.state:
        sd.get_optimizer_state_dict(model, optimizer)  # creates the state tensors (a zero step) that DCP fills in
    tensors = sharded_tensors(model, optimizer)
    if not with_optimizer:
        tensors = {k: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    dcp_load(tensors, Path(folder))
    model_state, optimizer_state = unflatten(tensors)
    sd.set_model_state_dict(model, model_state)
    if with_optimizer:
        sd.set_optimizer_state_dict(model, optimizer, {"state": optimizer_state, "param_groups": param_groups})


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict into the model, each rank keeping its shard when sharded."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    sd = _dcp_state_dict()
    sd.set_model_state_dict(model, state, options=sd.StateDictOptions(full_state_dict=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an optimizer state written with or without FSDP (keyed by position or by parameter name)."""
    if not state["state"]:  # saved before the first step: nothing but hyperparameters, which the run sets
        return
    by_name = any(isinstance(key, str) for key in state["state"])
    if not is_sharded(model) and not by_name:
        optimizer.load_state_dict(state)
        return
    if not by_name:
        state = _keyed_by_name(model, optimizer, state)
    sd = _dcp_state_dict()
    sd.set_optimizer_state_dict(model, optimizer, state, options=sd.StateDictOptions(full_state_dict=True))


def _keyed_by_name(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """A positional optimizer state dict re-keyed by parameter name (position j of group i is the same
    parameter in the saved and in this optimizer, which make_optimizer builds in one order)."""
    names = {id(p): name for name, p in model.named_parameters()}
    by_id: dict[int, str] = {}
    groups = []
    for saved, current in zip(state["param_groups"], optimizer.param_groups, strict=True):
        ids = [names[id(p)] for p in current["params"]]
        by_id.update(zip(saved["params"], ids, strict=True))
        groups.append({**saved, "params": ids})
    return {"state": {by_id[k]: v for k, v in state["state"].items()}, "param_groups": groups}
