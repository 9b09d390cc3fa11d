"""Analytic training FLOPs per token of a GPT: the budget currency of ``arena.flops`` (equal compute per design).

What is counted is what ``torch.utils.flop_counter.FlopCounterMode`` counts: matrix products (2 m n k each: the
projections, the head, q k^T and weights @ v), not elementwise work (norms, activations, softmax, RoPE, masks,
the loss). Attention is counted dense, over every one of the ``seq`` keys of a query, as the manual kernel computes
it and as FlopCounterMode's formula for SDPA counts it: a causal mask or a window skips nothing in this count.
A product's backward is two products of the same size (the input's and the weight's gradients), so a product
that the loss depends on costs 3 x its forward. Each attention design declares its layer's count beside its code
(``Design.flops``); tests/designs/test_designs.py holds every registered design to FlopCounterMode within 2%.
"""

from __future__ import annotations

from typing import Any

from gpt.errors import ConfigError
from gpt.model import design as designs

TRAIN = 3  # forward + backward of a matrix product: 1 + 2 times its forward FLOPs


def matmul(m_by_k: int, n: int) -> int:
    """Forward FLOPs of one token through a (k x n) product: 2 k n (a multiply and an add per weight)."""
    return 2 * m_by_k * n


def core_attention(config: Any, seq: int) -> int:
    """Training FLOPs per token of the core's attention layer: c_attn, q k^T and weights @ v over ``seq`` keys
    (grouped key/value heads are expanded to every query head, as the kernels compute them), c_proj."""
    C, H, Hkv, D = config.n_embd, config.n_head, config.n_kv_head, config.head_dim
    projections = matmul(C, (H + 2 * Hkv) * D) + matmul(C, C)
    scores_and_values = 2 * H * matmul(seq, D)  # q k^T: D per key; weights @ v: D per key; H heads each
    return TRAIN * (projections + scores_and_values)


def attention_layer(config: Any, seq: int) -> int:
    """Training FLOPs per token of one attention layer with every active design: each design, in hook order, turns
    the count before it into its own (a part that adds only elementwise work returns it unchanged)."""
    flops = core_attention(config, seq)
    for design in designs.active(config):
        declared = design.flops(config, seq, flops)
        if declared is None:
            raise ConfigError(f"attention design {design.name!r} declares no FLOPs count, so arena.flops cannot give "
                              "it an equal budget",
                              hint=f"add flops(self, config, seq, flops) to {type(design).__name__} (docs/designs.md"
                                   "), or budget by tokens: arena.tokens=<n> without arena.flops")
        flops = int(declared)
    return flops


def per_token(config: Any, seq: int | None = None) -> int:
    """Training FLOPs (forward and backward) per token of a ``seq``-token sequence (default: block_size): every
    layer's attention and MLP, and the output head; embeddings are lookups (no FLOPs)."""
    seq = config.block_size if seq is None else seq
    mlp = TRAIN * (matmul(config.n_embd, 4 * config.n_embd) + matmul(4 * config.n_embd, config.n_embd))
    mlp = mlp if getattr(config, "mlp", True) else 0  # model.mlp=false: attention only
    head = TRAIN * matmul(config.n_embd, config.vocab_size)
    kinds = {name: attention_layer(kind, seq) for name, kind in config.kinds().items()}  # a layout's kinds differ
    return sum(kinds[config.kind_of(i)] + mlp for i in range(config.n_layer)) + head
