"""OpenAI's GPT-2 in: its sizes, its weights from a local Hugging Face folder or the Hub, its config checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from gpt.errors import UserError
from gpt.interop import hf
from gpt.interop.hf import GPT2_TOKENIZER
from gpt.model.config import GPTConfig
from gpt.model.state import check_model_state

GPT2_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
def _gpt2_files(name: str, init_path: str | None) -> tuple[Path, Path | None]:
    """The weights (a .safetensors file, or a folder holding one or a sharded index) and the optional config.json
    of GPT-2 weights, local or fetched from the Hub."""
    if init_path:
        path = Path(init_path).expanduser()
        if path.is_dir():
            if not ((path / hf.WEIGHTS).is_file() or (path / hf.INDEX).is_file()):
                raise UserError(f"no model.safetensors (or {hf.INDEX}) in {path}",
                                hint="point init_path at a Hugging Face GPT-2 folder or a .safetensors file")
            return path, path / "config.json" if (path / "config.json").is_file() else None
        if path.is_file():
            return path, path.parent / "config.json" if (path.parent / "config.json").is_file() else None
        raise UserError(f"init_path {str(path)!r} does not exist")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UserError(
            f"no local {name} weights given and huggingface_hub is not installed",
            hint=f"pass init_path=<folder with {name}'s model.safetensors>, or pip install -e '.[hf]' to download them",
        ) from None
    try:
        weights = hf_hub_download(repo_id=f"openai-community/{name}", filename="model.safetensors")
        config = hf_hub_download(repo_id=f"openai-community/{name}", filename="config.json")
    except Exception as err:  # network or hub errors of any kind
        raise UserError(
            f"could not download {name} from the Hugging Face Hub ({type(err).__name__})",
            hint=f"pass init_path=<folder with {name}'s model.safetensors and config.json>",
        ) from None
    return Path(weights), Path(config)


def read_gpt2(name: str, init_path: str | None = None,
              attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """OpenAI's GPT-2 weights (``name`` among GPT2_SIZES), their config and tokenizer; shapes not yet checked."""
    if name not in GPT2_SIZES:
        raise UserError(f"unknown GPT-2 model {name!r}; valid: {', '.join(GPT2_SIZES)}")
    weights, config_file = _gpt2_files(name, init_path)
    # The checkpoint's own config.json wins (a fine-tuned or smaller GPT-2); it is checked field by field.
    values: dict[str, Any] = {**GPT2_SIZES[name], "n_positions": 1024, "vocab_size": hf.GPT2_VOCAB}
    if config_file is not None:
        values = hf.read_json(config_file)
        hf.check_importable(values, config_file.parent)  # before reading the weights
    tensors = hf.read_tensors(weights) if weights.is_dir() else hf.load_safetensors(weights)
    config, state = hf.load_state(values, tensors, weights if weights.is_dir() else weights.parent, attention)
    return config, state, GPT2_TOKENIZER


def load_gpt2(name: str, init_path: str | None = None, attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor]]:
    """OpenAI's GPT-2 weights (``name`` among GPT2_SIZES) as a GPTConfig and a state dict for GPT."""
    config, state, _ = read_gpt2(name, init_path, attention)
    check_model_state(config, state, init_path or name)
    return config, state
