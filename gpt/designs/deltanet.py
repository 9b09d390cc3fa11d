"""Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
arXiv:2412.06464) as an attention layer, laid out as Qwen3-Next's linear-attention layers are: a fixed-size state per
head, edited by the gated delta rule (gpt/designs/delta_rule.py), instead of keys and values kept per token.

    q, k, v = silu(causal depthwise conv_K(c_attn(x)))     q, k: n_kv_head heads; v: n_head heads; head_dim each
    g = -exp(A_log) softplus(c_decay(x) + dt_bias)          log alpha per value head and token (Mamba-2's decay)
    beta = sigmoid(c_beta(x))                               the write strength per value head and token
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,  o_t = S_t^T q_t / sqrt(D)  (q, k L2-normalised)
    y = c_proj(RMSNorm(o) * silu(c_gate(x)))                per-head RMSNorm with gains, then an output gate

Choices, each Qwen3-Next's (and flash-linear-attention's GatedDeltaNet's): the short convolution (kernel
model.design_options.deltanet.conv, 4) on q, k and v, so a decoder keeps its last K-1 inputs beside the state; the
output gate and per-head RMSNorm. Value heads are the model's n_head, key heads its n_kv_head (fewer: Qwen3-Next's
grouping, the value heads of a group share a key head); both head_dim wide, so the output fills c_proj as attention's
does. Training and prefill run the chunked form (chunks of model.design_options.deltanet.chunk tokens, fewer for a
shorter sequence), decoding the recurrent step: its work per token is the state's size whatever the context. The
model keeps its position table (learned positions): the layer needs none, RoPE and ALiBi do not apply to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt.designs import delta_rule, reference
from gpt.errors import ConfigError
from gpt.model import CausalSelfAttention
from gpt.model.design import Design, modeling_file, register
from gpt.model.flops import TRAIN, matmul

OPTIONS = {"chunk": 64, "conv": 4}  # model.design_options.deltanet: chunk length, convolution kernel size


class DeltaState:
    """One layer's decoding state: the delta rule's S (B, H, D, D) in float32 at least, and the convolution's last
    K-1 inputs (B, channels, K-1); fixed size, whatever the context."""

    def __init__(self, config, cache) -> None:
        self.tokens = cache.size  # what its fixed bytes stand for: a full context
        self.state: Tensor | None = None
        self.conv: Tensor | None = None

    @classmethod
    def bytes_per_token(cls, config, number_bytes: int) -> float:
        """The fixed state spread over a full context (block_size tokens): S in the working precision (float32 at
        least), the convolution's inputs in the model's."""
        d = config.head_dim
        state = config.n_head * d * d * max(number_bytes, 4)
        conv = channels(config) * (config.design_options["deltanet"]["conv"] - 1) * number_bytes
        return (state + conv) / config.block_size

    def update(self, k: Tensor, v: Tensor, ctx) -> tuple[Tensor, Tensor]:
        """Nothing per token: the layer folds its tokens into the state (DeltaNetAttention.forward)."""
        return k, v

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.state, self.conv) if t is not None)


def channels(config) -> int:
    """c_attn's outputs, which the convolution mixes: q and k (n_kv_head heads each), v (n_head heads)."""
    return (2 * config.n_kv_head + config.n_head) * config.head_dim


