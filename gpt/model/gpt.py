"""The GPT-2 model: token + position embeddings, pre-LayerNorm transformer blocks (RMSNorm: model.norm), tied head.

Parameter names follow OpenAI's GPT-2 (transformer.wte, transformer.h.{i}.attn.c_attn, ...), so weights map one to
one. The attention formula lives in gpt.kernels (the kernels); the designs of gpt.designs act through the seams
left here: a layer's parts, a layer class of their own, the Context's per-forward values, a cache kind. Beyond GPT-2
only what every design shares: fewer key/value heads, a sliding window, a KV cache, and a layout (model.layers):
each layer built from its kind's config (``config.layer(i)``), each kind with its own Context. No training, no
sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gpt import kernels
from gpt.model import design as designs
from gpt.model.activations import ACTIVATIONS
from gpt.model.config import GPTConfig
from gpt.model.hooks import add_hook_points
from gpt.model.kv_cache import KVCache, Slots, Step


@dataclass
class Context:
    """What every layer of a kind shares in one forward pass, built once by GPT.forward (one per kind of a layout);
    the kind's designs add theirs to ``extras``."""

    positions: Tensor  # (T,) or (B, T): each token's position (a left-padded row's start at 0)
    index: Tensor  # (T,) each token's index in the padded sequence (cache slots, distances)
    key_mask: Tensor | None  # (B, Tk) True for real keys, or a whole (B|1, 1, T, Tk) mask; None: all real
    token_mask: Tensor | None  # (B, T) which of these tokens are real; None: all
    window: int | None  # the sliding window the kernel applies
    start: int | None  # index of the first token; None in a compiled one-token step (index, a tensor, holds it)
    cache: Slots | None = None  # the kind's slots (its layers: cache.layers[i])
    # the positions of the keys the cache returns, where it keeps them un-rotated and they are turned at these
    # (an endless cache's numbering inside the ring, Slots.renumbered; set by RoPE); None: keys turn as they arrive
    key_positions: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # per-forward values of designs: RoPE angles, a bias

    def layer_cache(self, layer: int) -> Any:
        return None if self.cache is None else self.cache.layers[layer]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one fused q/k/v projection, a pluggable kernel, the out projection.

    With n_kv_head < n_head (grouped-query attention) c_attn projects to fewer key/value heads:
    (n_head + 2 * n_kv_head) * head_dim outputs. Designs that are parts (``self.parts``) add parameters, transform
    q and k and modify the scores; a design that changes the whole layer subclasses it and overrides ``qkv`` (the
    projections) or ``attend`` (the attention itself).
    """

    recorded: list[Tensor] | None = None  # set by gpt.kernels.recording: weights of layers that use no kernel

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.layer = layer  # 0-based: the cache's layer, and for designs whose settings vary with depth
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.qk_dim = self.qk_width(config)  # features of one query or key as the parts see it
        self.dropout = config.dropout
        self.scale: float | None = None  # None: the kernel's 1/sqrt(q's width)
        self.add_projections(config)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.kernel = kernels.get(config.attention, config.attention_backend)
        self.parts = designs.active(config)  # a plain list of Design objects: their hooks act on this layer
        for part in self.parts:
            part.build(self, config)
        add_hook_points(self, "hook_q", "hook_k", "hook_v", "hook_z", heads=True)  # (B, H, T, D) tensors
        add_hook_points(self, "hook_attn_scores", "hook_pattern")  # called by gpt.interpret's kernels

    @classmethod
    def qk_width(cls, config: GPTConfig) -> int:
        return config.head_dim

    def add_projections(self, config: GPTConfig) -> None:
        qkv_dim = (config.n_head + 2 * config.n_kv_head) * config.head_dim
        self.c_attn = nn.Linear(config.n_embd, qkv_dim, bias=config.bias)

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        """x (B, T, C) -> (B, T, C); with a cache, the new keys are stored and the queries attend to what it returns."""
        B, T, C = x.shape
        q, k, v = self.qkv(x, ctx)  # (B, nh, T, hs), (B, nkv, Tk, hs) x 2: Tk counts the cached keys too
        if self.hooked:  # a function is attached to one of this layer's hook points (gpt.interpret)
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
            y = self.hook_z(self.attend(q, k, v, ctx))  # (B, nh, T, hs)
        else:
            y = self.attend(q, k, v, ctx)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        for part in self.parts:  # an output gate
            y = part.output(self, y, x, ctx)
        y = self.c_proj(y)
        return self.resid_dropout(y) if self.training else y  # dropout is the identity in eval: not even a call

    def qkv(self, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        B, T, C = x.shape
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
        # (B, T, heads * head_dim) -> (B, heads, T, head_dim)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = self.transform(q, k, ctx)
        cache = ctx.layer_cache(self.layer)
        if cache is not None:
            k, v = cache.update(k, v, ctx)  # (B, nkv, Tk, hs): the prompt's own keys, or every cached one
            k = self.transform_cached(k, ctx)
        return q, k, v

    def transform(self, q: Tensor, k: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """The parts' q/k transforms in turn (e.g. QK-norm, then RoPE). q (B, nh, T, d), k (B, nkv, T, d)."""
        for part in self.parts:
            q, k = part.qk(self, q, k, ctx)
        return q, k

    def transform_cached(self, k: Tensor, ctx: Context) -> Tensor:
        """The parts' transforms of the keys (B, nkv, Tk, d) a cache returned: RoPE turns those an endless cache
        keeps un-rotated at their positions inside it (Context.key_positions)."""
        for part in self.parts:
            k = part.cached(self, k, ctx)
        return k

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> Tensor:
        return self.kernel(q, k, v, **self.kernel_kwargs(ctx))

    def kernel_kwargs(self, ctx: Context) -> dict[str, Any]:
        """The kernel's keywords: the causal rule, masks, window, dropout, scale, and the parts' score modifiers
        (none for GPT-2, so any kernel can run it)."""
        mask = ctx.key_mask if ctx.key_mask is None or ctx.key_mask.dim() == 4 else ctx.key_mask[:, None, None, :]
        kwargs = dict(causal=True, mask=mask, window=ctx.window, dropout_p=self.dropout if self.training else 0.0,
                      scale=self.scale)
        for part in self.parts:
            kwargs.update(part.scores(self, ctx))
        return kwargs


