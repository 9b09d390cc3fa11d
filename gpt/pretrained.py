"""Weights in and out: OpenAI's GPT-2 and any Hugging Face GPT-2 folder in; exports in the Hugging Face layout
(transformers opens them) or this project's own (format=native), both read back losslessly; and load_model,
which turns any of them (or a training checkpoint) into a model ready for inference. gpt.hf holds the layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from gpt import checkpoint, hf, hf_targets
from gpt import tokenizer as tok
from gpt.config import GPTConfig
from gpt.designs.registry import DesignUnavailable
from gpt.errors import ConfigError, UserError
from gpt.hf import CONV1D_SUFFIXES, GPT2_TOKENIZER  # noqa: F401  (re-exported: the names callers know)
from gpt.model import GPT
from gpt.validate import Record

GPT2_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
EXPORT_FORMAT = "gpt-attention/1"
FORMATS = ("hf", "native", "gguf")  # export layouts: for transformers (the default), this project's own, llama.cpp
_safetensors = hf.safetensors_torch
gpt2_state_dict = hf.from_hf_state  # a Hugging Face GPT-2 state dict in this project's names and layout


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
    checkpoint.check_model_state(config, state, init_path or name)
    return config, state


def export(state: dict[str, Tensor], config: GPTConfig, tokenizer: dict[str, Any], out_dir: str | Path,
           format: str = "hf", overwrite: bool = False, gguf_type: str = "f16") -> Path:
    """Write an export folder: format=hf, what transformers opens with AutoTokenizer and AutoModelForCausalLM (the
    target of gpt.hf_targets.choose: GPT2LMHeadModel, Starcoder2ForCausalLM or remote code; model.safetensors,
    config.json, generation_config.json, tokenizer files); format=native, this project's names and config.json.

    Both read back losslessly (load_weights). An out_dir holding another export is refused unless overwrite.
    format=gguf writes out_dir/model-<gguf_type>.gguf (or out_dir itself when it ends in .gguf; gpt.gguf_export)
    and returns that file's path.
    """
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    out = Path(out_dir).expanduser()
    if format == "gguf":  # one file, model-<gguf_type>.gguf, beside whatever else the folder holds
        from gpt import gguf_export

        return gguf_export.write(state, config, tokenizer, out, gguf_type, overwrite)
    hf.check_out_dir(out, overwrite)
    if format == "native":
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()
                   if k != "lm_head.weight" or not config.tie_head}  # a tied head is wte: written once
        meta = {"format": EXPORT_FORMAT, "model_config": config.to_dict(), "tokenizer": tokenizer}
        hf.write_folder(out, tensors, {"format": EXPORT_FORMAT},
                        {"config.json": json.dumps(meta, indent=1, ensure_ascii=False)})
        return out
    target = hf_targets.choose(config)
    if target != "gpt2":
        hf_targets.write(target, state, config, tokenizer, out)
        return out
    tensors = hf.to_hf_state(state, config)
    files = {**hf.tokenizer_files(tokenizer, config.block_size),
             "generation_config.json": json.dumps(hf.generation_config(config, tokenizer), indent=1),
             "config.json": json.dumps(hf.hf_config(config, tokenizer, tensors["transformer.wte.weight"].dtype,
                                                    EXPORT_FORMAT), indent=1, ensure_ascii=False)}
    hf.write_folder(out, tensors, {"format": "pt"}, files)  # transformers requires format "pt"
    return out


def is_native(path: str | Path) -> bool:
    """A folder written by export(format=native): model.safetensors beside a config.json of this project's own."""
    path = Path(path)
    return (not hf_targets.is_folder(path) and path.is_dir() and (path / hf.WEIGHTS).is_file()
            and (path / "config.json").is_file())


def is_export(path: str | Path) -> bool:
    """A folder written by export() in any layout (or any Hugging Face GPT-2 folder)."""
    return hf.is_folder(path) or hf_targets.is_folder(path) or is_native(path)


