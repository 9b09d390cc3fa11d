"""The Hydra glue: the typed schemas behind configs/ registered with Hydra, and the one step that turns a
composed config into its dataclass. Hydra checks every override against the schema (names and types);
the dataclasses check the values when they are built. Nothing else under gpt/ imports omegaconf.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from gpt.bench.attention import BenchAttentionConfig
from gpt.bench.train import BenchTrainConfig
from gpt.config import MISSING, AttentionConfig, GPTConfig, ModelConfig
from gpt.data.config import DataConfig
from gpt.device import DeviceConfig
from gpt.errors import ConfigError
from gpt.memory import MemoryConfig
from gpt.train.config import RunConfig


def refuse_unknown_keys(node: DictConfig, where: str = "") -> None:
    """Hydra's ``+key=value`` adds keys that no schema declares: refuse them, listing the valid ones."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        known = [f.name for f in dataclasses.fields(schema)]
        unknown = [key for key in node.keys() if key not in known]
        if unknown:
            of = f" of {where[:-1]}" if where else ""
            raise ConfigError(f"unknown config key {where}{unknown[0]}; valid keys{of}: {', '.join(known)}",
                              hint="check the spelling; keys added with + must exist in the schema")
    for key, child in node.items_ex(resolve=False):
        if isinstance(child, DictConfig):
            refuse_unknown_keys(child, f"{where}{key}.")


def typed(cfg: DictConfig) -> Any:
    """The composed config as its dataclass; every dataclass validates itself as it is built (ConfigError)."""
    refuse_unknown_keys(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key or str(err)
        raise ConfigError(f"{key} must be given (it has no default)",
                          hint=f"add {key}=<value> to the command") from None


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
    stop: list[str] = field(default_factory=list)  # stop before any of these strings
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
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)  # the kernel of the random-weight model
    vocab_size: int = 256  # for random weights
    device: DeviceConfig = field(default_factory=DeviceConfig)
    new_tokens: int = 500
    prompt_lens: list[int] = field(default_factory=lambda: [1, 64])
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
class PrepareApp:
    data: DataConfig = field(default_factory=DataConfig)
    force: bool = False


def model_config(model: Any, vocab_size: int) -> GPTConfig:
    """The validated GPTConfig of a model node (a ModelConfig or its DictConfig); vocab_size defaults to the data's."""
    if not isinstance(model, ModelConfig):
        model = OmegaConf.to_object(model)
    return model.build(vocab_size)


def register() -> None:
    """Register the schemas with Hydra's ConfigStore (the primary configs name them in their defaults)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=RunConfig)
    cs.store(name="generate_schema", node=GenerateApp)
    cs.store(name="prepare_schema", node=PrepareApp)
    cs.store(name="export_schema", node=ExportApp)
    cs.store(name="visualize_schema", node=VisualizeApp)
    cs.store(name="bench_decode_schema", node=BenchDecodeApp)
    cs.store(name="bench_attention_schema", node=BenchAttentionConfig)
    cs.store(name="bench_train_schema", node=BenchTrainConfig)
    cs.store(name="memory_schema", node=MemoryConfig)