class DeltaNetAttention(CausalSelfAttention):
    """The projections, the short convolution, the gated delta rule (chunked, or one recurrent step), the norm and
    output gate, c_proj. Replaces the core's forward: it reads the layer input for its gates."""

    def __init__(self, config, layer: int = 0) -> None:
        super().__init__(config, layer)
        self.chunk = config.design_options["deltanet"]["chunk"]

    def add_projections(self, config) -> None:
        C, H, D, width = config.n_embd, config.n_head, config.head_dim, channels(config)
        self.c_attn = nn.Linear(C, width, bias=config.bias)  # q, k, v
        self.conv = nn.Conv1d(width, width, config.design_options["deltanet"]["conv"], groups=width, bias=False)
        self.c_gate = nn.Linear(C, C, bias=config.bias)  # z: the output gate, per value feature
        self.c_beta = nn.Linear(C, H, bias=config.bias)  # b: the write strength per value head
        self.c_decay = nn.Linear(C, H, bias=config.bias)  # a: the decay's input per value head
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log())  # Mamba-2's A range
        self.dt_bias = nn.Parameter(torch.ones(H))  # Qwen3-Next's initial value
        self.o_norm = nn.RMSNorm(D, eps=1e-6)  # per head, gains shared by the heads

    def convolve(self, mixed: Tensor, earlier: Tensor | None) -> tuple[Tensor, Tensor]:
        """silu of the causal depthwise convolution of mixed (B, T, channels), after the K-1 inputs ``earlier``
        (B, channels, K-1; None: zeros, the sequence's start). Returns the output and the last K-1 inputs. Written
        as K multiply-adds, which it is (F.conv1d's backward counts a grouped convolution as a dense one)."""
        B, T, width = mixed.shape
        K = self.conv.kernel_size[0]
        if earlier is None:
            earlier = mixed.new_zeros(B, width, K - 1)
        inputs = torch.cat([earlier.to(mixed.dtype), mixed.transpose(1, 2)], dim=-1)  # (B, channels, K-1 + T)
        weight = self.conv.weight[:, 0]  # (channels, K): weight[:, K-1] multiplies the current token
        out = sum(weight[:, s, None] * inputs[..., s:s + T] for s in range(K))  # elementwise, channel by channel
        return F.silu(out).transpose(1, 2), inputs[..., inputs.size(-1) - (K - 1):].contiguous()  # one layout

    def gates(self, x: Tensor, token_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """g = log alpha <= 0 and beta in (0, 1), (B, H, T); a padding token neither decays nor writes."""
        dtype = torch.promote_types(x.dtype, torch.float32)  # float32 at least, as the delta rule computes
        g = -self.A_log.to(dtype).exp() * F.softplus(self.c_decay(x).to(dtype) + self.dt_bias.to(dtype))
        beta = torch.sigmoid(self.c_beta(x).to(dtype))
        if token_mask is not None:
            g, beta = g * token_mask[..., None], beta * token_mask[..., None]
        return g.transpose(1, 2), beta.transpose(1, 2)

    def forward(self, x: Tensor, ctx) -> Tensor:
        """x (B, T, C) -> (B, T, C); with a cache, the state and the convolution's inputs continue from it."""
        B, T, C = x.shape
        Hk, D = self.n_kv_head, self.head_dim
        cache = ctx.layer_cache(self.layer)
        mixed = self.c_attn(x)
        if ctx.token_mask is not None:  # left padding: zeros, as before the sequence's start
            mixed = mixed * ctx.token_mask[..., None].to(mixed.dtype)
        mixed, conv = self.convolve(mixed, cache.conv if cache is not None else None)
        q, k, v = (t.unflatten(-1, (-1, D)).transpose(1, 2) for t in mixed.split([Hk * D, Hk * D, C], dim=-1))
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)  # gpt.interpret's hook points, as the core's
        g, beta = self.gates(x, ctx.token_mask)
        state = cache.state if cache is not None else None
        if T == 1:  # decoding: one recurrent step, constant work
            o, state = delta_rule.recurrent_step(state, q[:, :, 0], k[:, :, 0], v[:, :, 0], g[..., 0], beta[..., 0])
            o = o[:, :, None]
        else:
            o, state = delta_rule.chunked(q, k, v, g, beta, min(self.chunk, 1 << (T - 1).bit_length()), state)
        if cache is not None:
            cache.state, cache.conv = state, conv
        if self.recorded is not None:  # gpt.kernels.recording: the weight each value gets, these tokens' own
            self.recorded.append(delta_rule.weights(q, k, g, beta).float().detach())
        o = self.hook_z(o)  # (B, H, T, D): each head's read of its state, before the norm and the output gate
        o = self.o_norm(o.transpose(1, 2)) * F.silu(self.c_gate(x)).unflatten(-1, (-1, D))  # (B, T, H, D)
        return self.resid_dropout(self.c_proj(o.flatten(2)))


