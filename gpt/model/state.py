"""A model read from a file, checked: the GPTConfig a checkpoint or an export records (model_config_from) and the
one shape check of every model source's weights against GPT(config) (check_model_state). Checkpoints (gpt.weights)
and the other tools' formats (gpt.interop) both read through here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpt.errors import ConfigError, UserError
from gpt.model import renamed
from gpt.model.config import GPTConfig
from gpt.model.design import DesignUnavailable
from gpt.model.gpt import GPT
from gpt.validate import Record, dataclass_values

MAX_BLOCK_SIZE = 1 << 20  # positions a model read from a file may have: beyond, its KV cache alone is absurd
DAMAGED = "the file is damaged or was not written by this framework"


def model_config_from(values: Any, source: str | Path) -> GPTConfig:
    """The GPTConfig a file records (a checkpoint's model_config, an export's config.json), each field's type
    checked (gpt.validate) and each value by GPTConfig itself; a UserError naming ``source`` otherwise."""
    values = Record(values, str(source), DAMAGED, "model_config").value
    try:
        values = renamed.upgrade(values)  # a file from before the designs were named one way: today's spelling
    except ConfigError as err:
        raise UserError(f"{source}: {err}", hint=DAMAGED) from None
    values = dataclass_values(GPTConfig, values, str(source), DAMAGED, prefix="model_config.")
    try:
        config = GPTConfig.from_dict(values)
    except ConfigError as err:  # a design this process has not loaded keeps its hint: how to bring it
        raise UserError(f"{source}: {err}", hint=err.hint if isinstance(err, DesignUnavailable) else DAMAGED) from None
    if config.block_size > MAX_BLOCK_SIZE:
        raise UserError(f"{source}: model_config.block_size {config.block_size:,} is more than the "
                        f"{MAX_BLOCK_SIZE:,} positions a model read from a file may have", hint=DAMAGED)
    return config


def check_model_state(config: GPTConfig, state: Any, source: str | Path = "the checkpoint") -> None:
    """The one shape check of every model source: refuse a state dict whose names or shapes are not those of
    GPT(config), naming the first difference. The sizes that would make even an empty model absurd (layers,
    vocabulary, width, positions) are checked against the tensors first, so a hostile config cannot hang it."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{source}: the model entry is not a dict of tensors", hint=DAMAGED)
    check_sizes(config, state, source)
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in GPT(config).state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise UserError(f"{source}: the weights do not match the model config ({what}; "
                        f"{len(missing)} missing, {len(unexpected)} unexpected)",
                        hint="the file is damaged or its config belongs to another model")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise UserError(f"{source}: {name} has shape {tuple(state[name].shape)}, the model config says {shape}",
                            hint="the file is damaged or its config belongs to another model")


def check_sizes(config: GPTConfig, state: dict[str, torch.Tensor], source: str | Path) -> None:
    """The layer count and the token (and position) table against the tensors, before a model is built."""
    layers = {key.split(".")[2] for key in state if key.startswith("transformer.h.")}
    wte = state.get("transformer.wte.weight")
    problem = None
    if config.n_layer != len(layers):
        problem = (f"model_config.n_layer is {config.n_layer:,}, the weights hold {len(layers)} "
                   f"layer{'s' if len(layers) != 1 else ''}")
    elif wte is None or tuple(wte.shape) != (config.vocab_size, config.n_embd):
        problem = (f"transformer.wte.weight has shape {None if wte is None else tuple(wte.shape)}, the model config "
                   f"says {(config.vocab_size, config.n_embd)} (vocab_size, n_embd)")
    elif config.block_size > MAX_BLOCK_SIZE:
        problem = f"model_config.block_size {config.block_size:,} is more than {MAX_BLOCK_SIZE:,}"
    if problem:
        raise UserError(f"{source}: {problem}", hint="the file is damaged or its config belongs to another model")
