"""Exports, every format: writing one (export: the Hugging Face layout transformers opens, this project's own
native layout, GGUF) and reading one back (load_export), both losslessly; which folder is which (is_export)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from gpt.errors import UserError
from gpt.interop import hf
from gpt.interop import targets as hf_targets
from gpt.model.config import GPTConfig
from gpt.model.design import spell
from gpt.model.state import check_model_state, model_config_from
from gpt.validate import Record

EXPORT_FORMAT = "gpt-attention/1"
FORMATS = ("hf", "native", "gguf")  # export layouts: for transformers (the default), this project's own, llama.cpp


def export(state: dict[str, Tensor], config: GPTConfig, tokenizer: dict[str, Any], out_dir: str | Path,
           format: str = "hf", overwrite: bool = False, gguf_type: str = "f16") -> Path:
    """Write an export folder: format=hf, what transformers opens with AutoTokenizer and AutoModelForCausalLM (the
    target of gpt.interop.targets.choose: GPT2LMHeadModel, Starcoder2ForCausalLM, GPTNeoForCausalLM or remote code;
    model.safetensors, config.json, generation_config.json, tokenizer files); format=native, this project's names
    and config.json.

    Both read back losslessly (load_weights; GPT-Neo's q_proj, which holds the 1/sqrt(head_dim) scale, within one
    rounding unless that scale is a power of two). An out_dir holding another export is refused unless overwrite.
    format=gguf writes out_dir/model-<gguf_type>.gguf (or out_dir itself when it ends in .gguf; gpt.interop.gguf)
    and returns that file's path.
    """
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    if config.layers is not None and format == "gguf":  # its writer reads one design set for all layers
        raise UserError(f"model.layers={spell(config.layers)} is a layout (a kind per layer), which format={format} "
                        "cannot hold yet: its writer describes one attention design for every layer",
                        hint="export it with format=native (this project's own layout, read back losslessly)")
    out = Path(out_dir).expanduser()
    if format == "gguf":  # one file, model-<gguf_type>.gguf, beside whatever else the folder holds
        from gpt.interop import gguf as gguf_export

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
    config = model_config_from(meta.record("model_config").value, path / "config.json")
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
    check_model_state(config, state, path)
    return config, state, tokenizer
