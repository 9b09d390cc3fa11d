"""The one loader: load(source) turns anything ckpt= can name (a run folder, a .pt file, a sharded checkpoint, an
export in any layout, a Hugging Face GPT-2 folder, gpt2*) into a model ready for inference, its tokenizer and the
tokenizer's description (where a chat template lives). Every command that runs a model calls it: generate, chat,
serve, eval, visualize, the lm-eval model, the arena, the benchmarks and demos. load_weights stops before the
model is built (export, training's init_from). The formats themselves are gpt.interop's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from gpt.errors import ConfigError, UserError
from gpt.interop import hf
from gpt.interop import targets as hf_targets
from gpt.interop.formats import is_native, read_native
from gpt.interop.gpt2 import GPT2_SIZES, read_gpt2
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.model.design import DesignUnavailable
from gpt.tokenizers import tokenizer as tok
from gpt.weights import checkpoint


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


class Loaded(NamedTuple):
    """What load() returns: the model (eval mode, on its device), its tokenizer, and the tokenizer's description
    (what checkpoints and exports carry: the chat template, the special tokens)."""

    model: GPT
    tokenizer: tok.Tokenizer
    description: dict[str, Any]


def load(
    ckpt: str | Path,
    device: torch.device | str = "cpu",
    attention: str | None = None,
    backend: str | None = None,
    init_path: str | None = None,
) -> Loaded:
    """The model, tokenizer and tokenizer description that ``ckpt`` names (any source of load_weights);
    ``attention`` swaps the kernel. ``backend`` (sdpa's attention.backend) is a choice for this run: the one training
    used is not restored."""
    config, state, description = load_weights(ckpt, init_path)
    config = replace(config, attention=attention or config.attention, attention_backend=backend)
    model = GPT(config)
    model.load_state_dict(state)
    return Loaded(model.to(device).eval(), tok.from_meta(description), description)


def load_model(ckpt: str | Path, device: torch.device | str = "cpu", attention: str | None = None,
               backend: str | None = None, init_path: str | None = None) -> tuple[GPT, tok.Tokenizer]:
    """load() without the description: (model, tokenizer), as this call returned them before load() existed."""
    return load(ckpt, device, attention, backend, init_path)[:2]
