"""What TensorBoard shows besides scalars: the config, text samples, and one layer's attention maps.

The fused kernels (sdpa, flash) never materialise the attention weights, so they are recomputed here
from the layer's own q/k projection: softmax(q k^T / sqrt(head_dim)) under the causal mask (and the
sliding window, if any). This file reads the model's modules (transformer.h[i].attn.c_attn) and knows
their layout: c_attn's output is q (n_head heads), k and v (n_kv_head heads each) side by side, and
with pos_embedding=rope q and k are rotated before the product. Only ``_query_key`` depends on it.
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from gpt.data.loader import TokenData
from gpt.model import GPT
from gpt.sampling import prompt_ids
from gpt.train.checkpoint import flatten


def _query_key(model: nn.Module, layer: int, x: Tensor) -> tuple[Tensor, Tensor]:
    """q and k, each (B, n_head, T, head_dim), from the input x (B, T, C) of one layer's attention."""
    cfg = model.config
    B, T, C = x.shape
    n_kv_head = getattr(cfg, "n_kv_head", None) or cfg.n_head
    kv_dim = n_kv_head * cfg.head_dim
    q, k, _ = model.transformer.h[layer].attn.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
    q = q.view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)
    k = k.view(B, T, n_kv_head, cfg.head_dim).transpose(1, 2)
    if getattr(cfg, "pos_embedding", "learned") == "rope":
        from gpt.attention.rope import apply_rope, rope_angles

        cos, sin = rope_angles(torch.arange(T, device=x.device), cfg.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # grouped-query attention: query head h reads key head h // (n_head // n_kv_head)
    return q, k.repeat_interleave(cfg.n_head // n_kv_head, dim=1)


@torch.no_grad()
def attention_maps(model: nn.Module, idx: Tensor, layer: int) -> Tensor:
    """Attention weights of every head of one layer for token ids idx (1, T): a (n_head, T, T) tensor.

    Row i is query position i's distribution over key positions 0..i (zeros above the diagonal, and
    before the sliding window where the model has one).
    """
    blocks = model.transformer.h
    if not 0 <= layer < len(blocks):
        raise ValueError(f"layer {layer} out of range: the model has {len(blocks)} layers")
    captured: dict[str, Tensor] = {}
    # the attention module's input is ln_1 of the residual stream; catch it on the way in
    hook = blocks[layer].attn.register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0]))
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        hook.remove()
        model.train(was_training)
    q, k = _query_key(model, layer, captured["x"].float())
    T = idx.size(1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    i = torch.arange(T, device=scores.device)
    allowed = i[None, :] <= i[:, None]
    window = getattr(model.config, "window", None)
    if window is not None:
        allowed &= i[None, :] > i[:, None] - window
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)[0]


def attention_figure(maps: Tensor, tokens: list[str], title: str):
    """A matplotlib figure: one heat map per head, tokens along both axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_head = maps.size(0)
    cols = min(n_head, 4)
    rows = math.ceil(n_head / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
    labels = [t if t.strip() else repr(t)[1:-1] for t in tokens]
    for h, ax in enumerate(axes.flat):
        if h >= n_head:
            ax.axis("off")
            continue
        ax.imshow(maps[h].cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=9)
        if len(labels) <= 32:
            ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
            ax.set_yticks(range(len(labels)), labels, fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def log_config(writer, cfg: DictConfig, resolved: dict) -> None:
    """The full resolved config as text, and its flat values as TensorBoard hyperparameters."""
    from torch.utils.tensorboard.summary import hparams

    writer.add_text("config", "```yaml\n" + OmegaConf.to_yaml(cfg, resolve=True) + "\n```")
    flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flatten(resolved).items()}
    file_writer = writer._get_file_writer()
    for summary in hparams(flat, {"val/loss": math.nan}):
        file_writer.add_summary(summary)


def sample_text(model: GPT, data: TokenData, prompt: str | list[int], n: int, seed: int, device, ctx) -> str:
    """n sampled tokens after a prompt (text or token ids), with a fixed seed: comparable across evaluations."""
    ids = prompt_ids(data.tokenizer, prompt) if isinstance(prompt, str) else prompt
    start = torch.tensor([ids], device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with ctx:
        out = model.generate(start, n, temperature=0.8, top_k=200, generator=gen)
    return data.tokenizer.decode(out[0].tolist())


def log_samples(writer, model: GPT, data: TokenData, n_tokens: int, seed: int, device, ctx, step: int) -> None:
    """Text samples from fixed prompts and one layer's attention maps, for TensorBoard (rank 0)."""
    val = data.splits["val"]
    head = [int(t) for t in val[: min(len(val), model.config.block_size, 24)]]
    was_training = model.training
    model.eval()
    try:
        if n_tokens > 0:
            for i, prompt in enumerate(("", head[:8])):
                text = sample_text(model, data, prompt, min(n_tokens, 200), seed, device, ctx)
                writer.add_text(f"samples/prompt{i}", "```\n" + text + "\n```", step)
        layer = model.config.n_layer // 2
        maps = attention_maps(model, torch.tensor([head], device=device), layer)
        tokens = [data.tokenizer.decode([t]) for t in head]
        writer.add_figure(f"attention/layer{layer}", attention_figure(maps, tokens, f"layer {layer}, step {step}"), step)
    finally:
        model.train(was_training)