RMS_NORM_EPS = 1e-6  # model.norm=rmsnorm's epsilon (Llama's and Qwen's rms_norm_eps)


def norm_layer(config: GPTConfig) -> nn.Module:
    """A block's or the final norm over n_embd features: GPT-2's LayerNorm (a bias too unless bias=false), or RMSNorm
    (x / rms(x) times a weight; no mean subtracted, no bias). Either is named ln_1, ln_2, ln_f."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=RMS_NORM_EPS)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


class MLP(nn.Module):
    """Position-wise feed-forward: expand 4x, the activation (GPT-2's tanh GELU by default), project back."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.act = ACTIVATIONS[config.activation]
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = self.c_proj(self.act(self.c_fc(x)))
        return self.dropout(x) if self.training else x  # a decode step's Python calls counted: not the identity


class Block(nn.Module):
    """One transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.kind = config.kind  # whose Context it reads (None: a uniform model's one)
        self.ln_1 = norm_layer(config)
        self.attn = (designs.layer_class(config) or CausalSelfAttention)(config, layer)
        self.has_mlp = config.mlp  # model.mlp=false: attention only, no ln_2, mlp or hook_mlp_out
        if self.has_mlp:
            self.ln_2 = norm_layer(config)
            self.mlp = MLP(config)
        add_hook_points(self, "hook_resid_pre", "hook_attn_out", "hook_resid_mid",
                        *(("hook_mlp_out",) if self.has_mlp else ()), "hook_resid_post")

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        if self.hooked:  # a function is attached to one of this block's hook points (gpt.interpret)
            return self.hooked_forward(x, ctx)
        x = x + self.attn(self.ln_1(x), ctx)
        return x + self.mlp(self.ln_2(x)) if self.has_mlp else x

    def hooked_forward(self, x: Tensor, ctx: Context) -> Tensor:
        """The same pass through the block's hook points."""
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln_1(x), ctx)))
        if not self.has_mlp:
            return self.hook_resid_post(x)
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln_2(x))))


class GPT(nn.Module):
    """A decoder-only transformer language model with GPT-2's architecture and parameter names."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(config.vocab_size, config.n_embd)))
        kinds = config.kinds()  # each kind of layer's config: {None: config} unless model.layers sets a layout
        if not any(map(designs.positional, kinds.values())):  # no layer has positions of its own (e.g. RoPE)
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.transformer.drop = nn.Dropout(config.dropout)
        self.transformer.h = nn.ModuleList([Block(config.layer(i), i) for i in range(config.n_layer)])
        self.transformer.ln_f = norm_layer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_head:
            self.lm_head.weight = self.transformer.wte.weight  # weight tying, as GPT-2
        self.designs = {name: designs.active(kind) for name, kind in kinds.items()}  # per-forward values, per kind
        add_hook_points(self, "hook_embed", "hook_pos_embed", "hook_final")  # hook_final: ln_final.hook_normalized
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: / sqrt(2 * n_layer); zero_init_proj: std 0 (same draws)
                nn.init.normal_(param, std=0.0 if config.zero_init_proj else 0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embedding (the token one is tied to the head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx: Tensor, targets: Tensor | None = None, *, positions: Tensor | None = None,
                key_mask: Tensor | None = None, cache: KVCache | None = None,
                last_only: bool = False) -> tuple[Tensor, Tensor | None]:
        """idx: (B, T) token ids. Returns logits (B, T, vocab) and the mean cross-entropy if targets given.

        For generation: positions (T,) or (B, T) (default: the next T after what the cache holds),
        key_mask (B, T) marking real tokens of left-padded rows, a KVCache to fill and reuse, and last_only:
        logits (B, 1, vocab) of the last position alone (a prompt's prefill; GPT-2's head is a third of its work).
        """
        contexts = self.contexts(idx, positions, key_mask, cache)
        x = self.hook_embed(self.transformer.wte(idx))  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.hook_pos_embed(self.transformer.wpe(next(iter(contexts.values())).positions))
        if self.training:
            x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, contexts[block.kind])
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = self.lm_head(self.hook_final(self.transformer.ln_f(x)))  # (B, T, vocab)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def contexts(self, idx: Tensor, positions: Tensor | None, key_mask: Tensor | None,
                 cache: KVCache | None) -> dict[str | None, Context]:
        """Each kind's Context of this pass: the cache's bookkeeping once for its layers, then its designs' values."""
        T = idx.size(1)
        if cache is not None:
            steps = cache.step(T, key_mask)
        elif positions is None and T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        else:
            index, kinds = torch.arange(T, device=idx.device), self.config.kinds()
            steps = {name: Step(0, index, key_mask, key_mask, kind.window) for name, kind in kinds.items()}
        contexts = {}
        for name, step in steps.items():
            ctx = Context(step.index if positions is None else positions, step.index, step.key_mask, step.token_mask,
                          step.window, step.start, None if cache is None else cache.slots[name])
            for design in self.designs[name]:
                design.context(ctx, self.config.kinds()[name])
            contexts[name] = ctx
        return contexts
