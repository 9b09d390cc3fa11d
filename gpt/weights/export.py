"""Export a trained model: the body of scripts/export.py (the formats themselves are gpt.interop's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gpt.errors import ConfigError, UserError
from gpt.files import output_path
from gpt.interop import formats, gpt2, hf
from gpt.interop import gguf as gguf_export
from gpt.interop import targets as hf_targets
from gpt.model.config import MISSING, ScriptConfig
from gpt.weights import checkpoint, sharded
from gpt.weights import load as pretrained


@dataclass
class ExportConfig(ScriptConfig):
    """scripts/export.py's settings (configs/export.yaml), checked as they are built."""

    ckpt: str = MISSING  # a run directory or .pt file, an exported folder, a Hugging Face GPT-2 folder
    out: Optional[str] = None  # default: <run directory>/export
    format: str = "hf"  # hf: what transformers opens (GPT-2, Starcoder2 or remote code) | native: this project's own
    gguf_type: str = "f16"  # format=gguf: f32 | f16 | q8_0 (writes <out>/model-<gguf_type>.gguf, or out=<x>.gguf)
    overwrite: bool = False  # replace an export already in out
    push_to_hub: Optional[str] = None  # a Hub repository id (user/name): upload the export there (extra [hf])
    private: bool = False  # with push_to_hub: create the repository private

    def __post_init__(self) -> None:
        if self.out is not None and self.format == "gguf" and gguf_export.is_file_name(self.out):
            output_path(self.out, "out", suffix=".gguf")  # out=model.gguf: that file
        elif self.out is not None:
            output_path(self.out, "out", folder=True)
        if self.format not in formats.FORMATS:
            raise ConfigError(f"format must be one of {', '.join(formats.FORMATS)}, got {self.format!r}",
                              hint="format=hf: GPT-2, Starcoder2 or remote code; format=native: this project's own; "
                                   "format=gguf: llama.cpp")
        if self.gguf_type not in gguf_export.TYPES:
            raise ConfigError(f"gguf_type must be one of {', '.join(gguf_export.TYPES)}, got {self.gguf_type!r}")


def default_out(ckpt: str) -> Path:
    """<run directory>/export for a checkpoint; other sources (an export, gpt2) need out= spelled out."""
    if ckpt in gpt2.GPT2_SIZES or hf.is_folder(ckpt) or formats.is_export(ckpt):
        raise UserError(f"ckpt={ckpt} is not a training run, so there is no default out=", hint="pass out=<folder>")
    return checkpoint.run_dir_of(checkpoint.resolve(ckpt)) / "export"


def run(cfg: ExportConfig) -> None:
    """Write the export (refusing an occupied out= before any weights are read), then push it if asked."""
    out = Path(cfg.out).expanduser() if cfg.out else default_out(cfg.ckpt)
    if cfg.format == "gguf":
        config, state, tokenizer = pretrained.load_weights(cfg.ckpt)
        path = formats.export(state, config, tokenizer, out, format="gguf", overwrite=cfg.overwrite,
                                 gguf_type=cfg.gguf_type)
        print(f"wrote {path} (GGUF {cfg.gguf_type}, llama.cpp architecture {gguf_export.architecture(config)})")
        return
    hf.check_out_dir(out, cfg.overwrite)
    run = [name for name in (checkpoint.LATEST, checkpoint.BEST, sharded.ROOT) if (out / name).exists()]
    if run:  # its config.json and weights would make the run read as an export (generate ckpt=<run> would load it)
        raise UserError(f"out={out} is a training run's folder (it holds {run[0]})",
                        hint="export into a folder of its own, e.g. the default <run>/export")
    config, state, tokenizer = pretrained.load_weights(cfg.ckpt)
    formats.export(state, config, tokenizer, out, format=cfg.format, overwrite=cfg.overwrite)
    what = hf_targets.WHAT[hf_targets.choose(config)] if cfg.format == "hf" else "native layout"
    print(f"wrote {out} ({what})", flush=True)
    if cfg.push_to_hub:
        print(f"pushed to {hf.push_to_hub(out, cfg.push_to_hub, private=cfg.private)}")
