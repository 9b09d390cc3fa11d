"""The typed configs of a training run: TrainConfig (optimisation and bookkeeping) and RunConfig (everything).

scripts/train.py turns the composed Hydra config into a RunConfig once; each dataclass validates itself
on construction, so nothing below the script sees an unchecked value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from gpt.data.config import DataConfig
from gpt.device import PRECISIONS, DeviceConfig
from gpt.errors import ConfigError
from gpt.files import output_path
from gpt.model.config import MISSING, ModelConfig, ScriptConfig

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd", "constant")


@dataclass
class TrainConfig:
    """Defaults are the longer run's of README's "The default run" (model=small on stdlib_char; `make train QUICK=`);
    `make train` sets its own shorter horizon (the Makefile's QUICK)."""

    max_iters: int = 1600  # optimizer steps
    batch_size: int = 32  # sequences per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest: gpt.train.muon)
    learning_rate: float = 2e-3  # AdamW's (all parameters, or those Muon does not take)
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay) | constant, each after the linear warmup
    min_lr: Optional[float] = None  # where the cosine or WSD decay ends; default learning_rate / 10
    warmup_iters: int = 100
    lr_decay_iters: Optional[int] = None  # cosine: the step its decay ends; default max_iters
    decay_frac: float = 0.2  # wsd: the fraction of max_iters at the end whose learning rate decays (linearly)
    weight_decay: float = 0.1  # AdamW's, on 2-D parameters
    beta1: float = 0.9
    beta2: float = 0.95
    muon_lr: float = 0.02  # optimizer=muon: Muon's learning rate (the schedule scales it like learning_rate)
    muon_momentum: float = 0.95  # Muon's Nesterov momentum
    muon_weight_decay: float = 0.0  # Muon's decoupled weight decay
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 400
    eval_iters: int = 40
    log_interval: int = 10
    sample_tokens: int = 200  # length of the samples (TensorBoard at each eval, log at the end; 0: none)
    pictures: bool = True  # one layer's attention maps in TensorBoard at each eval (false: none; ~0.3 s each)
    heads: bool = False  # at each eval: the best head's induction score and the in-context loss in TensorBoard
    compile: bool = False  # wrap the model in torch.compile (eager, with one message, where unavailable)
    skip_nonfinite: int = 0  # steps with a NaN/Inf loss or gradient norm that may be skipped before stopping
    activation_checkpointing: bool = False  # recompute each block's activations in backward (less memory, ~1/3 slower)
    fsdp: bool = False  # under torchrun: shard weights, gradients and AdamW state over the processes (FSDP2)
    max_seconds: Optional[float] = None  # wall-clock budget of this launch: then evaluate, save and finish early
    keep_checkpoints: bool = False  # keep every evaluation's checkpoint in out_dir/checkpoints/ (for decay_from)
    passkey: float = 0.0  # fraction of each micro-batch's rows that are passkey sequences (gpt/train/passkey_mix.py)
    passkey_weight: Optional[float] = None  # their loss's share of the step's (null: each digit counts as one token)

    def __post_init__(self) -> None:
        for name in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval"):
            self._check(name, lambda v: v > 0, "positive")
        for name in ("warmup_iters", "sample_tokens", "skip_nonfinite"):
            self._check(name, lambda v: v >= 0, "non-negative")
        self._check("optimizer", lambda v: v in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}")
        self._check("schedule", lambda v: v in SCHEDULES, f"one of {', '.join(SCHEDULES)}")
        for name in ("learning_rate", "muon_lr"):
            self._check(name, lambda v: math.isfinite(v) and v > 0, "positive")
        self._check("decay_frac", lambda v: 0 < v <= 1, "in (0, 1]")
        self._check("passkey", lambda v: not isinstance(v, bool) and 0 <= v < 1, "in [0, 1)")
        self._check("passkey_weight", lambda v: v is None or (not isinstance(v, bool) and 0 < v < 1),
                    "in (0, 1) or null")
        if self.passkey_weight is not None and not self.passkey:
            raise ConfigError(f"train.passkey_weight={self.passkey_weight} is set but train.passkey is 0",
                              hint="set train.passkey (the fraction of passkey rows), or drop train.passkey_weight")
        self._check("muon_momentum", lambda v: 0 <= v < 1, "in [0, 1)")
        self._check("min_lr", lambda v: v is None or 0 <= v <= self.learning_rate, "in [0, train.learning_rate]")
        self._check("lr_decay_iters", lambda v: v is None or v > 0, "positive or null")
        self._check("max_seconds", lambda v: v is None or (math.isfinite(v) and v > 0), "positive or null")
        for name in ("weight_decay", "muon_weight_decay", "grad_clip"):
            self._check(name, lambda v: math.isfinite(v) and v >= 0, "non-negative")
        for name in ("beta1", "beta2"):
            self._check(name, lambda v: 0 <= v < 1, "in [0, 1)")
        for name in ("activation_checkpointing", "fsdp", "keep_checkpoints"):
            self._check(name, lambda v: isinstance(v, bool), "true or false")

    def _check(self, name: str, ok: Callable[[Any], bool], expected: str) -> None:
        """Refuse train.<name> unless ``ok(value)``; comparisons with NaN are False, so NaN is refused too."""
        value = getattr(self, name)
        if not ok(value):
            raise ConfigError(f"train.{name} must be {expected}, got {value!r}")


