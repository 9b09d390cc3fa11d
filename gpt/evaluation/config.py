"""EvalConfig: what scripts/eval.py scores (configs/eval.yaml); it checks its own values when built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gpt.data.config import DataConfig
from gpt.device import PRECISIONS, DeviceConfig
from gpt.errors import ConfigError, check_positive
from gpt.files import output_path
from gpt.model.config import MISSING, ScriptConfig

TASKS = ("heldout", "hellaswag", "positions", "passkey")
SPLITS = ("val", "train")


@dataclass
class HellaSwagConfig:
    path: Optional[str] = None  # the validation JSONL; None: downloaded once into cache_dir
    cache_dir: str = "~/.cache/gpt-attention"


@dataclass
class LongConfig:
    """task=positions (loss by position) and task=passkey (retrieval at lengths): gpt/evaluation/positions.py."""

    length: Optional[int] = None  # positions: the window's length (None: the model's block_size); may pass it
    buckets: int = 8  # positions: equal slices of the positions, each reported with its mean loss
    windows: int = 64  # positions: windows spread evenly over the split
    lengths: list[int] = field(default_factory=list)  # passkey: the sequence lengths scored (empty: block_size)
    examples: int = 100  # passkey: sequences per length
    digits: int = 4  # passkey: digits of the key
    key: str = "\nPASSKEY = "  # passkey: the text the digits follow, at a random depth and again at the end
    seed: int = 0  # passkey: where the filler, the digits and their depth come from

    def __post_init__(self) -> None:
        check_positive(self, "buckets", "windows", "examples", "digits", prefix="long.")
        check_positive(self, "length", optional=True, prefix="long.")
        if not self.key:
            raise ConfigError("long.key is empty", hint="the text the passkey's digits follow, e.g. 'PASSKEY = '")
        if any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in self.lengths):
            raise ConfigError(f"long.lengths must be positive integers, got {list(self.lengths)}")


@dataclass
class EvalConfig(ScriptConfig):
    ckpt: str = MISSING  # a run folder, a checkpoint file, an export folder, or gpt2* (with init_path)
    init_path: Optional[str] = None  # with ckpt=gpt2*: a local Hugging Face GPT-2 folder or .safetensors file
    task: str = "heldout"  # heldout: a full pass | hellaswag: the benchmark | positions: loss by position | passkey
    data: Optional[DataConfig] = None  # data=<configs/data name>; None: the data the run was trained on
    data_dir: Optional[str] = None  # or a prepared data folder (one holding meta.json)
    split: str = "val"  # val | train
    stride: Optional[int] = None  # heldout: window step (None: block_size, no overlap)
    batch_size: int = 8  # windows (heldout) or choices (hellaswag) per forward pass
    limit: Optional[int] = None  # score only the first N windows (heldout) or examples (hellaswag)
    out: Optional[str] = None  # write the results to this JSON file as well
    precision: str = "auto"  # auto (bf16 on a CUDA GPU that has it, else fp32) | fp32 | bf16 | fp16
    device: DeviceConfig = field(default_factory=DeviceConfig)
    hellaswag: HellaSwagConfig = field(default_factory=HellaSwagConfig)
    long: LongConfig = field(default_factory=LongConfig)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}", hint=f"use one of: {', '.join(TASKS)}")
        if self.split not in SPLITS:
            raise ConfigError(f"unknown split {self.split!r}", hint=f"use one of: {', '.join(SPLITS)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        check_positive(self, "batch_size")
        check_positive(self, "stride", "limit", optional=True)
        if self.out is not None:
            output_path(self.out, "out", suffix=".json")
        if self.data is not None and self.data_dir is not None:
            raise ConfigError("data and data_dir are both given", hint="name the data one way: data=<name> or "
                              "data_dir=<prepared folder>")
        if self.init_path is not None and not self.ckpt.startswith("gpt2"):
            raise ConfigError("init_path is given but ckpt is not gpt2*", hint="use ckpt=gpt2 init_path=<folder>")
