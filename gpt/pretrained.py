"""Weights in and out: OpenAI's GPT-2 (Hugging Face layout) in, this project's safetensors export out and in,
and load_model, which turns any of them (or a training checkpoint) into a model ready for inference."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt import checkpoint
from gpt import tokenizer as tok
from gpt.config import GPTConfig
from gpt.errors import UserError
from gpt.model import GPT
from gpt.tokenizer import GPT2_ENCODING

GPT2_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
# OpenAI's GPT-2 stores these as Conv1D weights, (in, out): the transpose of nn.Linear's (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_TOKENIZER = {"kind": "gpt2", "vocab_size": 50257, "encoding": GPT2_ENCODING}
EXPORT_FORMAT = "gpt-attention/1"


def _safetensors():
    try:
        import safetensors.torch
    except ImportError:
        raise UserError("reading or writing .safetensors needs the safetensors package", hint="pip install safetensors") from None
    return safetensors.torch


def gpt2_state_dict(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face GPT-2 state dict in this project's names and layout (Conv1D transposed, head tied)."""
    state = {}
    for key, value in tensors.items():
        name = key.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")):  # causal-mask buffers, not weights
            continue
        if name == "lm_head.weight":
            continue  # tied to wte
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        state[f"transformer.{name}"] = value.contiguous()
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def _gpt2_files(name: str, init_path: str | None) -> tuple[Path, Path | None]:
    """The safetensors file and (optional) config.json for GPT-2 weights, local or fetched from the Hub."""
    if init_path:
        path = Path(init_path).expanduser()
        if path.is_dir():
            weights = path / "model.safetensors"
            if not weights.is_file():
                raise UserError(f"no model.safetensors in {path}", hint="point init_path at a Hugging Face GPT-2 folder or a .safetensors file")
            return weights, path / "config.json" if (path / "config.json").is_file() else None
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


def load_gpt2(name: str, init_path: str | None = None, attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor]]:
    """OpenAI's GPT-2 weights (``name`` among GPT2_SIZES) as a GPTConfig and a state dict for GPT."""
    if name not in GPT2_SIZES:
        raise UserError(f"unknown GPT-2 model {name!r}; valid: {', '.join(GPT2_SIZES)}")
    weights, config_file = _gpt2_files(name, init_path)
    sizes: dict[str, Any] = {**GPT2_SIZES[name], "block_size": 1024, "vocab_size": 50257}
    if config_file is not None:  # the checkpoint's own sizes win (a fine-tuned or smaller GPT-2)
        hf = json.loads(config_file.read_text())
        sizes = {"n_layer": hf["n_layer"], "n_head": hf["n_head"], "n_embd": hf["n_embd"],
                 "block_size": hf.get("n_positions", 1024), "vocab_size": hf.get("vocab_size", 50257)}
    config = GPTConfig(**sizes, bias=True, dropout=0.0, attention=attention)
    return config, gpt2_state_dict(_safetensors().load_file(str(weights)))


def export(state: dict[str, Tensor], config: GPTConfig, tokenizer: dict[str, Any], out_dir: str | Path) -> Path:
    """Write model.safetensors (this project's names; the tied head stored once) and config.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items() if k != "lm_head.weight"}
    _safetensors().save_file(tensors, str(out / "model.safetensors"), metadata={"format": EXPORT_FORMAT})
    meta = {"format": EXPORT_FORMAT, "model_config": config.to_dict(), "tokenizer": tokenizer}
    (out / "config.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
    return out


def is_export(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "model.safetensors").is_file() and (path / "config.json").is_file()


def load_export(path: str | Path) -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """A model written by export(): its GPTConfig, state dict (head re-tied) and tokenizer description."""
    path = Path(path)
    try:
        meta = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path / 'config.json'} is unreadable ({err})") from None
    if meta.get("format") != EXPORT_FORMAT:
        raise UserError(f"{path} is not a model exported by scripts/export.py", hint="for OpenAI's GPT-2 use init_from=gpt2 init_path=...")
    state = _safetensors().load_file(str(path / "model.safetensors"))
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return GPTConfig.from_dict(meta["model_config"]), state, meta["tokenizer"]


def load_weights(ckpt: str | Path, init_path: str | None = None) -> tuple[GPTConfig, dict, dict]:
    """GPTConfig, state dict and tokenizer description from any model source ``ckpt`` can name:
    a run directory or .pt checkpoint, a folder written by scripts/export.py, or gpt2* (OpenAI's weights)."""
    if str(ckpt) in GPT2_SIZES:
        config, state = load_gpt2(str(ckpt), init_path)
        return config, state, GPT2_TOKENIZER
    if is_export(ckpt):
        return load_export(ckpt)
    return checkpoint.read_model(checkpoint.load(checkpoint.resolve(ckpt)))


def load_model(
    ckpt: str | Path,
    device: torch.device | str = "cpu",
    attention: str | None = None,
    backend: str | None = None,
    init_path: str | None = None,
) -> tuple[GPT, tok.Tokenizer]:
    """The model (in eval mode) and tokenizer that ``ckpt`` names (as for load_weights); ``attention`` swaps the kernel.

    ``backend`` (sdpa's attention.backend) is a choice for this run: the one training used is not restored.
    """
    config, state, tokenizer = load_weights(ckpt, init_path)
    config = replace(config, attention=attention or config.attention, attention_backend=backend)
    model = GPT(config)
    model.load_state_dict(state)
    return model.to(device).eval(), tok.from_meta(tokenizer)