@dataclass
class ChatConfig:
    """chat.*: supervised fine-tuning on conversations (loss on the assistant's replies only), in full or with LoRA
    adapters. Unset chat.data: pretraining on data.*."""

    data: Optional[str] = None  # conversations: a .jsonl file, a save_to_disk folder or a hub dataset name
    format: str = "auto"  # auto (by each record's keys) | messages | sharegpt | alpaca
    skip_bad: bool = False  # skip records that are not conversations (counted) instead of stopping at the first
    val_data: Optional[str] = None  # held-out conversations (default: val_fraction of chat.data)
    val_fraction: float = 0.1
    lora_rank: int = 0  # 0: train every weight; r > 0: LoRA adapters of rank r on attention and MLP projections
    lora_alpha: float = 16.0  # LoRA's scale is lora_alpha / lora_rank
    lora_dropout: float = 0.0

    def __post_init__(self) -> None:
        from gpt.data.conversations import FORMATS

        if self.format not in FORMATS:
            raise ConfigError(f"unknown chat.format {self.format!r}", hint=f"use one of: {', '.join(FORMATS)}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"chat.val_fraction must be in (0, 1), got {self.val_fraction!r}")
        if not 0 <= self.lora_rank <= 1024 or not 0 <= self.lora_dropout < 1 or not self.lora_alpha > 0:
            raise ConfigError(f"chat.lora_rank must be in [0, 1024], chat.lora_dropout in [0, 1) and chat.lora_alpha "
                              f"positive; got {self.lora_rank!r}, {self.lora_dropout!r}, {self.lora_alpha!r}")
        for name in ("data", "val_data"):
            if getattr(self, name) is not None and not getattr(self, name).strip():
                raise ConfigError(f"chat.{name} is empty", hint=f"give chat.{name}=<a .jsonl file or dataset>")
        if self.lora_rank and self.data is None:
            raise ConfigError("chat.lora_rank is set but chat.data is not", hint="give chat.data=<conversations>")


@dataclass
class RunConfig(ScriptConfig):
    """A whole training run, as scripts/train.py composes it (configs/train.yaml)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    seed: int = 1337
    out_dir: str = MISSING
    resume: bool = False  # continue the run in out_dir from its ckpt.pt
    init_from: Optional[str] = None  # start from weights: gpt2* (OpenAI's), a run directory, .pt file or export
    init_path: Optional[str] = None  # with init_from=gpt2*: a local Hugging Face folder or .safetensors file
    decay_from: Optional[str] = None  # schedule=wsd: decay from this checkpoint of a stable phase (gpt.train.decay)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        if not 0 <= self.seed < 2**31:  # numpy's seed takes 32 bits, and each rank adds its rank
            raise ConfigError(f"seed must be in [0, 2**31), got {self.seed}")
        if self.init_path is not None and self.init_from is None:
            raise ConfigError("init_path is given but init_from is not", hint="add init_from=gpt2 (or another size)")
        for name in ("init_from", "init_path"):  # an empty value must not mean "from scratch" or "download"
            if getattr(self, name) is not None and not getattr(self, name).strip():
                raise ConfigError(f"{name} is empty", hint=f"give {name}=<a path or name>, or leave it out (null)")
        output_path(self.out_dir, "out_dir", folder=True)  # never the current folder, never below a file
        if self.train.passkey and self.chat.data is not None:
            raise ConfigError("train.passkey mixes passkey sequences into the corpus's windows; chat.data has none",
                              hint="train.passkey=0 with chat.data")
        if self.decay_from is not None and self.init_from is not None:
            raise ConfigError("decay_from and init_from cannot be combined: decay_from continues a run's whole "
                              "training state", hint="drop init_from")
