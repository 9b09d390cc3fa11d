"""What TensorBoard shows besides scalars: the config, text samples, and one layer's attention maps.

The maps come from gpt.visualize (weights recomputed by gpt.attention.recording, so any kernel works).
"""

from __future__ import annotations

import math

import torch
import yaml

from gpt.data.loader import TokenData
from gpt.decoding import generate, prompt_ids
from gpt.model import GPT
from gpt.train.resume import flatten
from gpt.visualize import attention_figure, attention_maps, token_labels


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
                       vocab_limit=data.tokenizer.vocab_size)
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
        figure = attention_figure(maps, token_labels(data.tokenizer, head), layer=layer, title=f"step {step}")
        writer.add_figure(f"attention/layer{layer}", figure, step)
    finally:
        model.train(was_training)
