"""The built-in attention kernels. Each is a separate, complete formulation of the same function.

Every kernel follows the contract in gpt.kernels.registry.AttentionKernel: True in ``mask`` means
"may attend", causal masks are bottom-right aligned, a row with nothing to attend to gives zeros.
FlexAttention lives in gpt.kernels.flex.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from gpt.errors import UserError
from gpt.kernels import scores as score_variants
from gpt.kernels.backends import SDPA_BACKENDS, choose
from gpt.kernels.masks import combine, expand_kv, kv_group
from gpt.kernels.registry import CONTRACT, OPTIONS, register


@register("manual", options=OPTIONS)
def manual(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    bias: Tensor | None = None,
    sink: Tensor | None = None,
) -> Tensor:
    """Explicit scores, -inf where not allowed, softmax, dropout, weighted sum of the values."""
    k, v = expand_kv(q, k, v)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    scores = score_variants.modify(scores, softcap, bias)  # capped, biased (no-ops unless given)
    allowed = combine(q.size(-2), k.size(-2), causal, mask, q.device, window)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = score_variants.softmax(scores, sink)
    if allowed is not None:
        # A row with nothing allowed is all NaN after softmax; zero it (and every masked entry).
        weights = weights.masked_fill(~allowed, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


@register("einsum", options=OPTIONS)
def einsum(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    bias: Tensor | None = None,
    sink: Tensor | None = None,
) -> Tensor:
    """The manual computation as torch.einsum index strings (b batch, h head, q query, k key, d feature)."""
    k, v = expand_kv(q, k, v)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = score_variants.modify(torch.einsum("bhqd,bhkd->bhqk", q, k) * scale, softcap, bias)
    allowed = combine(q.size(-2), k.size(-2), causal, mask, q.device, window)
    if allowed is not None:
        scores = torch.where(allowed, scores, float("-inf"))
    weights = score_variants.softmax(scores, sink)
    if allowed is not None:
        weights = torch.where(allowed, weights, 0.0)  # empty rows: NaN -> 0
    weights = F.dropout(weights, p=dropout_p, training=dropout_p > 0.0)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v)


@register("heads", options=OPTIONS)
def heads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    bias: Tensor | None = None,
    sink: Tensor | None = None,
) -> Tensor:
    """One head at a time: single-head attention in a loop, the outputs stacked back into heads.

    This is the "several heads as separate modules" formulation, run on the fused weights' slices.
    Query head h reads key/value head h // (H // Hkv), so grouped-query attention needs no copies.
    """
    B, H, t_q, D = q.shape
    t_k = k.size(-2)
    group = kv_group(q, k)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    allowed = combine(t_q, t_k, causal, mask, q.device, window)
    if allowed is not None:
        allowed = allowed.expand(B, H, t_q, t_k)  # a view: lets us pick each head's mask
    if bias is not None:
        bias = bias.expand(B, H, t_q, t_k)  # the same for the bias
    outputs = []
    for h in range(H):
        q_h, k_h, v_h = q[:, h], k[:, h // group], v[:, h // group]  # (B, T, D) each
        scores = (q_h @ k_h.transpose(-2, -1)) * scale  # (B, Tq, Tk)
        scores = score_variants.modify(scores, softcap, None if bias is None else bias[:, h])
        if allowed is not None:
            scores = scores.masked_fill(~allowed[:, h], float("-inf"))
        weights = score_variants.softmax(scores, None if sink is None else sink[h : h + 1])
        if allowed is not None:
            weights = weights.masked_fill(~allowed[:, h], 0.0)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        outputs.append(weights @ v_h)  # (B, Tq, D)
    return torch.stack(outputs, dim=1)


@register("sdpa", backends=tuple(SDPA_BACKENDS), options=(*CONTRACT, "bias"))
def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
    bias: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """torch's fused scaled_dot_product_attention: flash / memory-efficient / math kernels, chosen or pinned.

    ``backend`` pins one of SDPA_BACKENDS; gpt.kernels.backends.choose says which backends each call may use
    (a cached decode step on CUDA avoids cuDNN). In eager mode the choice is applied here; inside a compiled
    graph nothing is entered (a context there splits the graph): the caller's backends.Pin holds at trace time.
    If a pinned backend cannot run these inputs on this device, a UserError says why instead of torch's
    "no available kernel". A bias (ALiBi) goes in as a float attn_mask, -inf where not allowed.
    """
    if (backend is None and q.device.type == "cpu" and q.size(-2) == 1 and mask is not None and mask.size(1) == 1
            and bias is None and window is None and dropout_p == 0.0 and not torch.compiler.is_compiling()):
        return _one_masked_query(q, k, v, mask, scale)
    allowed = choose(backend, q.device.type, q.dtype, q.size(-2), k.size(-2))
    if allowed is None or torch.compiler.is_compiling():
        return _sdpa(q, k, v, causal, mask, dropout_p, scale, window, bias)
    with warnings.catch_warnings(record=True) as caught:  # torch states why it refuses a backend as warnings
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(list(allowed)):
                return _sdpa(q, k, v, causal, mask, dropout_p, scale, window, bias)
        except RuntimeError as err:
            if backend is None:
                raise
            raise _refusal(backend, err, q, caught) from None


def _one_masked_query(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float | None) -> Tensor:
    """One query per row against keys masked per row (a server's decode step over rows of different lengths) on a
    CPU: two batched matmuls, the query heads of a key head side by side. torch's fused CPU kernel, built for
    blocks of queries, took a third of the serving engine's step here (docs/serving.md). A row with no key gets 0."""
    b, h, _, d = q.shape
    groups = h // k.size(1)
    scores = torch.matmul(q.reshape(b, k.size(1), groups, d), k.transpose(-1, -2))  # (B, Hkv, groups, Tk)
    scores.mul_(scale if scale is not None else 1.0 / math.sqrt(d)).masked_fill_(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.nan_to_num_(0.0).to(v.dtype)
    return torch.matmul(weights, v).reshape(b, h, 1, v.size(-1))


def _refusal(backend: str, err: RuntimeError, q: Tensor, caught: list[warnings.WarningMessage]) -> UserError:
    """Why a pinned backend cannot run these inputs, from the warnings torch gave before failing."""
    reasons = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
    reasons = [r for r in reasons if r and not r.endswith("because:")]
    if not reasons and q.device.type != "cuda":
        reasons = [f"torch has no {backend} kernel on {q.device.type}"]
    return UserError(
        f"attention.backend={backend} cannot run here ({q.device.type}, {str(q.dtype).removeprefix('torch.')}): "
        + ("; ".join(reasons) or str(err).splitlines()[0]),
        hint="leave attention.backend unset to let torch choose, or use attention.backend=math",
    )


def _sdpa(q, k, v, causal, mask, dropout_p, scale, window, bias) -> Tensor:
    gqa = q.size(1) != k.size(1)
    t_q, t_k = q.size(-2), k.size(-2)
    if bias is None and mask is None and window is None and (not causal or t_q == t_k or t_q == 1):
        # The fast path: no explicit mask, so flash attention stays eligible. A single query (a cached
        # decode step) sees every key under the bottom-right causal rule: nothing to mask.
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal and t_q == t_k, scale=scale, enable_gqa=gqa
        )
    # torch's is_causal is top-left aligned, so Tq < Tk (a cached decode step) needs an explicit mask;
    # SDPA has no window argument, so the band is an explicit (Tq, Tk) mask too.
    allowed = combine(t_q, t_k, causal, mask, q.device, window)
    if allowed is None:  # no rule at all, only a bias
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p, scale=scale,
                                              enable_gqa=gqa)
    empty_rows = ~allowed.any(dim=-1, keepdim=True)
    any_empty = torch.compiler.is_compiling() or bool(empty_rows.any())  # compiled: no branch on the data
    if any_empty:  # let empty rows attend everywhere (keeps the softmax finite), then zero their output
        allowed = allowed | empty_rows
    attn_mask = allowed if bias is None else torch.where(allowed, bias.to(q.dtype), float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                         enable_gqa=gqa)
    return out.masked_fill(empty_rows, 0.0) if any_empty else out
