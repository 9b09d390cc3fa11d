"""The memory planner: bytes per GPU of a training run (weights, gradients, AdamW, activations) before running it.

python -m gpt.memory model=gpt2-xl train.batch_size=4 [train.fsdp=true] [train.activation_checkpointing=true]
    [world_size=8] [gpu_memory=80GB] [precision=bf16]

The activation figures count what autograd keeps between forward and backward for this project's GPT
(measured per tensor with saved_tensors_hooks and checked against the live-tensor peak of small
models in tests/memory/test_memory.py). Per block and token, with C = n_embd and a = 2 bytes (bf16/fp16) or
4 (fp32): the two LayerNorm inputs of the fp32 residual stream (2 x 4C), fourteen C-sized tensors in
the compute precision (LayerNorm outputs 2C, q/k/v 3C, attention output C, MLP 8C: 14aC), the
attention's log-sum-exp and the LayerNorm statistics. Kernels that build the T x T scores (all but
sdpa and flex) keep two of them per head; dropout keeps a one-byte mask per dropped element.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from gpt.device import PRECISIONS
from gpt.errors import ConfigError, check_positive
from gpt.model import design as designs
from gpt.model.config import GPTConfig, ModelConfig, ScriptConfig
from gpt.model.kv_cache import LayerKV

MEMORY_EFFICIENT_KERNELS = ("sdpa", "flex")  # never hold the T x T scores (flash / fused kernels)
RESERVED = 2**30  # CUDA context, cuBLAS workspaces and allocator slack, kept out of every GPU's budget
GB_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
            "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass
class Plan:
    """Bytes per GPU at the peak of one training step, by what holds them."""

    params: int  # fp32 master weights (this rank's shard with FSDP)
    grads: int  # fp32 gradients
    optimizer: int  # AdamW's two fp32 moments
    weight_copies: int  # bf16/fp16 casts of the weights (autocast's, or FSDP's gathered blocks)
    activations: int  # what the forward keeps for the backward
    backward_transient: int  # gradients of the logits at the start of the backward
    step_transient: int  # temporaries of the optimizer step (none for fused AdamW)

    @property
    def backward_peak(self) -> int:
        """The start of the backward: activations and logit gradients, the optimizer state, no gradients yet."""
        return self.params + self.optimizer + self.weight_copies + self.activations + self.backward_transient

    @property
    def step_peak(self) -> int:
        """The optimizer step: every gradient present, activations freed."""
        return self.params + self.grads + self.optimizer + self.step_transient

    @property
    def peak(self) -> int:
        return max(self.backward_peak, self.step_peak)


def count_params(config: GPTConfig) -> tuple[int, int]:
    """(all parameters, parameters of one Block), the tied token embedding counted once: the model itself, built
    on the meta device (no memory), so every design's extra parameters (QK-norm gains, sinks, lambdas) count."""
    return _count_params(json.dumps(config.to_dict(), sort_keys=True))


class _WithoutRandomInit(TorchFunctionMode):
    """Skips normal initialisation, meaningless on meta tensors: the first normal_ of a meta tensor in a process
    takes 0.8 s (torch sets up its meta implementation), which python -m gpt.memory paid on every call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func in (torch.nn.init.normal_, torch.Tensor.normal_):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=16)
def _count_params(fields: str) -> tuple[int, int]:
    """count_params for a config given as JSON (hashable: the planner asks again for every batch it tries);
    a one-layer model is built, as every Block has the same parameters."""
    from gpt.model import GPT

    config = GPTConfig(**json.loads(fields))
    with torch.device("meta"), _WithoutRandomInit():
        if config.layers is not None:  # a layout's kinds differ: the whole model, its blocks' mean
            model = GPT(config)
            blocks = sum(p.numel() for p in model.transformer.h.parameters())
            return sum(p.numel() for p in model.parameters()), math.ceil(blocks / config.n_layer)
        model = GPT(replace(config, n_layer=1))
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    return sum(p.numel() for p in model.parameters()) + (config.n_layer - 1) * block, block


def block_activations(config: GPTConfig, batch: int, seq: int, act: int) -> int:
    """Bytes one Block keeps for its backward on a (batch, seq) micro-batch, computing in ``act``-byte floats:
    GPT-2's attention through the configured kernel, and what each design keeps beyond it (Design.activations,
    counted with saved-tensor hooks on CPU; tests/designs/test_designs.py checks the totals)."""
    n, c, h = batch * seq, config.n_embd, config.n_head
    kv = config.n_kv_head * config.head_dim
    fused = config.attention in MEMORY_EFFICIENT_KERNELS
    saved = n * 2 * 4 * c  # LayerNorm inputs: the fp32 residual stream
    saved += n * act * (2 * c + (c + 2 * kv) + c + 8 * c)  # ln outputs, q/k/v, attention output, MLP
    saved += n * 4 * (h + 4)  # log-sum-exp per head, mean and 1/std of both LayerNorms
    if kv != c:
        saved += n * act * 2 * (c - kv)  # k and v repeated up to n_head heads
    if not fused:
        saved += 2 * batch * h * seq * seq * act  # scores and probabilities
    if config.norm == "rmsnorm":
        saved += n * 2 * 4 * c  # nn.RMSNorm (not fused on a CPU) keeps one more fp32 C-wide tensor per norm (measured)
    if config.dropout > 0:
        saved += 2 * n * c  # the residual dropouts' masks (one byte per element)
        if not fused:
            saved += batch * h * seq * seq
    return saved + sum(d.activations(config, batch, seq, act, fused) for d in designs.active(config))


def kv_bytes_per_token(config: GPTConfig, number_bytes: int = 2) -> float:
    """Bytes the KV cache keeps per cached token, every layer: keys and values, or a design's own kind."""
    if config.layers is not None:  # the kinds keep different numbers of tokens: per token of a full context
        return kv_bytes_at_context(config, number_bytes)
    return config.n_layer * (designs.cache_kind(config) or LayerKV).bytes_per_token(config, number_bytes)


