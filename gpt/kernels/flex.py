"""FlexAttention: the masking rules written as a ``mask_mod`` function, compiled into a block-sparse kernel.

create_block_mask evaluates the mask_mod once per (query block, key block) to find blocks that are
fully masked (skipped), full (no mask needed) or partial; the kernel then visits only live blocks.
A sliding window therefore costs O(T * window), not O(T^2). On CUDA the kernel is torch.compile'd (one
compiled function for every kind of call: compiled_flex); on CPU we run it eagerly (compiling takes tens of
seconds there) and torch has no CPU backward, so attention=flex samples on a CPU but trains only on a GPU.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, and_masks, create_block_mask, flex_attention

from gpt.kernels.masks import check_window
from gpt.kernels.registry import lacks, no_backward, register


def causal_mod(offset: int):
    """Key j is at or before the query's position i + offset (bottom-right alignment)."""

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return causal


def window_mod(offset: int, window: int):
    """Key j is among the query's last ``window`` positions."""

    def in_window(b, h, q_idx, kv_idx):
        return kv_idx > q_idx + offset - window

    return in_window


def tensor_mod(mask: Tensor, t_q: int, t_k: int):
    """Look the answer up in a bool mask broadcastable to (B, H, Tq, Tk)."""
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    per_batch, per_head = mask.size(0) > 1, mask.size(1) > 1
    mask = mask.expand(mask.size(0), mask.size(1), t_q, t_k)  # e.g. key padding (B, 1, 1, Tk): a view

    def lookup(b, h, q_idx, kv_idx):
        return mask[b if per_batch else 0, h if per_head else 0, q_idx, kv_idx]

    return lookup


def block_mask(
    batch: int, heads: int, t_q: int, t_k: int, causal: bool, window: int | None, mask: Tensor | None, device
) -> BlockMask | None:
    """The BlockMask for these rules, or None when every query may see every key."""
    if mask is None:
        return _rule_block_mask(t_q, t_k, causal, window, str(device))
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask must be bool (True = may attend), got {mask.dtype}")
    mods = [tensor_mod(mask, t_q, t_k)]
    if causal:
        mods.append(causal_mod(t_k - t_q))
    if window is not None:
        mods.append(window_mod(t_k - t_q, window))
    b = batch if mask.dim() == 4 and mask.size(0) > 1 else None
    h = heads if mask.dim() >= 3 and mask.size(-3) > 1 else None
    return create_block_mask(and_masks(*mods), b, h, t_q, t_k, device=device)


@functools.lru_cache(maxsize=32)
def _rule_block_mask(t_q: int, t_k: int, causal: bool, window: int | None, device: str) -> BlockMask | None:
    """Causal / window block masks depend only on the shape: build each once, reuse it in every layer."""
    if not causal:
        return None
    mods = [causal_mod(t_k - t_q)]
    if window is not None:
        mods.append(window_mod(t_k - t_q, window))
    return create_block_mask(and_masks(*mods), None, None, t_q, t_k, device=device)


COMPILED_ON = ("cuda",)  # device types where flex runs torch.compile'd (on a CPU compiling costs tens of seconds)
COMPILER = "inductor"  # torch.compile's backend for it (tests use "eager": the same guards, no code generation)


def whole_sequence_options(enable_gqa: bool) -> dict[str, bool] | None:
    """Kernel options for whole sequences. With grouped key/value heads, inductor's decoding kernel (which it picks
    for queries shorter than 128 without gradients) packs a group's heads into one query block; past 128 rows
    (e.g. one key/value head for 4 query heads of 64 tokens) it has no valid configuration and compiling fails
    (NoValidChoicesError, found on an H200): the main kernel serves every length."""
    return {"FORCE_USE_FLEX_ATTENTION": True} if enable_gqa else None


def flex_full(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask | None, scale: float | None,
              enable_gqa: bool) -> Tensor:
    """flex_attention for whole sequences (training, evaluation, prefill): compiled on its own (compiled_flex)."""
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa,
                          kernel_options=whole_sequence_options(enable_gqa))


def flex_cached(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask | None, scale: float | None,
                enable_gqa: bool) -> Tensor:
    """flex_attention for queries against a longer KV cache (decode steps): compiled on its own, shapes dynamic."""
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


@functools.cache
def compiled_flex(compiler: str, cached: bool):
    """The compiled flex_attention for whole sequences, or (``cached``) for decode steps against a KV cache.

    Calls are shaped so that each compiles a handful of variants, never one per step (issue 30: past torch's
    recompile limit of 8 flex falls back to the unfused path): a call that needs no gradient runs under no_grad
    whatever the caller's grad mode, so evaluation and training alternate between two compiled variants; decode
    steps, whose key length grows every call, have a function (a code object, so a recompile budget) of their own,
    compiled with dynamic shapes from the start; a decode step without padding takes no block mask (a window is a
    slice of its keys). Whole sequences keep static shapes (the training kernel) until a second shape comes.
    """
    if cached:
        return torch.compile(flex_cached, backend=compiler, dynamic=True)
    return torch.compile(flex_full, backend=compiler)


# What flex lacks is declared here (start-up checks read it); the kernel itself still refuses those calls,
# so the declaration can be checked against behaviour (tests/kernels/test_attention_cli.py).
@register("flex", trains_on=("cuda",), options=("gqa", "window", "mask"), why="a torch limitation")
def flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
) -> Tensor:
    """torch.nn.attention.flex_attention with a block mask built from the causal, window and mask rules.

    A query with nothing to attend to gets zeros (flex's own convention). No attention dropout.
    """
    if dropout_p > 0.0:
        raise ValueError(f"{lacks('flex', 'dropout')}: use model.dropout=0 or another kernel")
    check_window(window, causal)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if not needs_grad:  # torch refuses CPU inputs that merely require grad, even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    elif q.device.type == "cpu":
        raise RuntimeError(
            f"{no_backward('flex', 'cpu')}: run it under torch.no_grad() to sample, train it on a CUDA GPU, "
            "or pick another kernel (e.g. attention=sdpa) to train on CPU"
        )
    if causal and mask is None and q.size(-2) == 1:  # a decode step sees every key, or a window's last keys
        k, v = (k, v) if window is None else (k[..., -window:, :], v[..., -window:, :])
        rules = None
    else:
        rules = block_mask(q.size(0), q.size(1), q.size(-2), k.size(-2), causal, window, mask, q.device)
    gqa = q.size(1) != k.size(1)
    if q.device.type in COMPILED_ON:
        with torch.set_grad_enabled(needs_grad):  # one grad mode per kind of call, whatever the caller's
            return compiled_flex(COMPILER, q.size(-2) == 1)(q, k, v, rules, scale, gqa)
    with warnings.catch_warnings():  # eager is what we want off-GPU; skip torch's "use torch.compile" advice
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, block_mask=rules, scale=scale, enable_gqa=gqa)
