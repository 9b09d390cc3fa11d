"""What TensorBoard shows besides scalars: the config, text samples, and one layer's attention maps.

The maps come from gpt.inference.visualize (weights recomputed by gpt.kernels.recording, so any kernel works). They are
drawn with Pillow, not matplotlib: a training process that imported matplotlib for this picture held about 30 MiB
more for the rest of the run and spent about a second drawing each one (docs/benchmarks.md, against nanoGPT).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import torch
import yaml

from gpt.data.loader import TokenData
from gpt.inference.decoding import generate, prompt_ids
from gpt.inference.visualize import attention_maps, token_labels
from gpt.model import GPT, kv_cache
from gpt.train.resume import flatten


def log_config(writer, config: dict) -> None:
    """The full resolved config as text, and its flat values as TensorBoard hyperparameters."""
    from torch.utils.tensorboard.summary import hparams

    writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "\n```")
    flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flatten(config).items()}
    file_writer = writer._get_file_writer()
    for summary in hparams(flat, {"val/loss": math.nan}):
        file_writer.add_summary(summary)


def sample_text(model: GPT, data: TokenData, prompt: str | list[int], n: int, seed: int, device, ctx) -> str:
    """n sampled tokens after a prompt (text or token ids), with a fixed seed: comparable across evaluations."""
    ids = prompt_ids(data.tokenizer, prompt) if isinstance(prompt, str) else prompt
    start = torch.tensor([ids], device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with ctx:
        out = generate(model, start, n, temperature=0.8, top_k=200, generator=gen,
                       vocab_limit=data.tokenizer.vocab_size, kv_cache=kv_cache.refusal(model.config) is None)
    return data.tokenizer.decode(out[0].tolist())


def log_samples(writer, model: GPT, data: TokenData, n_tokens: int, seed: int, device, ctx, step: int,
                pictures: bool = True) -> None:
    """Text samples from fixed prompts and (``pictures``) one layer's attention maps, for TensorBoard (rank 0)."""
    val = data.splits["val"]
    head = [int(t) for t in val[: min(len(val), model.config.block_size, 24)]]
    was_training = model.training
    model.eval()
    try:
        if n_tokens > 0:
            for i, prompt in enumerate(("", head[:8])):
                text = sample_text(model, data, prompt, min(n_tokens, 200), seed, device, ctx)
                writer.add_text(f"samples/prompt{i}", "```\n" + text + "\n```", step)
        if not pictures:
            return
        layer = model.config.n_layer // 2
        maps = attention_maps(model, torch.tensor([head], device=device))
        picture = attention_picture(maps[layer], token_labels(data.tokenizer, head), f"layer {layer}, step {step}")
        writer.add_image(f"attention/layer{layer}", picture, step, dataformats="HWC")
    finally:
        model.train(was_training)


def log_heads(writer, model: GPT, data: TokenData, step: int, device, seed: int) -> dict[str, float]:
    """The best head's previous-token and induction scores on repeated random tokens (gpt.interpret.heads) and the
    in-context loss of 8 validation windows, as TensorBoard scalars (heads/...): when induction heads form."""
    from gpt.interpret import heads

    scores = heads.detect(model, batch=8, seed=seed, pool=heads.token_pool(data.tokenizer, model.config.vocab_size))
    block = model.config.block_size
    starts = torch.randint(len(data.splits["val"]) - block - 1, (8,), generator=torch.Generator().manual_seed(seed))
    x, y = data.windows("val", starts.tolist(), block, device)
    values = {"heads/induction_best": float(scores["induction"].max()),
              "heads/previous_token_best": float(scores["previous_token"].max()),
              "heads/in_context_loss": heads.in_context_loss(model, torch.cat([x, y[:, -1:]], dim=1))}
    for name, value in values.items():
        writer.add_scalar(name, value, step)
    return values


# viridis (matplotlib's default colour map) at 0, 1/8, ..., 1; the colours between are interpolated linearly
VIRIDIS = np.array([[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 145, 140], [39, 173, 129],
                    [92, 200, 99], [170, 220, 50], [253, 231, 37]], dtype=np.float32)


def colour(weights: np.ndarray) -> np.ndarray:
    """(..., T, T) weights clipped to [0, 1] -> (..., T, T, 3) uint8 viridis colours (as imshow's vmin=0, vmax=1)."""
    x = np.clip(weights, 0.0, 1.0) * (len(VIRIDIS) - 1)
    low = np.minimum(x.astype(np.int64), len(VIRIDIS) - 2)
    frac = (x - low)[..., None]
    return (VIRIDIS[low] * (1 - frac) + VIRIDIS[low + 1] * frac).round().astype(np.uint8)


def label_font(size: int):
    """DejaVu Sans Mono from matplotlib's data (found without importing matplotlib: it covers the marks of
    token_labels), else Pillow's own font."""
    from PIL import ImageFont

    spec = importlib.util.find_spec("matplotlib")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "mpl-data" / "fonts" / "ttf" / "DejaVuSansMono.ttf"
        if path.is_file():
            return ImageFont.truetype(str(path), size)
    return ImageFont.load_default()


def attention_picture(maps: torch.Tensor, labels: list[str], title: str) -> np.ndarray:
    """One layer's heads side by side, (n_head, T, T) -> an (H, W, 3) uint8 picture: a title, each head's heat map
    (rows: queries, labelled on the left; columns: keys, labelled below, turned 90 degrees)."""
    from PIL import Image, ImageDraw

    n_head, T = maps.shape[0], maps.shape[-1]
    cell, font = max(10, 240 // T), label_font(9)
    margin = 6 * max((len(label) for label in labels), default=1) + 6  # room for the longest label
    side, top, gap = T * cell, 28, 8
    width = margin + n_head * (side + gap + margin) - margin
    picture = Image.new("RGB", (width, top + side + margin), "white")
    draw = ImageDraw.Draw(picture)
    draw.text((2, 2), title, fill="black", font=font)
    heat = colour(maps.float().numpy())  # (n_head, T, T, 3)
    for h in range(n_head):
        left = margin + h * (side + gap + margin)
        picture.paste(Image.fromarray(heat[h]).resize((side, side), Image.NEAREST), (left, top))
        draw.text((left, 15), f"head {h}", fill="black", font=font)
        for i, label in enumerate(labels[:T]):
            y = top + i * cell + (cell - 9) // 2
            draw.text((left - 3, y), label, fill="black", font=font, anchor="ra")
            turned = Image.new("L", (margin, cell), 255)
            ImageDraw.Draw(turned).text((margin - 3, (cell - 9) // 2), label, fill=0, font=font, anchor="ra")
            picture.paste(turned.rotate(90, expand=True), (left + i * cell, top + side))
    return np.asarray(picture)