def kv_bytes_at_context(config: GPTConfig, number_bytes: int = 2) -> float:
    """Bytes the KV cache holds per token of a full context (block_size tokens), every layer: a layer of a global
    kind keeps every token, a window's ring only its last ``window`` (plus sink tokens), a running state its fixed
    bytes. A meta-device cache says what each layer keeps; tests/memory measures a filled one against this."""
    from gpt.model.kv_cache import KVCache

    layers = zip(KVCache(config, 1, "meta").layers, map(config.layer, range(config.n_layer)))
    return sum(kept.bytes_per_token(kind, number_bytes) * kept.tokens for kept, kind in layers) / config.block_size


def activations(config: GPTConfig, batch: int, seq: int, act: int, checkpointing: bool) -> int:
    """Bytes kept from forward to backward by the whole model; with checkpointing each block keeps its input
    and one block at a time is recomputed in the backward."""
    n, c, v = batch * seq, config.n_embd, config.vocab_size
    head = n * (4 * c + act * c + 4 * 2) + n * v * (act + 4)  # ln_f in/out (+stats), logits, fp32 log-softmax
    if config.norm == "rmsnorm":
        head += n * 4 * c  # as a block's norms (block_activations)
    kinds = {name: block_activations(kind, batch, seq, act) for name, kind in config.kinds().items()}
    if checkpointing:
        return head + config.n_layer * n * 4 * c + max(kinds.values())
    return head + sum(kinds[config.kind_of(i)] for i in range(config.n_layer))


def plan(config: GPTConfig, batch_size: int, seq_len: int | None = None, precision: str = "bf16",
         world_size: int = 1, fsdp: bool = False, checkpointing: bool = False, fused_adamw: bool = True) -> Plan:
    """The peak bytes per GPU of training ``config`` on micro-batches of batch_size x seq_len tokens."""
    n_params, per_block = count_params(config)
    seq = seq_len or config.block_size
    act = 4 if precision == "fp32" else 2
    shards = world_size if fsdp else 1
    outside = n_params - config.n_layer * per_block  # embeddings, final LayerNorm (the head is tied)
    if fsdp:  # gathered blocks: the one computing and the one prefetched, plus its unsharded gradient
        copies = 2 * per_block * act + outside * act + 4 * per_block
    elif precision == "fp32":
        copies = 0
    else:  # autocast's casts, kept for the backward; a checkpointed block recasts its own when recomputed
        copies = 2 * (outside + per_block if checkpointing else n_params)
    return Plan(
        params=4 * math.ceil(n_params / shards),
        grads=4 * math.ceil(n_params / shards),
        optimizer=8 * math.ceil(n_params / shards),
        weight_copies=copies,
        activations=activations(config, batch_size, seq, act, checkpointing),
        backward_transient=batch_size * seq * config.vocab_size * (4 + act),
        step_transient=0 if fused_adamw else math.ceil(n_params / shards),
    )


def largest_batch(fits: int, plan_for: callable, limit: int = 1 << 16) -> int:
    """The largest micro-batch whose plan peaks within ``fits`` bytes (0 when not even one sequence does)."""
    if plan_for(1).peak > fits:
        return 0
    low, high = 1, 2
    while high <= limit and plan_for(high).peak <= fits:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if plan_for(mid).peak <= fits else (low, mid)
    return low


