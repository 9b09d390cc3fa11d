"""What an evaluation reads: the model (any source gpt.weights.load.load_model takes) and the prepared data to score
it on (a folder, a data config, or by default the data the run was trained on), checked against each other."""

from __future__ import annotations

from pathlib import Path

from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.errors import UserError
from gpt.files import load_archive
from gpt.interop import formats, gpt2
from gpt.tokenizers.tokenizer import Tokenizer, describe
from gpt.validate import Record
from gpt.weights import checkpoint


def recorded_data_dir(ckpt: str) -> Path | None:
    """The prepared data folder a training checkpoint records in its run config (None for exports and gpt2*)."""
    if ckpt in gpt2.GPT2_SIZES or formats.is_export(ckpt):
        return None
    path = checkpoint.resolve(ckpt)
    if path.is_dir():  # a sharded step folder: the config is in its meta.pt
        from gpt.weights.sharded import META

        path = path / META
    payload = load_archive(path, mmap=True)  # tensors stay on disk
    config = payload.get("config") if isinstance(payload, dict) else None
    if not isinstance(config, dict) or "data" not in config:
        return None
    data = Record(config, str(path), "the checkpoint is damaged: pass data_dir=<prepared data folder>",
                  "config").record("data")
    return Path(data.str("root", None) or "data") / data.str("name")


def data_dir(data: DataConfig | None, folder: str | None, ckpt: str) -> Path:
    """The prepared data folder: ``folder`` (data_dir=), data.root/data.name (data=<name>), else the run's own."""
    if folder is not None:
        return Path(folder).expanduser()
    if data is not None:
        return Path(data.root).expanduser() / data.name
    recorded = recorded_data_dir(ckpt)
    if recorded is None:
        raise UserError(f"{ckpt} records no training data to evaluate on",
                        hint="add data=<configs/data name, e.g. stdlib_gpt2> or data_dir=<prepared data folder>")
    return recorded


def open_data(data: DataConfig | None, folder: str | None, ckpt: str, tokenizer: Tokenizer, split: str,
              block_size: int) -> TokenData:
    """The prepared data, refused when its tokenizer is not the model's or ``split`` is shorter than one window."""
    path = data_dir(data, folder, ckpt)
    if not (path / "meta.json").is_file():
        how = f"data={data.name}" if data is not None else f"data.name={path.name} data.root={path.parent}"
        raise UserError(f"no prepared data in {path} (meta.json missing)",
                        hint=f"prepare it first: python scripts/prepare.py {how} (with the data's other settings)")
    tokens = TokenData(path)
    if tokens.tokenizer.to_meta() != tokenizer.to_meta():
        raise UserError(f"the model's tokenizer ({describe(tokenizer.to_meta())}) is not the one "
                        f"{path} was prepared with ({describe(tokens.tokenizer.to_meta())})",
                        hint="evaluate on data prepared with the model's tokenizer (data.tokenizer=gpt2 for GPT-2)")
    n = len(tokens.splits[split])
    if n < block_size + 1:
        raise UserError(f"the {split} split of {path} has {n} tokens, fewer than one window "
                        f"(block_size + 1 = {block_size + 1})", hint="use a larger split or the other one (split=)")
    return tokens
