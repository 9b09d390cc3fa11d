"""The typed schemas behind configs/: Hydra checks every override against these dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from gpt.config import GPTConfig
from gpt.data.config import DataConfig
from gpt.device import DeviceConfig
from gpt.train.config import TrainConfig


@dataclass
class ModelSchema(GPTConfig):
    """GPTConfig as a config group: vocab_size comes from the data unless set, the kernel from attention=."""

    vocab_size: Optional[int] = None
    attention: str = "${attention.name}"
    attention_backend: Optional[str] = "${attention.backend}"

    def __post_init__(self) -> None:  # validated when turned into a GPTConfig, once values are final
        pass


@dataclass
class AttentionConfig:
    name: str = "sdpa"
    backend: Optional[str] = None  # sdpa only: flash | efficient | math | cudnn (None: torch chooses)


@dataclass
class TrainApp:
    model: ModelSchema = field(default_factory=ModelSchema)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    seed: int = 1337
    out_dir: str = MISSING
    resume: bool = False  # continue the run in out_dir from its ckpt.pt
    init_from: Optional[str] = None  # start from weights: gpt2* (OpenAI's), a run directory, .pt file or export
    init_path: Optional[str] = None  # with init_from=gpt2*: a local Hugging Face folder or .safetensors file


@dataclass
class GenerateApp:
    ckpt: str = MISSING  # a run directory (best.pt, else ckpt.pt), a .pt file, an exported folder, or gpt2*
    init_path: Optional[str] = None  # with ckpt=gpt2*: a local Hugging Face GPT-2 folder or .safetensors file
    prompt: str = ""  # empty: start from a newline (character models) or end-of-text (GPT-2 BPE)
    prompt_file: Optional[str] = None  # read the prompt from a file; - for standard input
    interactive: bool = False  # a prompt loop on standard input
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0: greedy
    top_k: Optional[int] = 200
    top_p: Optional[float] = None  # nucleus sampling, in (0, 1]
    stop: List[str] = field(default_factory=list)  # stop before any of these strings
    kv_cache: bool = True  # false: recompute the whole context at every step
    num_samples: int = 1
    seed: int = 1337
    device: DeviceConfig = field(default_factory=DeviceConfig)
    attention: Optional[AttentionConfig] = None  # None: the kernel the model was trained with
    precision: str = "auto"


@dataclass
class ExportApp:
    ckpt: str = MISSING  # a run directory or .pt file, an exported folder, a Hugging Face GPT-2 folder
    out: Optional[str] = None  # default: <run directory>/export
    format: str = "hf"  # hf: what transformers opens (GPT-2 layout) | native: this project's own (any model)
    overwrite: bool = False  # replace an export already in out
    push_to_hub: Optional[str] = None  # a Hub repository id (user/name): upload the export there (extra [hf])
    private: bool = False  # with push_to_hub: create the repository private

    def __post_init__(self) -> None:
        from gpt.pretrained import FORMATS

        if self.format not in FORMATS:
            from gpt.errors import ConfigError

            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}",
                              hint="format=native exports models GPT-2's layout cannot hold (rope, n_kv_head, window)")


@dataclass
class BenchDecodeApp:
    ckpt: Optional[str] = None  # a trained model; default: random weights of `model`
    model: ModelSchema = field(default_factory=ModelSchema)
    attention: AttentionConfig = field(default_factory=AttentionConfig)  # the kernel of the random-weight model
    vocab_size: int = 256  # for random weights
    device: DeviceConfig = field(default_factory=DeviceConfig)
    new_tokens: int = 500
    prompt_lens: List[int] = field(default_factory=lambda: [1, 64])
    batch_size: int = 1
    repeats: int = 3


@dataclass
class VisualizeApp:
    ckpt: str = MISSING  # a run directory, .pt file, exported folder, or gpt2* (with init_path)
    init_path: Optional[str] = None
    prompt: str = "def main():"  # \n and \t are unescaped, as in generate.py
    layer: Optional[int] = None  # with head: one enlarged map
    head: Optional[int] = None
    out: str = "attention.png"
    device: DeviceConfig = field(default_factory=DeviceConfig)


@dataclass
class BenchAttentionApp:
    kernels: Optional[List[str]] = None  # default: every registered kernel; sdpa:flash pins a backend
    seq_lens: Optional[List[int]] = None  # default: 64..4096 on CPU, 512..16384 on CUDA
    modes: List[str] = field(default_factory=lambda: ["fwd", "fwd+bwd"])
    batch_size: int = 1
    n_head: int = 8
    head_dim: int = 64
    dtype: str = "fp32"  # fp32 | bf16 | fp16
    device: DeviceConfig = field(default_factory=DeviceConfig)
    threads: Optional[int] = None  # CPU: torch's intra-op threads (default: one per core)
    compile: bool = False  # torch.compile each kernel (one fresh compile per case)
    warmup: int = 1  # untimed calls first (the first one also compiles)
    repeats: int = 5
    max_seconds: float = 30.0  # once a length's calls take longer, skip the kernel's longer lengths
    timeout_s: float = 300.0  # CPU: kill a case (compilation included) that runs longer
    out_dir: str = "runs/bench_attention"


@dataclass
class BenchTrainApp:
    model: ModelSchema = field(default_factory=ModelSchema)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    threads: Optional[int] = None  # CPU: torch's intra-op threads (default: one per core)
    vocab_size: int = 256  # unless model.vocab_size is set (e.g. 50304 for GPT-2's padded vocabulary)
    batch_size: int = 16
    seq_len: Optional[int] = None  # default: model.block_size
    compile: List[bool] = field(default_factory=lambda: [False, True])
    precisions: List[str] = field(default_factory=lambda: ["fp32", "bf16"])
    warmup: int = 2  # untimed steps first (the first one also compiles)
    steps: int = 10
    learning_rate: float = 3e-4
    peak_tflops: Optional[float] = None  # the device's peak, for MFU where it is not in gpt.bench.train.PEAK_FLOPS
    timeout_s: float = 300.0  # CPU: kill a variant (compilation included) that runs longer
    out_dir: str = "runs/bench_train"


@dataclass
class PrepareApp:
    data: DataConfig = field(default_factory=DataConfig)
    force: bool = False


def model_config(model: Any, vocab_size: int) -> GPTConfig:
    """The validated GPTConfig for a model node; vocab_size defaults to the tokenizer's."""
    values = {f.name: getattr(model, f.name) for f in fields(GPTConfig)}
    if values["vocab_size"] is None:
        values["vocab_size"] = vocab_size
    elif values["vocab_size"] < vocab_size:
        from gpt.errors import ConfigError

        raise ConfigError(f"model.vocab_size ({values['vocab_size']}) is smaller than the tokenizer's vocabulary ({vocab_size})")
    return GPTConfig(**values)


def register() -> None:
    """Register the schemas with Hydra's ConfigStore (the primary configs name them in their defaults)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainApp)
    cs.store(name="generate_schema", node=GenerateApp)
    cs.store(name="prepare_schema", node=PrepareApp)
    cs.store(name="export_schema", node=ExportApp)
    cs.store(name="visualize_schema", node=VisualizeApp)
    cs.store(name="bench_decode_schema", node=BenchDecodeApp)
    cs.store(name="bench_attention_schema", node=BenchAttentionApp)
    cs.store(name="bench_train_schema", node=BenchTrainApp)