def parse_bytes(text: str) -> int:
    """'80GB', '24GiB', '40 GB', '1e9' -> bytes. GB are 10**9 bytes (as GPUs are sold), GiB 2**30."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else ""
    if not match or unit not in GB_UNITS:
        raise ConfigError(f"gpu_memory={text!r} is not an amount of memory", hint="write e.g. gpu_memory=80GB")
    try:
        amount = float(match.group(1)) * GB_UNITS[unit]
    except ValueError:
        raise ConfigError(f"gpu_memory={text!r} is not an amount of memory",
                          hint="write e.g. gpu_memory=80GB") from None
    if not math.isfinite(amount) or amount >= 2**63:  # 1e400GB is no amount either
        raise ConfigError(f"gpu_memory={text!r} is beyond any amount of memory", hint="write e.g. gpu_memory=80GB")
    return int(amount)


@dataclass
class PlannedTraining:
    """The ``train.*`` settings a plan depends on (the training command's others change no byte of it)."""

    batch_size: int = 32  # sequences per micro-step
    activation_checkpointing: bool = False  # recompute each block's activations in the backward
    fsdp: bool = False  # shard weights, gradients and AdamW state over world_size GPUs

    def __post_init__(self) -> None:
        check_positive(self, "batch_size", prefix="train.")


@dataclass
class MemoryConfig(ScriptConfig):
    """python -m gpt.memory (configs/memory.yaml): the run to plan, in the training configs' own groups."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: PlannedTraining = field(default_factory=PlannedTraining)
    precision: str = "bf16"  # fp32 | bf16 | fp16 (auto means bf16: the planner plans for GPUs)
    world_size: int = 1  # processes (GPUs) of the run: FSDP shards the weights and AdamW state over them
    gpu_memory: Optional[str] = None  # e.g. 80GB or 24GiB: also print the largest micro-batch that fits
    vocab_size: int = 50257  # unless model.vocab_size is set (GPT-2's tokenizer)
    seq_len: Optional[int] = None  # default: model.block_size

    def __post_init__(self) -> None:
        check_positive(self, "world_size", "vocab_size")
        check_positive(self, "seq_len", optional=True)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        if self.seq_len is not None and self.seq_len > self.model.block_size:
            raise ConfigError(f"seq_len must be in 1..block_size ({self.model.block_size}), got {self.seq_len}")
        if self.gpu_memory is not None:
            parse_bytes(self.gpu_memory)
        if self.train.fsdp and self.world_size == 1:
            raise ConfigError("train.fsdp=true shards over the GPUs of a run, but world_size=1",
                              hint="add world_size=<number of GPUs>, e.g. world_size=8")


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def kv_cache_line(config: GPTConfig, number_bytes: int) -> str:
    """What sampling from the model keeps in its KV cache, per token and for a full context of one sequence."""
    from gpt.model.kv_cache import KVCache

    if config.layers is not None:
        per_token = kv_bytes_at_context(config, number_bytes)
        return (f"KV cache when sampling: {per_token:,.0f} bytes per token of a {config.block_size}-token context "
                f"(layers {designs.spell(config.layers)}), {per_token * config.block_size / 2**20:,.2f} MiB per "
                "sequence")
    tokens = KVCache(config, 1, "meta").layers[0].tokens  # the slots it keeps (a window's ring, sink tokens)
    per_token = kv_bytes_per_token(config, number_bytes)
    return (f"KV cache when sampling: {per_token:,.0f} bytes per token, {per_token * tokens / 2**20:,.2f} MiB per "
            f"sequence of {tokens} tokens")


def describe(cfg: MemoryConfig) -> str:
    """The plan of ``cfg`` as the lines python -m gpt.memory prints."""
    config = cfg.model.build(cfg.vocab_size)
    precision = "bf16" if cfg.precision == "auto" else cfg.precision
    t = cfg.train
    options = dict(seq_len=cfg.seq_len, precision=precision, world_size=cfg.world_size, fsdp=t.fsdp,
                   checkpointing=t.activation_checkpointing)
    p = plan(config, t.batch_size, **options)
    without, with_ = (plan(config, t.batch_size, **{**options, "checkpointing": ac}).activations for ac in (0, 1))
    n_params, _ = count_params(config)
    mode = f"FSDP over {cfg.world_size} GPUs" if t.fsdp else f"DDP on {cfg.world_size} GPU(s) (full copy on each)"
    lines = [
        f"{n_params / 1e6:,.1f}M parameters ({config.n_layer} layers, {config.n_embd} wide, vocab "
        f"{config.vocab_size}), micro-batch {t.batch_size} x {cfg.seq_len or config.block_size} tokens, {precision}, "
        f"{mode}, activation checkpointing {'on' if t.activation_checkpointing else 'off'}",
        "bytes per GPU:",
        f"  parameters (fp32)        {gib(p.params)}",
        f"  gradients (fp32)         {gib(p.grads)}",
        f"  AdamW state (fp32 x 2)   {gib(p.optimizer)}",
        f"  weight copies ({'FSDP' if t.fsdp else precision}){' ' * (9 - len('FSDP' if t.fsdp else precision))}"
        f"{gib(p.weight_copies)}",
        f"  activations              {gib(p.activations)}  (without checkpointing: {gib(without)}, "
        f"with: {gib(with_)})",
        f"  logit gradients          {gib(p.backward_transient)}",
        f"  peak                     {gib(p.peak)}  (start of backward {gib(p.backward_peak)}, "
        f"optimizer step {gib(p.step_peak)})",
        kv_cache_line(config, 4 if precision == "fp32" else 2),
    ]
    if cfg.gpu_memory is not None:
        budget = parse_bytes(cfg.gpu_memory)
        best = largest_batch(budget - RESERVED, lambda b: plan(config, b, **options))
        lines.append(f"largest micro-batch on a {cfg.gpu_memory} GPU (1 GiB kept for the CUDA context): "
                     + (f"train.batch_size={best}" if best else "none: not even 1 sequence fits"))
    return "\n".join(lines)
