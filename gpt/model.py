"""The GPT-2 model: token + position embeddings, pre-LayerNorm transformer blocks, tied output head.

Parameter names follow OpenAI's GPT-2 (transformer.wte, transformer.h.{i}.attn.c_attn, ...), so weights
map one to one. The attention formula itself lives in gpt.attention; this file only shapes the tensors.
Options beyond GPT-2 (config): fewer key/value heads (n_kv_head), a sliding window, rotary position
embeddings or ALiBi score biases instead of the learned wpe table (pos_embedding=rope|alibi), and the
attention variants QK-norm (qk_norm), logit soft-capping (attn_softcap), a sink logit per head (attn_sink) and
differential attention (diff_attn: two softmax maps from the halves of q and k, the second one subtracted),
causal linear attention (linear_attn: a feature map instead of the softmax, decoded from a running state), and
multi-head latent attention (mla_latent: keys and values up-projected from a small cached latent, DeepSeek-V2).
The model knows nothing of training, devices or sampling strategy.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gpt import attention
from gpt.attention.alibi import alibi_bias
from gpt.attention.linear import causal_linear_attention
from gpt.attention.masks import sink_band
from gpt.attention.rope import apply_rope, rope_angles
from gpt.config import GPTConfig
from gpt.kv_cache import KVCache, LatentKV, LayerKV, LinearState

LayerCache = LayerKV | LatentKV | LinearState  # what one layer keeps in a KVCache


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q/k/v projection and a pluggable kernel.

    With n_kv_head < n_head (grouped-query attention) c_attn projects to fewer key/value heads:
    (n_head + 2 * n_kv_head) * head_dim outputs. With pos_embedding=rope, q and k are rotated here; with
    qk_norm they are first RMS-normalised per head. Soft-cap, ALiBi bias and sink go to the kernel's scores.
    With diff_attn (Diff Transformer) each head's q and k are two halves, each normalised, rotated and given to the
    kernel on its own; ``layer`` (0-based) sets that layer's lambda_init. With linear_attn no kernel is used:
    gpt.attention.linear computes it, and the cache keeps its running state instead of keys and values. With
    mla_latent (multi-head latent attention) there is no c_attn: see latent_qkv.
    """

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.latent = config.mla_latent  # None, or the width d_c of the latent keys and values come from
        if self.latent is None:
            qkv_dim = (config.n_head + 2 * config.n_kv_head) * config.head_dim
            self.c_attn = nn.Linear(config.n_embd, qkv_dim, bias=config.bias)
        else:
            self.add_latent_projections(config)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.kernel = attention.get(config.attention, config.attention_backend)
        self.q_norm = nn.RMSNorm(config.qk_dim, eps=1e-6) if config.qk_norm else None  # a gain per feature
        self.k_norm = nn.RMSNorm(config.qk_dim, eps=1e-6) if config.qk_norm else None
        self.softcap = config.attn_softcap
        self.sink = nn.Parameter(torch.zeros(config.n_head)) if config.attn_sink else None  # (nh,) logits
        self.linear = config.linear_attn  # a feature map name, or None (softmax attention through the kernel)
        self.linear_kernel = causal_linear_attention  # an attribute, so gpt.attention.recording can swap it
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer) if config.diff_attn else None  # the paper's schedule
        if config.diff_attn:  # lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init; the paper's init N(0, 0.1^2)
            half = config.head_dim // 2
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.randn(half) * 0.1) for _ in range(4))  # (hs/2,) each
            self.subln = nn.RMSNorm(config.head_dim, eps=1e-5)  # per head over its hs features, gain shared by heads

    def add_latent_projections(self, config: GPTConfig) -> None:
        """MLA's projections (DeepSeek-V2 eqs. 9-10, 14-18; no query compression), with d_c = model.mla_latent and
        d_R = model.mla_rope_dim."""
        C, heads, d_c, d_r = config.n_embd, config.n_head * config.head_dim, config.mla_latent, config.mla_rope_dim
        assert d_c is not None and d_r is not None  # GPTConfig resolved them
        self.rope_dim = d_r
        self.query = nn.Linear(C, heads, bias=config.bias)  # W^Q: x -> q^C, head_dim per head
        self.q_rope = nn.Linear(C, config.n_head * d_r, bias=config.bias)  # W^QR: x -> q^R, d_R per head
        self.kv_down = nn.Linear(C, d_c, bias=config.bias)  # W^DKV: x -> c^KV, the latent the cache keeps
        self.k_up = nn.Linear(d_c, heads, bias=config.bias)  # W^UK: c^KV -> k^C, head_dim per head
        self.v_up = nn.Linear(d_c, heads, bias=config.bias)  # W^UV: c^KV -> v, head_dim per head
        self.k_rope = nn.Linear(C, d_r, bias=config.bias)  # W^KR: x -> k^R, one d_R part shared by every head

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        key_mask: Tensor | None = None,
        window: int | None = None,
        cache: LayerCache | None = None,
        start: int = 0,
        alibi: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, C) at positions start..; key_mask (B, Tk), True for real keys (False: left padding), or a whole
        (B|1, 1, T, Tk) mask (sink tokens); alibi (nh, T, Tk) the score bias of pos_embedding=alibi.

        With a cache, the new keys are stored and the queries attend to what it returns (key_mask covers those).
        """
        B, T, C = x.shape
        if self.latent is not None:  # k, v already cover every cached token
            q, k, v = self.latent_qkv(x, rope, cache, start)  # (B, nh, T, hs + d_R), (B, nh, Tk, hs + d_R), (.., hs)
        else:
            kv_dim = self.n_kv_head * self.head_dim
            q, k, v = self.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
            # (B, T, heads * head_dim) -> (B, heads, T, head_dim)
            q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
            v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
            q, k = self.norm_and_rotate(q, self.q_norm, rope), self.norm_and_rotate(k, self.k_norm, rope)
            if cache is not None and self.linear is None:
                k, v = cache.update(k, v, start)  # (B, Hkv, Tk, D): the prompt's own keys, or every cached one
        if self.linear is not None:  # no kernel and no keys kept: a running state (gpt.attention.linear)
            y = self.linear_attention(q, k, v, cache, key_mask)  # (B, nh, T, hs)
        else:
            mask = key_mask if key_mask is None or key_mask.dim() == 4 else key_mask[:, None, None, :]
            dropout_p = self.dropout if self.training else 0.0
            variants = self.score_variants(alibi)  # soft-cap, ALiBi bias, sink: only those in use
            kwargs = dict(causal=True, mask=mask, window=window, dropout_p=dropout_p, **variants)
            if self.latent is not None:  # the kernel's default too (q's width), said outright: the paper's scale
                kwargs["scale"] = 1.0 / math.sqrt(self.head_dim + self.rope_dim)
            y = self.kernel(q, k, v, **kwargs) if self.lambda_init is None else self.differential(q, k, v, kwargs)
        # y: (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))

    def latent_qkv(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, cache: LatentKV | None,
                   start: int) -> tuple[Tensor, Tensor, Tensor]:
        """MLA: q = [q^C, RoPE(q^R)] per head; k = [W^UK c^KV, RoPE(k^R)] with k^R shared by the heads; v = W^UV c^KV.

        The cache keeps c^KV and the rotated k^R of each token and returns those of every token the queries see.
        x (B, T, C); rope: the angles of d_R features. Returns q (B, nh, T, hs + d_R), k (B, nh, Tk, hs + d_R),
        v (B, nh, Tk, hs).
        """
        B, T, _ = x.shape
        nh, hs, d_r = self.n_head, self.head_dim, self.rope_dim
        assert rope is not None  # GPT.forward computes MLA's angles
        q_content = self.query(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        q_rotary = apply_rope(self.q_rope(x).view(B, T, nh, d_r).transpose(1, 2), *rope)  # (B, nh, T, d_R)
        latent = self.kv_down(x)  # (B, T, d_c)
        k_rotary = apply_rope(self.k_rope(x)[:, None], *rope)[:, 0]  # (B, T, d_R): one for all heads
        if cache is not None:
            latent, k_rotary = cache.update(latent, k_rotary, start)  # (B, Tk, d_c), (B, Tk, d_R)
        Tk = latent.size(1)
        k_content = self.k_up(latent).view(B, Tk, nh, hs).transpose(1, 2)  # (B, nh, Tk, hs)
        v = self.v_up(latent).view(B, Tk, nh, hs).transpose(1, 2)  # (B, nh, Tk, hs)
        q = torch.cat([q_content, q_rotary], dim=-1)  # (B, nh, T, hs + d_R)
        k = torch.cat([k_content, k_rotary[:, None].expand(B, nh, Tk, d_r)], dim=-1)  # (B, nh, Tk, hs + d_R)
        return q, k, v

    def norm_and_rotate(self, x: Tensor, norm: nn.RMSNorm | None, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        """QK-norm (every head's q or k to unit RMS, times a gain), then RoPE; with diff_attn on each half of the
        head's features by itself (each half is a query or key of its own). x: (B, heads, T, hs)."""
        parts = x.chunk(2, dim=-1) if self.lambda_init is not None else (x,)  # (B, heads, T, hs or hs/2) each
        out = []
        for part in parts:
            if norm is not None:
                part = norm(part)
            if rope is not None:
                part = apply_rope(part, *rope)
            out.append(part)
        return out[0] if len(out) == 1 else torch.cat(out, dim=-1)

    def differential(self, q: Tensor, k: Tensor, v: Tensor, kwargs: dict) -> Tensor:
        """Diff Transformer: softmax(q1 k1^T s) v - lambda softmax(q2 k2^T s) v, s = 1/sqrt(hs/2), each map through the
        kernel; then RMS-normalised per head, times 1 - lambda_init. q (B, nh, T, hs); k, v (B, nkv, Tk, hs)."""
        (q1, q2), (k1, k2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)  # (B, heads, T, hs/2) each
        a1 = self.kernel(q1, k1, v, **kwargs)  # (B, nh, T, hs): the values keep their full width
        a2 = self.kernel(q2, k2, v, **kwargs)
        y = a1 - self.diff_lambda().to(a1.dtype) * a2
        return self.subln(y) * (1.0 - self.lambda_init)

    def diff_lambda(self) -> Tensor:
        """diff_attn's lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init: a scalar per layer."""
        return (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
                - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)

    def linear_attention(self, q: Tensor, k: Tensor, v: Tensor, cache: LinearState | None,
                         key_mask: Tensor | None) -> Tensor:
        """Causal linear attention over these T tokens, after the running state the cache holds (which it updates).
        q (B, nh, T, hs); k, v (B, nkv, T, hs); key_mask (B, >= T), its last T columns for these tokens."""
        mask = None if key_mask is None else key_mask[:, -q.size(2):]  # (B, T): earlier keys are in the state
        y, state = self.linear_kernel(q, k, v, self.linear, cache.state if cache is not None else None, mask)
        if cache is not None:
            cache.state = state
        return y

    def score_variants(self, alibi: Tensor | None) -> dict[str, Tensor | float]:
        """The kernel keywords of the score variants in use: none for GPT-2, so any kernel can run it."""
        variants: dict[str, Tensor | float] = {}
        if self.softcap is not None:
            variants["softcap"] = self.softcap
        if alibi is not None:
            variants["bias"] = alibi
        if self.sink is not None:
            variants["sink"] = self.sink
        return variants


class MLP(nn.Module):
    """Position-wise feed-forward: expand 4x, the activation (GPT-2's tanh GELU by default), project back."""

    ACTIVATIONS = {"gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "gelu": F.gelu,
                   "relu2": lambda h: F.relu(h).square()}  # model.activation

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.act = self.ACTIVATIONS[config.activation]
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """One transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        key_mask: Tensor | None = None,
        window: int | None = None,
        cache: LayerCache | None = None,
        start: int = 0,
        alibi: Tensor | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), rope, key_mask, window, cache, start, alibi)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """A decoder-only transformer language model with GPT-2's architecture and parameter names."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(config.vocab_size, config.n_embd)))
        if config.pos_embedding == "learned":  # with rope (q and k) or alibi (scores) positions enter elsewhere
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.transformer.drop = nn.Dropout(config.dropout)
        self.transformer.h = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.transformer.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_head:
            self.lm_head.weight = self.transformer.wte.weight  # weight tying, as GPT-2

        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) so the residual stream's variance does not
        # grow with depth (two residual additions per block); model.zero_init_proj: std 0, zeros (same draws)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                std = 0.0 if config.zero_init_proj else 0.02 / math.sqrt(2 * config.n_layer)
                nn.init.normal_(param, mean=0.0, std=std)

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

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        key_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """idx: (B, T) token ids. Returns logits (B, T, vocab) and the mean cross-entropy if targets given.

        For generation: positions (T,) or (B, T) (default: the next T after what the cache holds),
        key_mask (B, T) marking real tokens of left-padded rows, and a KVCache to fill and reuse.
        """
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if positions is None:
            if start + T > self.config.block_size:
                raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
            positions = torch.arange(start, start + T, device=idx.device)
        x = self.transformer.wte(idx)
        rope = alibi = None
        if self.config.pos_embedding == "learned":
            x = x + self.transformer.wpe(positions)
        if self.config.rope_dim is not None:  # pos_embedding=rope, or MLA's decoupled part
            cos, sin = rope_angles(positions, self.config.rope_dim)  # computed once, used by every layer
            rope = (cos, sin) if positions.dim() == 1 else (cos[:, None], sin[:, None])  # (B, 1, T, D/2)
        window = self.config.window
        if cache is not None:  # the cache's bookkeeping, once for all layers: which keys are real, what window
            key_mask, window = cache.step(T, key_mask)
        if window is not None and self.config.sink_tokens:  # StreamingLLM: the window's band plus the first tokens
            key_mask, window = sink_band(T, window, self.config.sink_tokens, key_mask, idx.device), None  # (B|1,1,T,T)
        if self.config.pos_embedding == "alibi":  # distances in the sequence (left padding is masked anyway)
            keys = cache.key_index(T) if cache is not None else torch.arange(T, device=idx.device)  # (Tk,)
            alibi = alibi_bias(self.config.n_head, torch.arange(start, start + T, device=idx.device), keys)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rope, key_mask, window, cache.layers[i] if cache is not None else None, start, alibi)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss
