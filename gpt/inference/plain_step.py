"""A one-token decode step for a model without designs, written as straight tensor calls.

An eager cached step of the default model (4 layers of 128) is about a hundred torch calls of a few microseconds
each, and as much again in Python around them: module calls, attribute lookups, a Context, the kernel's keywords,
the cache's bookkeeping (docs/benchmarks.md: a profile put a step at about twice what its tensor calls alone take).
``PlainStep`` does the same arithmetic as ``GPT.forward`` with a ``KVCache`` for one token per row, on the same
kernels in the same order, so its logits equal ``decode_step``'s bit for bit: the weights and cache buffers
gathered once per sequence, the new keys and values written in place into the cache's preallocated buffers, no
Context, no module calls. It serves only what it copies: GPT-2's layers (learned positions, LayerNorm or RMSNorm,
grouped-query or not, an MLP or none), attention=sdpa with no backend pinned, no hook attached, rows not padded,
no window's ring; ``plain_step`` says None for anything else and decoding keeps the general step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt import kernels
from gpt.inference.weight_layout import packed_forward
from gpt.model import GPT
from gpt.model.gpt import CausalSelfAttention
from gpt.model.kv_cache import KVCache, LayerKV, Slots


class _Layer(NamedTuple):
    """One block's operations with their weights bound, built once for a sequence's steps."""

    norm_1: Callable[[Tensor], Tensor]
    qkv: Callable[[Tensor], Tensor]
    proj: Callable[[Tensor], Tensor]
    norm_2: Callable[[Tensor], Tensor] | None  # None: model.mlp=false
    fc: Callable[[Tensor], Tensor] | None
    act: Callable[[Tensor], Tensor] | None
    fc_proj: Callable[[Tensor], Tensor] | None


def plain(model: GPT) -> bool:
    """Whether PlainStep computes this model's decode steps exactly: GPT-2's layers and nothing else."""
    c = model.config
    if model.training or model.hooked or c.attention != "sdpa" or c.attention_backend is not None:
        return False
    if list(c.kinds()) != [None] or model.designs[None] or "wpe" not in model.transformer:
        return False
    norms = (nn.LayerNorm, nn.RMSNorm)
    sdpa = kernels.get("sdpa")
    for block in model.transformer.h:
        attn = block.attn
        if (block.hooked or attn.hooked or type(attn) is not CausalSelfAttention or attn.parts or attn.scale is not None
                or attn.kernel is not sdpa or type(block.ln_1) not in norms
                or (block.has_mlp and type(block.ln_2) not in norms)):
            return False
    return type(model.transformer.ln_f) in norms


def _norm(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The module's own functional call (LayerNorm or RMSNorm) with its weights bound: no module call."""
    shape, weight, eps = module.normalized_shape, module.weight, module.eps
    if type(module) is nn.LayerNorm:
        bias = module.bias
        return lambda x: torch.layer_norm(x, shape, weight, bias, eps)
    return lambda x: torch.rms_norm(x, shape, weight, eps)


def _linear(module: nn.Linear, vector: bool) -> Callable[[Tensor], Tensor]:
    """F.linear with the weights bound; for one row (a vector, fp32 only) torch.addmv: the same sums (MKL multiplies
    a one-row fp32 matrix as a vector; equal bit for bit on torch 2.13 to 2.15 here) without addmm's wrapping, 3 to 5
    us less a call for the default model's matrices on this CPU. In bf16 addmv was no faster (0.9x to 2x F.linear's
    time) and sums otherwise (docs/benchmarks.md). A Linear packed for oneDNN (weight_layout.onednn_linears) keeps
    its own forward, called as a function: the general step's products exactly."""
    packed = packed_forward(module)
    if packed is not None:
        return (lambda x: packed(x.view(1, -1)).view(-1)) if vector else packed
    weight, bias = module.weight, module.bias
    if not vector:
        return partial(F.linear, weight=weight, bias=bias)
    return partial(torch.mv, weight) if bias is None else partial(torch.addmv, bias, weight)


def _layers(model: GPT, vector: bool) -> list[_Layer]:
    mlp = [b.mlp if b.has_mlp else None for b in model.transformer.h]
    return [_Layer(_norm(b.ln_1), _linear(b.attn.c_attn, vector), _linear(b.attn.c_proj, vector),
                   m and _norm(b.ln_2), m and _linear(m.c_fc, vector), m and m.act, m and _linear(m.c_proj, vector))
            for b, m in zip(model.transformer.h, mlp)]


