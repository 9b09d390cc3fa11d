"""The gated delta rule of Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv:2412.06464), in plain torch: a
linear-attention layer whose fixed-size state is edited, not summed into, so a decoder keeps (Dk x Dv) numbers per
head whatever the context length.

Convention (the paper's, transposed to the layout of transformers' Qwen3-Next and flash-linear-attention): the state
S of a value head is (Dk, Dv), keys index its rows; per token t, with alpha_t = exp(g_t) in (0, 1] and beta_t in (0, 1),

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,      o_t = S_t^T (scale * q_t)

(the paper writes S_t = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T with S (Dv, Dk): the same state,
transposed). The output reads the state *after* token t's own write. Equivalently the delta form the recurrent step
uses: S' = alpha_t S_{t-1}; S_t = S' + k_t (beta_t (v_t - S'^T k_t))^T: the value S' stores under k_t is moved a
fraction beta_t of the way to v_t.

Where q and k are L2-normalised: inside every function here (``l2norm``, flash-linear-attention's form, eps 1e-6), in
the working precision, so ||k_t|| = 1 and I - beta_t k_t k_t^T never grows the state whatever the caller passes; the
caller passes raw projections (after its short convolution and activation). q is then scaled by ``scale`` (default
Dk^-1/2, as transformers and flash-linear-attention do). The gates are the caller's: g <= 0 and beta in (0, 1), as
Gated DeltaNet's -softplus and sigmoid make them, unchecked here (a check would stall a GPU). Inputs are (B, H, T, D)
like the rest of gpt/designs; q and k may have fewer heads than v (Hk dividing Hv: value head h reads key head
h // (Hv // Hk), Qwen3-Next's grouping).

Three forms, held to each other by tests/designs/test_delta_rule.py: ``reference`` (float64, token by token, the
explicit matrix product: the truth), ``recurrent_step`` (one token, for decoding) and ``chunked`` (the WY/UT form
within chunks of ``chunk`` tokens and the recurrence across them, for training and prefill). The last two compute in
float32 at least (float64 stays float64), return outputs in the inputs' dtype and the state in the working dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt.errors import ConfigError

EPS = 1e-6  # l2norm's: x / sqrt(|x|^2 + eps), flash-linear-attention's and transformers' form


def l2norm(x: Tensor) -> Tensor:
    """x over its last dimension scaled to unit length (a zero vector stays zero)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS)


def check_chunk(chunk: object, setting: str = "chunk") -> int:
    """``chunk`` if it is a positive power of two (what the chunked form tiles by); else a ConfigError naming
    ``setting`` (the caller's name for it, e.g. a config field)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1 or chunk & (chunk - 1):
        raise ConfigError(f"{setting} must be a positive power of two (the Gated DeltaNet chunk size), got {chunk!r}",
                          hint=f"{setting}=64")
    return chunk


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> int:
    """Refuse inputs whose shapes disagree; returns Hv // Hk, the value heads per key head."""
    if q.dim() != 4 or q.shape != k.shape or v.dim() != 4 or v.shape[::2] != q.shape[:3:2]:
        raise ValueError(f"delta rule: q {tuple(q.shape)} and k {tuple(k.shape)} must be one (B, Hk, T, Dk) shape "
                         f"and v {tuple(v.shape)} a (B, Hv, T, Dv) one with their B and T")
    if v.size(1) % q.size(1) or g.shape != v.shape[:-1] or beta.shape != v.shape[:-1]:
        raise ValueError(f"delta rule: v's heads ({v.size(1)}) must be a multiple of q's ({q.size(1)}); g "
                         f"{tuple(g.shape)} and beta {tuple(beta.shape)} must be v's {tuple(v.shape[:-1])}")
    return v.size(1) // q.size(1)


def _working(*tensors: Tensor) -> list[Tensor]:
    """The tensors in the working precision: float32 at least (bf16/fp16 up, float64 kept)."""
    dtype = torch.promote_types(tensors[0].dtype, torch.float32)
    return [t.to(dtype) for t in tensors]


def _prepared(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float | None) -> list[Tensor]:
    """q, k, v, g, beta in the working precision, q and k L2-normalised, q scaled, both repeated to v's heads."""
    group = _check_shapes(q, k, v, g, beta)
    q, k, v, g, beta = _working(q, k, v, g, beta)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    q, k = l2norm(q) * scale, l2norm(k)
    if group > 1:
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    return [q, k, v, g, beta]


