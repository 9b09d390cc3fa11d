"""Building a run's parts before step 0: the data (prepared once per node), the model's config (from
model.* or from init_from's weights), the seeded model with its optimizer, and torch.compile."""

from __future__ import annotations

import random
import shutil
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gpt import memory
from gpt.data.chat import ChatData, add_token_rows
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.data.sampler import make_sampler
from gpt.device import DTYPES, autocast
from gpt.errors import UserError
from gpt.kernels.backends import pin_for
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.tokenizers import tokenizer as tok
from gpt.train import distributed, extend, parallelize
from gpt.train.config import RunConfig, TrainConfig
from gpt.train.distributed import AbortRun, Ranks
from gpt.train.optim import make_optimizer
from gpt.train.state import TrainState
from gpt.weights import load as pretrained
from gpt.weights import lora


def load_data(run: RunConfig, ranks: Ranks, log: Callable[[str], None]) -> TokenData | ChatData:
    """The run's token data, prepared by the first process of each node while the others wait; with chat.data,
    the conversations, in the tokenizer of init_from (else data.*'s) with ChatML's tokens."""
    if run.chat.data is not None:
        init = pretrained.load_weights(run.init_from, run.init_path) if run.init_from else None
        base = tok.from_meta(init[2]) if init else load_token_data(run, ranks, log).tokenizer
        data = ChatData(run.chat, base, run.seed, log)
        data.init_weights = init  # read once: build.model_config grows their vocabulary
        return data
    return load_token_data(run, ranks, log)


def load_token_data(run: RunConfig, ranks: Ranks, log: Callable[[str], None]) -> TokenData:
    if ranks.local_rank == 0:
        data_dir = prepare(run.data, log=log)
    distributed.barrier(ranks)
    if ranks.local_rank != 0:
        data_dir = prepare(run.data, log=lambda message: None)
    return TokenData(data_dir)


def model_config(run: RunConfig, data: TokenData, log: Callable[[str], None]) -> tuple[GPTConfig, dict | None]:
    """The model's GPTConfig and, with init_from, the weights to start from (their architecture wins)."""
    config = run.model.build(data.tokenizer.vocab_size)
    if not run.init_from:
        return config, None
    if isinstance(data, ChatData):
        init_config, init_state, init_tokenizer = data.init_weights
        data.init_weights = None
        init_config, init_state = add_token_rows(init_config, init_state, tok.from_meta(init_tokenizer),
                                                 data.tokenizer)
        log(f"initialised from {run.init_from} with ChatML's tokens ({data.tokenizer.vocab_size} tokens)")
        return init_config.with_runtime_of(config), init_state
    init_config, init_state, init_tokenizer = pretrained.load_weights(run.init_from, run.init_path)
    if init_tokenizer != data.tokenizer.to_meta():  # every rank sees the same: a stop all agree on
        raise AbortRun(
            f"init_from={run.init_from} uses a different tokenizer ({init_tokenizer.get('kind')}, "
            f"{init_tokenizer.get('vocab_size')} tokens) than the data {data.dir} "
            f"({data.tokenizer.kind}, {data.tokenizer.vocab_size} tokens)",
            hint="prepare the data with the model's tokenizer (e.g. data.tokenizer=gpt2 for GPT-2 weights)",
        )
    log(f"initialised from {run.init_from}: model.* sizes come from its weights")
    init_config = extend.extended(init_config, config, run.init_from, log)  # a longer block_size, a RoPE scaling
    return init_config.with_runtime_of(config), init_state


