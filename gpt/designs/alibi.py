"""ALiBi (Press, Smith and Lewis, 2022, "Train Short, Test Long"): no position embedding; instead each head h adds
-m_h * (i - j) to the score of query i for key j, a linear penalty on distance with a fixed slope per head.

Slopes form a geometric sequence: for n heads (a power of two) m_h = 2^(-8 (h + 1) / n); for other counts the
paper takes the sequence of the next lower power of two and fills up with every other slope of twice that.
The bias reaches the kernel as its ``bias`` keyword (a kernel option), built once per forward pass.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpt.model.design import Design, modeling_file, register


def alibi_slopes(n_head: int) -> Tensor:
    """(n_head,) the fixed slope of each head, steepest first (float32)."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    lower = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(lower) + geometric(2 * lower)[0::2][: n_head - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_head: int, q_index: Tensor, k_index: Tensor) -> Tensor:
    """(n_head, Tq, Tk) score bias -m_h * (i - j) for queries at sequence indices q_index (Tq,), keys at k_index (Tk,).

    Keys after the query get a positive bias, but the causal mask removes them.
    """
    distance = (q_index[:, None] - k_index[None, :]).to(torch.float32)  # (Tq, Tk)
    return -alibi_slopes(n_head).to(q_index.device)[:, None, None] * distance


class Alibi(Design):
    name = "alibi"
    modeling = modeling_file("alibi")
    about = "a linear distance penalty per head added to the scores, instead of the learned position table"
    paper = "Press, Smith and Lewis 2022, Train Short, Test Long"
    positional = True
    kernel_options = ("bias",)
    cases = {"alone": {"designs": ["alibi"]}, "window+mqa": {"designs": ["alibi"], "window": 5, "n_kv_head": 1},
             "with every score part": {"designs": ["alibi", "qk_norm", "softcap", "sink"], "n_kv_head": 2,
                                       "design_options": {"softcap": {"cap": 3.0}}}}

    def flops(self, config, seq, flops) -> int:
        """A bias added to the scores is elementwise: the layer's count unchanged."""
        return flops

    def context(self, ctx, config) -> None:
        keys = ctx.index if ctx.cache is None else ctx.cache.key_index(ctx)  # (Tk,) the keys' indices, in order
        ctx.extras["alibi"] = alibi_bias(config.n_head, ctx.index, keys)  # distances in the sequence

    def scores(self, layer, ctx):
        return {"bias": ctx.extras["alibi"]}

    def ref_score(self, layer, s, i, keys, head):
        slope = float(alibi_slopes(layer.n_head)[head])
        return s - slope * torch.tensor([i - j for j in keys], dtype=torch.float64)


register(Alibi())