def recurrent_step(state: Tensor | None, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                   scale: float | None = None) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule, for decoding: q, k (B, Hk, Dk), v (B, Hv, Dv), g = log alpha and beta
    (B, Hv), state (B, Hv, Dk, Dv) or None (no earlier tokens). Returns o (B, Hv, Dv) and the new state. Constant
    work per token: the state's size, never the context's."""
    dtype = v.dtype
    q, k, v, g, beta = _prepared(q[:, :, None], k[:, :, None], v[:, :, None], g[:, :, None], beta[:, :, None], scale)
    q, k, v, g, beta = q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0]  # (B, Hv, D), (B, Hv)
    if state is None:
        state = v.new_zeros(v.shape[:2] + (k.size(-1), v.size(-1)))
    state = state.to(v.dtype) * g.exp()[..., None, None]  # S' = alpha S: (B, Hv, Dk, Dv)
    stored = (k.unsqueeze(-2) @ state).squeeze(-2)  # S'^T k, the value S' holds under k: (B, Hv, Dv)
    state = state + k.unsqueeze(-1) * (beta.unsqueeze(-1) * (v - stored)).unsqueeze(-2)  # + k (beta (v - S'^T k))^T
    out = (q.unsqueeze(-2) @ state).squeeze(-2)  # S^T q: (B, Hv, Dv)
    return out.to(dtype), state


def _log_decay(g: Tensor) -> tuple[Tensor, Tensor]:
    """G = cumsum(g) over each chunk (B, H, N, C), summed in float64 and returned as two working-precision parts:
    G, and what rounding G lost. Strong gates make |G| large (-20 a token over 64 tokens: -1280, whose float32 ulp is
    1e-4) while G_i - G_j, the exponent that matters, stays small: the parts' differences keep it to its own
    precision, not G's (on the tests' inputs, the chunked form's float32 error: 1.3e-5 without, 3.3e-7 with)."""
    total = g.double().cumsum(-1)
    G = total.to(g.dtype)
    return G, (total - G).to(g.dtype)


def _chunk_terms(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, ...]:
    """What each chunk needs beyond its initial state, all chunks at once. Inputs (B, H, N, C, D) and (B, H, N, C).

    Within a chunk with G_i = g_1 + ... + g_i, the writes u_i = beta_i (v_i - alpha_i S_{i-1}^T k_i) make
    S_i = e^{G_i} S_0 + sum_{j<=i} e^{G_i - G_j} k_j u_j^T, so (I + A) U = beta V - (beta e^G K) S_0 with A strictly
    lower triangular, A_ij = beta_i e^{G_i - G_j} k_i.k_j. One triangular solve (the UT transform) gives
    U = values - W S_0. Returns values, W, the decayed causal scores q_i.k_j e^{G_i - G_j} (j <= i), q_i e^{G_i}
    (reads S_0), k_j e^{G_C - G_j} (writes the next state) and e^{G_C}, the chunk's whole decay."""
    C = q.size(-2)
    G, rest = _log_decay(g)  # (B, H, N, C): log of the decay from the chunk's start to token i, and its rounding
    later = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)  # j > i
    gaps = (G.unsqueeze(-1) - G.unsqueeze(-2)) + (rest.unsqueeze(-1) - rest.unsqueeze(-2))  # G_i - G_j: (.., C, C)
    decay = gaps.masked_fill(later, float("-inf")).exp()  # e^{G_i - G_j}, zero above the diagonal
    system = ((beta.unsqueeze(-1) * k) @ k.transpose(-1, -2) * decay).tril(-1)  # A: (B, H, N, C, C)
    system = system + torch.eye(C, dtype=q.dtype, device=q.device)  # I + A, unit lower triangular
    rhs = torch.cat([beta.unsqueeze(-1) * v, (beta * G.exp()).unsqueeze(-1) * k], dim=-1)  # [beta V | beta e^G K]
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    values, W = solved.split([v.size(-1), k.size(-1)], dim=-1)  # (.., C, Dv), (.., C, Dk)
    scores = q @ k.transpose(-1, -2) * decay  # (B, H, N, C, C), zero above the diagonal
    reads = q * G.exp().unsqueeze(-1)  # (B, H, N, C, Dk)
    writes = k * gaps[..., -1, :].exp().unsqueeze(-1)  # (B, H, N, C, Dk)
    return values, W, scores, reads, writes, G[..., -1].exp()


def chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int = 64,
            initial_state: Tensor | None = None, scale: float | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule over T tokens in parallel form, for training and prefill: q, k (B, Hk, T, Dk), v (B, Hv,
    T, Dv), g = log alpha (<= 0) and beta in (0, 1) (B, Hv, T), initial_state (B, Hv, Dk, Dv) or None. Any T: the last
    chunk is padded with tokens that change nothing (alpha 1, beta 0, k 0). Returns o (B, Hv, T, Dv) and the state
    after the T tokens, which ``recurrent_step`` or another ``chunked`` call continues from."""
    C = check_chunk(chunk)
    dtype = v.dtype
    q, k, v, g, beta = _prepared(q, k, v, g, beta, scale)
    B, H, T, Dv = v.shape
    pad = -T % C
    q, k, v = (F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, C)) for x in (q, k, v))  # (B, H, N, C, D)
    g, beta = (F.pad(x, (0, pad)).unflatten(2, (-1, C)) for x in (g, beta))  # (B, H, N, C)
    values, W, scores, reads, writes, whole = _chunk_terms(q, k, v, g, beta)
    state = v.new_zeros(B, H, k.size(-1), Dv) if initial_state is None else initial_state.to(v.dtype)
    outs = []
    for n in range(q.size(2)):  # the recurrence across chunks: (B, H, Dk, Dv) carried
        u = values[:, :, n] - W[:, :, n] @ state  # this chunk's writes U: (B, H, C, Dv)
        outs.append(reads[:, :, n] @ state + scores[:, :, n] @ u)  # (B, H, C, Dv)
        state = whole[:, :, n, None, None] * state + writes[:, :, n].transpose(-1, -2) @ u
    out = torch.cat(outs, dim=2)[:, :, :T] if outs else v.new_zeros(B, H, 0, Dv)  # (B, H, T, Dv)
    return out.to(dtype), state


def reference(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None = None,
              scale: float | None = None) -> tuple[Tensor, Tensor]:
    """The truth, slow on purpose: float64, one token, batch row and value head at a time, the paper's update as an
    explicit matrix product, S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T and o_t = S_t^T scale q_t.
    Same arguments and layout as ``chunked``; returns float64 o (B, Hv, T, Dv) and state (B, Hv, Dk, Dv)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, Hv, T, Dv = v.shape
    Dk, group = k.size(-1), Hv // k.size(1)
    scale = Dk ** -0.5 if scale is None else scale
    eye = torch.eye(Dk, dtype=torch.float64, device=v.device)
    empty = torch.zeros(B, Hv, Dk, Dv, dtype=torch.float64, device=v.device)
    initial_state = empty if initial_state is None else initial_state.double()
    outs, finals = [], []
    for b in range(B):
        for h in range(Hv):
            S = initial_state[b, h]
            for t in range(T):
                qt, kt = q[b, h // group, t], k[b, h // group, t]
                qt = qt / torch.sqrt(qt @ qt + EPS) * scale
                kt = kt / torch.sqrt(kt @ kt + EPS)
                alpha, bt = torch.exp(g[b, h, t]), beta[b, h, t]
                S = alpha * (eye - bt * torch.outer(kt, kt)) @ S + bt * torch.outer(kt, v[b, h, t])
                outs.append(S.T @ qt)
            finals.append(S)
    return torch.stack(outs).reshape(B, Hv, T, Dv), torch.stack(finals).reshape(B, Hv, Dk, Dv)


def weights(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, scale: float | None = None) -> Tensor:
    """The weight the gated delta rule gives each value, from an empty state: o_i = sum_{j<=i} M_ij v_j, so
    M = (decayed causal scores) (I + A)^-1 diag(beta) (see _chunk_terms), (B, Hv, T, T), lower triangular; entries
    may be negative (a later write under a similar key takes back an earlier value). For pictures."""
    dummy = g.new_zeros(g.shape + (1,))
    q, k, _, g, beta = _prepared(q, k, dummy, g, beta, scale)
    T = q.size(-2)
    G, rest = _log_decay(g)
    later = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    gaps = (G.unsqueeze(-1) - G.unsqueeze(-2)) + (rest.unsqueeze(-1) - rest.unsqueeze(-2))
    decay = gaps.masked_fill(later, float("-inf")).exp()
    system = ((beta.unsqueeze(-1) * k) @ k.transpose(-1, -2) * decay).tril(-1)
    system = system + torch.eye(T, dtype=q.dtype, device=q.device)
    writes = torch.linalg.solve_triangular(system, torch.diag_embed(beta), upper=False, unitriangular=True)
    return ((q @ k.transpose(-1, -2) * decay) @ writes).tril()