class DeltaNet(Design):
    name = "deltanet"
    modeling = modeling_file("deltanet")
    about = "Gated DeltaNet: a state per head edited by the gated delta rule; chunked to train, recurrent to decode"
    paper = "Yang, Kautz, Hatamizadeh 2024, Gated Delta Networks (arXiv:2412.06464); Qwen3-Next's layout"
    options = dict(OPTIONS)
    layer = DeltaNetAttention
    cache = DeltaState
    uses_kernel = False
    view = "the weight the delta rule gives each earlier value (decayed, overwritten; may be negative)"
    conflicts = {name: why for names, why in (
        (("rope", "alibi"), "Gated DeltaNet has no dot-product scores to give positions to; use the learned "
                            "positions (neither rope nor alibi)"),
        (("qk_norm",), "Gated DeltaNet L2-normalises its queries and keys itself"),
        (("softcap", "sink", "diff"), "Gated DeltaNet forms no softmax scores"),
        (("gated",), "Gated DeltaNet has its own output gate"),
        (("stream",), "Gated DeltaNet's state holds every earlier token, no window"))
        for name in names}
    cases = {"alone": {"designs": ["deltanet"]},
             "gqa+chunk4+conv2": {"designs": ["deltanet"], "n_kv_head": 2,
                                  "design_options": {"deltanet": {"chunk": 4, "conv": 2}}},
             "mqa+no_bias+no_conv": {"designs": ["deltanet"], "n_kv_head": 1, "bias": False,
                                     "design_options": {"deltanet": {"conv": 1}}}}

    def check(self, config) -> None:
        delta_rule.check_chunk(self.option(config, "chunk"), "model.design_options.deltanet.chunk")
        conv = self.option(config, "conv")
        if isinstance(conv, bool) or not isinstance(conv, int) or not 1 <= conv <= 16:
            raise ConfigError(f"model.design_options.deltanet.conv must be an integer from 1 to 16 (the short "
                              f"convolution's kernel size; 1: none across tokens), got {conv!r}",
                              hint="model.design_options.deltanet.conv=4 (Qwen3-Next's)")
        if config.window is not None:
            raise ConfigError(f"model.designs=[deltanet] cannot be combined with model.window={config.window}: its "
                              "state holds every earlier token", hint="unset model.window")

    def flops(self, config, seq, flops) -> int:
        """Its own layer (replaces the count): the projections and c_proj, then the chunked form over n =
        ceil(seq / c) chunks of c tokens (the last padded), per value head and chunk: k k^T and q k^T (c^2 D each),
        the writes' correction W S and the reads q S (c D^2 each), the scores times the writes (c^2 D), the state's
        update (c D^2), each 3 x in training; the triangular solve's backward adds one product (c^2 2D); the
        first chunk's state (zeros) needs no gradient (W S and q S: one product less each) and the last update
        none at all (the loss reads the outputs). The convolution, gates and norm are elementwise."""
        C, H, D = config.n_embd, config.n_head, config.head_dim
        c = min(config.design_options["deltanet"]["chunk"], 1 << (seq - 1).bit_length())
        n = -(-seq // c)
        projections = matmul(C, channels(config)) + 2 * matmul(C, H) + 2 * matmul(C, C)
        rule = n * (TRAIN * (3 * matmul(c * c, D) + 3 * matmul(c * D, D)) + matmul(c * c, 2 * D))
        return TRAIN * projections + H * (rule - 4 * matmul(c * D, D)) // seq

    def activations(self, config, batch, seq, act, fused) -> int:
        """Beyond the core's count, per token of the padded chunks: five (c x c) maps per value head that the
        chunked form keeps in float32 at least (the decay, k k^T, I + A, q k^T, the decayed scores), four
        convolution-wide tensors (its inputs, silu's input and output, the normalised q and k) and eight C-wide
        ones (the delta rule's v, writes, reads and outputs, the norm's and gate's); fitted to saved-tensor
        measurements in float32 (within 12% of this layer's bytes over ten shapes)."""
        c = min(config.design_options["deltanet"]["chunk"], 1 << (seq - 1).bit_length())
        tokens = batch * -(-seq // c) * c
        working = max(act, 4)
        return tokens * (working * 5 * c * config.n_head + act * 4 * channels(config) + working * 8 * config.n_embd)

    def reference(self, attn, x, config) -> Tensor:
        """The layer in float64, token by token: the convolution written out, the gates, the delta rule's float64
        reference (gpt.designs.delta_rule.reference), the per-head RMS norm and gate, c_proj."""
        B, T, C = x.shape
        D, Hk = config.head_dim, config.n_kv_head
        mixed = reference.project(attn.c_attn, x)  # (B, T, channels)
        w = attn.conv.weight.double()[:, 0]  # (channels, K): w[:, K-1] multiplies the current token
        K = w.size(1)
        conv = torch.stack([sum(w[:, K - 1 - s] * mixed[:, t - s] for s in range(min(K, t + 1)))
                            for t in range(T)], dim=1)
        mixed = conv * torch.sigmoid(conv)
        q, k, v = (t.unflatten(-1, (-1, D)).transpose(1, 2) for t in mixed.split([Hk * D, Hk * D, C], dim=-1))
        softplus = torch.log1p(torch.exp(reference.project(attn.c_decay, x) + attn.dt_bias.double()))
        g = (-torch.exp(attn.A_log.double()) * softplus).transpose(1, 2)
        beta = torch.sigmoid(reference.project(attn.c_beta, x)).transpose(1, 2)
        o = delta_rule.reference(q, k, v, g, beta)[0].transpose(1, 2)  # (B, T, H, D)
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + 1e-6) * attn.o_norm.weight.double()
        z = reference.project(attn.c_gate, x).unflatten(-1, (-1, D))
        return reference.output(attn, config, x, o * z * torch.sigmoid(z))


register(DeltaNet())