class PlainStep:
    """decode_step(model, token, positions, cache) for a model plain() accepts: (B, vocab) logits of one token per
    row, the cache advanced exactly as the general step advances it. Falls back to ``fallback`` for a cache it does
    not serve (padded rows, a ring, a layer kind of a design)."""

    def __init__(self, model: GPT, fallback) -> None:
        self.model, self.fallback = model, fallback
        # one row of fp32 as vectors (matrix-vector products), else rows (B, C)
        self.vectors = model.lm_head.weight.dtype == torch.float32
        self.rows = {True: _layers(model, True), False: _layers(model, False)}
        self.final = {vector: (_norm(model.transformer.ln_f), _linear(model.lm_head, vector)) for vector in self.rows}
        c = model.config
        self.heads, self.kv_heads, self.head_dim = c.n_head, c.n_kv_head, c.head_dim
        self.wte, self.wpe = model.transformer.wte.weight, model.transformer.wpe.weight
        self.kernel = kernels.get("sdpa")

    def serves(self, cache: KVCache) -> Slots | None:
        """The cache's one Slots when this step can advance it: keys and values in order, rows not padded."""
        slots = cache.slots.get(None)
        if (slots is None or len(cache.slots) != 1 or not slots.started or slots.padded or slots.window is not None
                or cache.refusal or any(type(layer) is not LayerKV for layer in cache.layers)):
            return None
        return slots

    def __call__(self, model: GPT, token: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
        slots = self.serves(cache) if model is self.model and token.size(1) == 1 and positions is not None else None
        if slots is None:
            return self.fallback(model, token, positions, cache)
        if torch.is_grad_enabled():  # stream runs without; another caller may not
            with torch.no_grad():
                return self(model, token, positions, cache)
        start = slots.length
        if start + 1 > slots.max_length:
            raise ValueError(f"KV cache overflow: {start} + 1 tokens exceed block_size {slots.max_length}")
        slots.key_mask.select(1, start).fill_(True)
        slots.pos.fill_(start + 1)
        return self._forward(token, positions, [(kv.k, kv.v) for kv in cache.layers], start, 0, start + 1, None)

    @torch.no_grad()
    def pooled(self, token: Tensor, positions: Tensor, stores: list[tuple[Tensor, Tensor]], column: int, lo: int,
               hi: int, key_mask: Tensor | None) -> Tensor:
        """A serving engine's step over its cache pool (gpt.serve.cache_pool): one token per row, token and
        positions (B, 1), each layer's keys and values in stores (B, kv_heads, slots, head_dim); every row's new key
        goes to slot ``column``, and it attends over slots [lo, hi), key_mask (B, hi - lo) True where a row holds a
        real key (None: all). The logits the general step gives through the pool's view of these stores, bit for
        bit (the masked case through the same attention kernel)."""
        return self._forward(token, positions, stores, column, lo, hi, key_mask)

    def _forward(self, token: Tensor, positions: Tensor, stores: list[tuple[Tensor, Tensor]], write: int, lo: int,
                 hi: int, key_mask: Tensor | None) -> Tensor:
        B = token.size(0)
        vector = B == 1 and self.vectors
        index = token.view(()) if vector else token.view(B)
        x = torch.embedding(self.wte, index) + torch.embedding(self.wpe, positions.view(index.shape))  # (C,) or (B, C)
        mask = None if key_mask is None else key_mask[:, None, None, :]  # as the attention layer hands it on
        for layer, (k, v) in zip(self.rows[vector], stores):
            x = self._block(layer, k, v, x, write, lo, hi, mask)
        norm, head = self.final[vector]
        return head(norm(x)).view(B, -1)

    def _block(self, layer: _Layer, k_store: Tensor, v_store: Tensor, x: Tensor, write: int, lo: int, hi: int,
               mask: Tensor | None) -> Tensor:
        """One block for one token per row, x (B, C) or (C,): its key and value written at slot ``write``, attention
        over slots [lo, hi) (mask: (B, 1, 1, hi - lo) or None), then the MLP, each added to x."""
        h, hkv = self.heads, self.kv_heads
        q, k, v = layer.qkv(layer.norm_1(x)).view(-1, h + 2 * hkv, 1, self.head_dim).split([h, hkv, hkv], dim=1)
        k_store.narrow(2, write, 1).copy_(k)  # (B, heads, 1, D) each, into the cache's preallocated buffers
        v_store.narrow(2, write, 1).copy_(v)
        keys, values = k_store.narrow(2, lo, hi - lo), v_store.narrow(2, lo, hi - lo)
        if mask is None:
            y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=h != hkv)  # (B, h, 1, D): for one token,
        else:  # the order of (B, C); rows of different lengths: the kernel the general step calls, its arguments
            y = self.kernel(q, keys, values, causal=True, mask=mask, window=None, dropout_p=0.0, scale=None)
        x = x + layer.proj(y.reshape(x.shape))
        if layer.fc is None:
            return x
        return x + layer.fc_proj(layer.act(layer.fc(layer.norm_2(x))))


def plain_step(model: GPT, fallback) -> PlainStep | None:
    """A PlainStep for this model, falling back to ``fallback``; None when plain() refuses the model."""
    return PlainStep(model, fallback) if plain(model) else None
