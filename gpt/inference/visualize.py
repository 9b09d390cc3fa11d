"""Pictures of attention: a grid of heat maps (layers by heads) or one enlarged map, axes labelled by token."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from gpt.device import DeviceConfig
from gpt.errors import ConfigError, UserError
from gpt.files import atomic_write, output_path
from gpt.kernels.recording import record_attention
from gpt.model import GPT
from gpt.model import design as designs
from gpt.model.config import MISSING, ScriptConfig
from gpt.tokenizers.tokenizer import Tokenizer


@dataclass
class VisualizeConfig(ScriptConfig):
    """scripts/visualize_attention.py's settings (configs/visualize_attention.yaml), checked as they are built."""

    ckpt: str = MISSING  # a run directory, .pt file, exported folder, or gpt2* (with init_path)
    init_path: Optional[str] = None
    prompt: str = "def main():"  # \n and \t are unescaped, as in generate.py
    layer: Optional[int] = None  # one layer only (None: every layer)
    head: Optional[int] = None  # one head only; with layer: one enlarged map
    out: str = "attention.png"
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        output_path(self.out, "out", suffix=".png")
        for name in ("layer", "head"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 (layers and heads count from 0), got {value}")


@torch.no_grad()
def attention_maps(model: GPT, idx: Tensor) -> Tensor:
    """Attention weights of every layer and head for one sequence idx (1, T): (n_layer, n_head, T, T).

    What each design's layer shows (its Design.view): a differential layer its map w1 - lambda * w2 (weights may be
    negative), a linear one the weights its running state sums."""
    was_training = model.training
    model.eval()
    try:
        with record_attention(model) as recorded:
            model(idx)
    finally:
        model.train(was_training)
    return torch.stack([weights[0] for weights in recorded]).cpu()


def design_views(config) -> list[str]:
    """What the maps show where a design of ``config`` changes it (its Design.view), one "name: view" each."""
    return [f"{d.name}: {d.view}" for d in designs.active_anywhere(config) if d.view != designs.Design.view]


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """One readable label per token: spaces as a visible mark, control characters escaped."""
    return [repr(tokenizer.decode([i]))[1:-1].replace(" ", "\u2423") for i in ids]


def attention_figure(maps: Tensor, labels: list[str], layer: int | None = None, head: int | None = None,
                     title: str = ""):
    """A matplotlib figure: all maps as a layers x heads grid, or the one map picked by layer and head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layer, n_head = maps.shape[:2]
    for name, value, limit in (("layer", layer, n_layer), ("head", head, n_head)):
        if value is not None and not 0 <= value < limit:
            raise ValueError(f"{name}={value} is out of range: the model has {limit} {name}s (0..{limit - 1})")
    layers = [layer] if layer is not None else list(range(n_layer))
    heads = [head] if head is not None else list(range(n_head))
    single = len(layers) == 1 and len(heads) == 1
    cell = 7.0 if single else 2.2
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(cell * len(heads) + 0.6, cell * len(layers) + 0.6),
                             squeeze=False)
    show_labels = single or len(labels) <= 24
    for r, layer in enumerate(layers):
        for c, h in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(maps[layer, h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer}, head {h}", fontsize=9 if single else 6)
            ticks = range(len(labels))
            if show_labels:
                ax.set_xticks(ticks, labels, rotation=90, fontsize=8 if single else 4, family="monospace")
                ax.set_yticks(ticks, labels, fontsize=8 if single else 4, family="monospace")
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    if single:
        axes[0][0].set_xlabel("key (attended to)")
        axes[0][0].set_ylabel("query")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save_attention_png(model: GPT, tokenizer: Tokenizer, ids: list[int], out: str | Path,
                       layer: int | None = None, head: int | None = None) -> Path:
    """Compute the maps for ``ids`` and write the picture to ``out`` (a .png path)."""
    import matplotlib.pyplot as plt

    device = next(model.parameters()).device
    maps = attention_maps(model, torch.tensor([ids], device=device))
    fig = attention_figure(maps, token_labels(tokenizer, ids), layer, head,
                           title=f"attention maps ({model.config.attention} kernel, weights recomputed)"
                           + "".join(f"; {view}" for view in design_views(model.config)))
    out = output_path(str(out), "out", suffix=".png")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create the folder of out={out}: {err.strerror or err}") from None
    try:
        atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=110), what="the picture")
    finally:
        plt.close(fig)
    return out


def run(cfg: VisualizeConfig) -> Path:
    """scripts/visualize_attention.py: load the model, draw the prompt's attention maps, return the picture's path."""
    from gpt.device import resolve_device
    from gpt.inference.decoding import prompt_ids
    from gpt.inference.text import unescape
    from gpt.weights.load import load

    model, tokenizer, _ = load(cfg.ckpt, resolve_device(cfg.device.type), init_path=cfg.init_path)
    ids = prompt_ids(tokenizer, unescape(cfg.prompt))
    if len(ids) > model.config.block_size:
        raise UserError(f"the prompt has {len(ids)} tokens, more than block_size {model.config.block_size}")
    try:
        return save_attention_png(model, tokenizer, ids, cfg.out, cfg.layer, cfg.head)
    except ValueError as err:
        raise UserError(str(err), hint="layers and heads count from 0") from None
