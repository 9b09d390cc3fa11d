"""Export a trained model: the body of scripts/export.py (the layouts themselves are gpt.hf and gpt.pretrained)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gpt import checkpoint, hf, pretrained
from gpt.config import MISSING, ScriptConfig
from gpt.errors import ConfigError, UserError


@dataclass
class ExportConfig(ScriptConfig):
    """scripts/export.py's settings (configs/export.yaml), checked as they are built."""

    ckpt: str = MISSING  # a run directory or .pt file, an exported folder, a Hugging Face GPT-2 folder
    out: Optional[str] = None  # default: <run directory>/export
    format: str = "hf"  # hf: what transformers opens (GPT-2 layout) | native: this project's own (any model)
    overwrite: bool = False  # replace an export already in out
    push_to_hub: Optional[str] = None  # a Hub repository id (user/name): upload the export there (extra [hf])
    private: bool = False  # with push_to_hub: create the repository private

    def __post_init__(self) -> None:
        if self.format not in pretrained.FORMATS:
            raise ConfigError(f"format must be one of {', '.join(pretrained.FORMATS)}, got {self.format!r}",
                              hint="format=native exports models GPT-2's layout cannot hold (rope, n_kv_head, window)")


def default_out(ckpt: str) -> Path:
    """<run directory>/export for a checkpoint; other sources (an export, gpt2) need out= spelled out."""
    if ckpt in pretrained.GPT2_SIZES or hf.is_folder(ckpt) or pretrained.is_export(ckpt):
        raise UserError(f"ckpt={ckpt} is not a training run, so there is no default out=", hint="pass out=<folder>")
    return checkpoint.run_dir_of(checkpoint.resolve(ckpt)) / "export"


def run(cfg: ExportConfig) -> None:
    """Write the export (refusing an occupied out= before any weights are read), then push it if asked."""
    out = Path(cfg.out).expanduser() if cfg.out else default_out(cfg.ckpt)
    hf.check_out_dir(out, cfg.overwrite)
    config, state, tokenizer = pretrained.load_weights(cfg.ckpt)
    pretrained.export(state, config, tokenizer, out, format=cfg.format, overwrite=cfg.overwrite)
    print(f"wrote {out} ({'Hugging Face GPT-2 layout' if cfg.format == 'hf' else 'native layout'})", flush=True)
    if cfg.push_to_hub:
        print(f"pushed to {hf.push_to_hub(out, cfg.push_to_hub, private=cfg.private)}")