def available_memory(device: torch.device) -> int | None:
    """Bytes free on the device now (CUDA), or the memory the OS reports available (Linux CPU); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(config: GPTConfig, train: TrainConfig, precision: str, device: torch.device, ranks: Ranks) -> None:
    """Refuse, before allocating, a run whose planned peak (gpt.memory: weights, gradients, AdamW state,
    activations) exceeds the memory available on this device."""
    fsdp = train.fsdp and ranks.world_size > 1
    need = memory.plan(config, train.batch_size, precision=precision, world_size=ranks.world_size, fsdp=fsdp,
                       checkpointing=train.activation_checkpointing, fused_adamw=device.type == "cuda").peak
    free = available_memory(device)
    if free is not None and need > free:
        n_params, _ = memory.count_params(config)
        raise UserError(
            f"out of memory: {n_params / 1e6:,.1f}M parameters and batches of {train.batch_size} x "
            f"{config.block_size} tokens need about {need / 2**30:,.1f} GiB per process (weights, gradients, AdamW "
            f"state, activations), but {device} has {free / 2**30:,.1f} GiB available",
            hint="a smaller train.batch_size with a larger train.grad_accum, train.activation_checkpointing=true, "
                 "or train.fsdp=true under torchrun (python -m gpt.memory plans it)")


def initial_state(config: GPTConfig, run: RunConfig, data: TokenData, precision: str, device: torch.device,
                  ranks: Ranks, base_weights: dict | None = None) -> TrainState:
    """The seeded model, AdamW, gradient scaler and training sampler (data.sampling) of step 0.

    Initial weights are rank 0's (as DDP broadcasts them); dropout masks and other randomness differ by rank.
    With chat.lora_rank the model is ``base_weights`` with LoRA adapters, of which AdamW holds only what trains.
    """
    torch.manual_seed(run.seed)
    model = GPT(config).to(device)
    if run.chat.lora_rank:
        add_lora(model, run, data, base_weights)
    if run.train.activation_checkpointing:
        parallelize.apply_activation_checkpointing(model)
    if run.train.fsdp:  # before the optimizer: it must hold the shards
        parallelize.apply_fsdp(model, device, precision)
    if ranks.rank > 0:
        torch.manual_seed(run.seed + ranks.rank)
    random.seed(run.seed + ranks.rank)
    np.random.seed(run.seed + ranks.rank)
    optimizer = make_optimizer(model, run.train, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    sampler = make_sampler(run.data.sampling, data, run.train.batch_size, config.block_size, run.seed, ranks.rank,
                           ranks.world_size)
    return TrainState(model, optimizer, scaler, sampler)


def add_lora(model: GPT, run: RunConfig, data: ChatData, base_weights: dict | None) -> None:
    """The base weights loaded, then the adapters (and the chat tokens' rows, where they were added) made trainable."""
    if base_weights is None or run.train.fsdp:
        raise UserError("chat.lora_rank needs init_from=<the base model> and no FSDP",
                        hint="give init_from=<a run, checkpoint, export or gpt2*>, or train every weight")
    model.load_state_dict(base_weights)
    base = data.tokenizer.vocab_size - len(data.tokenizer.to_meta().get("added_tokens", []))
    new_rows = [i for i in data.tokenizer.special_tokens.values() if i >= base]
    lora.add_adapters(model, run.chat.lora_rank, run.chat.lora_alpha, run.chat.lora_dropout, new_rows)


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot run here, or None when it can."""
    if not hasattr(torch, "compile"):
        return "this PyTorch has no torch.compile"
    import torch._dynamo as dynamo

    if not dynamo.is_dynamo_supported():
        return f"TorchDynamo does not support Python {sys.version_info.major}.{sys.version_info.minor}"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed"
    elif device.type == "cpu" and not any(shutil.which(cc) for cc in ("cc", "gcc", "clang", "c++", "g++")):
        return "no C/C++ compiler found"
    return None


def maybe_compile(model: nn.Module, enabled: bool, device: torch.device, log: Callable[[str], None]) -> nn.Module:
    """torch.compile(model) when asked and possible; otherwise the model itself, saying why once."""
    if not enabled:
        return model
    reason = compile_unavailable(device)
    if reason:
        log(f"train.compile=true but torch.compile is unavailable ({reason}): running eager")
        return model
    log("compiling the model with torch.compile (the first steps are slow)")
    return torch.compile(model)


def data_parallel(model: nn.Module, device: torch.device, ranks: Ranks) -> nn.Module:
    """The model as the training step calls it: wrapped in DistributedDataParallel under torchrun (unless
    FSDP already shards it)."""
    if not ranks.enabled or parallelize.is_sharded(model):
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[ranks.local_rank] if device.type == "cuda" else None)


class Contexts:
    """Several reusable context managers entered in order as one (and left in reverse)."""

    def __init__(self, *contexts: AbstractContextManager) -> None:
        self.contexts = contexts

    def __enter__(self) -> Contexts:
        for context in self.contexts:
            context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for context in reversed(self.contexts):
            context.__exit__(*exc)


def forward_context(config: GPTConfig, device: torch.device, precision: str) -> Contexts:
    """What every full-sequence forward of the (maybe compiled) model runs under, in training, evaluation and the
    training benchmark: autocast for the precision, and attention=sdpa's backends (the pinned one, if any) set
    outside the compiled graph, where torch reads them when it traces (gpt.kernels.backends)."""
    dtype = DTYPES.get(precision, torch.float32)
    return Contexts(autocast(device, precision), pin_for(config.attention, config.attention_backend, device, dtype))