def read_native(path: str | Path) -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """A folder written by export(format=native): its GPTConfig, state dict (a tied head re-tied) and tokenizer
    description; shapes not yet checked."""
    path = Path(path)
    meta = Record(hf.read_json(path / "config.json"), str(path / "config.json"),
                  "the file was edited or damaged: export the model again")
    if meta.get("format", None) != EXPORT_FORMAT:
        raise UserError(f"{path} is not a model exported by scripts/export.py",
                        hint="for OpenAI's GPT-2 use init_from=gpt2 init_path=...")
    config = checkpoint.model_config_from(meta.record("model_config").value, path / "config.json")
    tokenizer = meta.record("tokenizer").value
    state = hf.load_safetensors(path / hf.WEIGHTS)
    if config.tie_head and "transformer.wte.weight" in state:  # an untied head's own tensor is in the file
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return config, state, tokenizer


def load_export(path: str | Path) -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """A model written by export(), either layout: its GPTConfig, state dict (head re-tied), tokenizer description."""
    if hf_targets.is_folder(path):
        config, state, tokenizer = hf_targets.read_folder(path)[:3]
    else:
        config, state, tokenizer = (hf.load_folder if hf.is_folder(path) else read_native)(path)
    checkpoint.check_model_state(config, state, path)
    return config, state, tokenizer


def read_checkpoint(ckpt: str | Path) -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """A run folder, a .pt file, a ckpt.dcp or a sharded step folder: the model entries of its checkpoint."""
    path = Path(ckpt).expanduser()
    if path.is_dir() and (path / hf.WEIGHTS).is_file() and not (path / "config.json").is_file():
        raise UserError(f"{ckpt} holds {hf.WEIGHTS} but no config.json", hint="copy the export's config.json with it")
    path = checkpoint.resolve(ckpt)
    return checkpoint.read_entries(checkpoint.load(path), path)


# Every source of model weights ckpt= (init_from=) can name, tried in order: what it is, whether ckpt names one,
# and the reader that returns its GPTConfig, state dict and tokenizer description (shapes checked after, once).
Reader = Callable[[str, Optional[str]], tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]]
SOURCES: tuple[tuple[str, Callable[[str], bool], Reader], ...] = (
    ("OpenAI's GPT-2 (gpt2*, from the Hub or init_path)", lambda ckpt: ckpt in GPT2_SIZES, read_gpt2),
    ("a Hugging Face GPT-2 folder (or an export in its layout)", hf.is_folder, lambda ckpt, _: hf.load_folder(ckpt)),
    ("a Starcoder2 or remote-code export (weights and config.json only: its modeling file is never run)",
     hf_targets.is_folder, lambda ckpt, _: hf_targets.read_folder(ckpt)[:3]),
    ("a native export", is_native, lambda ckpt, _: read_native(ckpt)),
    ("a run folder, .pt file or sharded checkpoint", lambda ckpt: True, lambda ckpt, _: read_checkpoint(ckpt)),
)


def load_weights(ckpt: str | Path, init_path: str | None = None) -> tuple[GPTConfig, dict, dict]:
    """GPTConfig, state dict and tokenizer description from any model source ``ckpt`` can name (SOURCES): a run
    directory or .pt checkpoint, a folder written by scripts/export.py or any Hugging Face GPT-2 folder, or gpt2*
    (OpenAI's weights). Every source gets the same checks: the weights' names and shapes against the config, the
    tokenizer description complete and within the model's vocabulary."""
    ckpt = str(ckpt)
    for name, value in (("ckpt", ckpt), ("init_path", init_path)):
        if value is not None and not value.strip():  # "" would name the current folder
            raise UserError(f"{name} is empty", hint=f"give {name}=<a run folder, checkpoint, export or gpt2*>")
    read = next(reader for _, matches, reader in SOURCES if matches(ckpt))
    try:
        config, state, tokenizer = read(ckpt, init_path)
    except ConfigError as err:  # a model config value the dataclass refuses: say which file holds it
        damaged = "the file is damaged or was not written by this framework"
        raise UserError(f"{init_path or ckpt}: {err}",
                        hint=err.hint if isinstance(err, DesignUnavailable) else damaged) from None
    checkpoint.check_model_state(config, state, init_path or ckpt)
    problem = tok.description_problem(tokenizer)
    if problem is None and tokenizer["vocab_size"] > config.vocab_size:
        problem = f"its tokenizer has {tokenizer['vocab_size']} tokens, the model only {config.vocab_size}"
    if problem:
        raise UserError(f"{ckpt}: {problem}", hint="the file is damaged or was not written by this framework")
    return config, state, tokenizer


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
