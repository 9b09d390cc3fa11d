"""scripts/interpret.py's body: one analysis of a checkpoint, written as JSON and a PNG picture into ``out``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from torch import Tensor

from gpt.device import DeviceConfig
from gpt.errors import ConfigError, UserError
from gpt.files import atomic_write_all, output_path
from gpt.interpret.heads import parse_heads
from gpt.interpret.hooks import ABLATIONS
from gpt.model.config import MISSING, ScriptConfig

ANALYSES = ("heads", "lens", "attribution", "patching", "ablation", "curve")


@dataclass
class InterpretConfig(ScriptConfig):
    """scripts/interpret.py's settings (configs/interpret.yaml), checked as they are built."""

    ckpt: str = MISSING  # a run directory, .pt file, exported folder, or gpt2* (with init_path)
    init_path: Optional[str] = None
    analysis: str = "heads"  # heads | lens | attribution | patching | ablation | curve
    prompt: str = "def main():\n    return main()"  # lens, attribution, patching (clean); \n and \t unescaped
    corrupted: Optional[str] = None  # patching: the corrupted prompt, as many tokens as prompt
    ablate: list[str] = field(default_factory=list)  # ablation: heads as L{layer}H{head}; empty: each head alone
    ablate_with: str = "zero"  # ablation: zero (the head's output zeroed) | mean (its mean over batch and positions)
    repeat: Optional[int] = None  # heads/ablation: the repeated half's length (None: half the context)
    batch: int = 16  # heads/ablation: sequences of repeated random tokens
    seed: int = 0
    out: str = "interpret"  # a folder: <analysis>.json and <analysis>.png
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        if self.analysis not in ANALYSES:
            raise ConfigError(f"analysis={self.analysis} is not one of {', '.join(ANALYSES)}")
        if self.batch < 1:
            raise ConfigError(f"batch must be >= 1, got {self.batch}")
        parse_heads(self.ablate)
        if self.ablate_with not in ABLATIONS:
            raise ConfigError(f"ablate_with={self.ablate_with} is not one of {', '.join(ABLATIONS)}")
        output_path(self.out, "out", folder=True)


def plain(value):
    """Tensors to lists (rounded), for JSON."""
    if isinstance(value, Tensor):
        return plain(value.tolist())
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def write(out: Path, analysis: str, result: dict, figure) -> list[Path]:
    """<out>/<analysis>.json and .png, each written whole or not at all."""
    import matplotlib.pyplot as plt

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create out={out}: {err.strerror or err}") from None
    paths = [out / f"{analysis}.json", out / f"{analysis}.png"]
    text = json.dumps(plain(result), indent=1).encode()
    try:
        atomic_write_all([(paths[0], lambda f: f.write(text)),
                          (paths[1], lambda f: figure.savefig(f, format="png", dpi=100))], what="the results")
    finally:
        plt.close(figure)
    return paths


def run(cfg: InterpretConfig) -> list[Path]:
    """Load the model, run the analysis, write its JSON and picture; returns their paths."""
    from gpt.device import resolve_device
    from gpt.interpret import analyses
    from gpt.weights.load import load

    model, tokenizer, _ = load(cfg.ckpt, resolve_device(cfg.device.type), init_path=cfg.init_path)
    result, figure = analyses.ANALYSES[cfg.analysis](model, tokenizer, cfg)
    return write(Path(cfg.out), cfg.analysis, result, figure)
