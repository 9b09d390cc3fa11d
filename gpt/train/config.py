"""TrainConfig: the optimisation and bookkeeping knobs of a training run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gpt.errors import ConfigError


@dataclass
class TrainConfig:
    # Defaults are the default run's (model=small on stdlib_char, about 7 minutes on a 2-core CPU).
    max_iters: int = 1600
    batch_size: int = 32  # sequences per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    learning_rate: float = 2e-3
    min_lr: Optional[float] = None  # end of the cosine decay; default learning_rate / 10
    warmup_iters: int = 100
    lr_decay_iters: Optional[int] = None  # default max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 400
    eval_iters: int = 40
    log_interval: int = 10
    sample_tokens: int = 200  # length of the samples (TensorBoard at each eval, log at the end; 0: none)
    compile: bool = False  # wrap the model in torch.compile (eager, with one message, where unavailable)
    skip_nonfinite: int = 0  # steps with a NaN/Inf loss or gradient norm that may be skipped before stopping

    def validate(self) -> None:
        for name in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval"):
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(f"train.{name} must be positive, got {value}")
        if self.learning_rate <= 0:
            raise ConfigError(f"train.learning_rate must be positive, got {self.learning_rate}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.learning_rate:
            raise ConfigError(f"train.min_lr must be in [0, learning_rate], got {self.min_lr}")
        if self.skip_nonfinite < 0:
            raise ConfigError(f"train.skip_nonfinite must not be negative, got {self.skip_nonfinite}")
        if self.warmup_iters < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("train.warmup_iters, train.grad_clip and train.weight_decay must not be negative")
