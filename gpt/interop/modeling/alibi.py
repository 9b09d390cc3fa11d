"""ALiBi's part of a remote-code export (gpt/designs/alibi.py): score bias -m_h * (i - j), a fixed slope per head."""

import math

import torch


def alibi_slopes(n_head):
    """(n_head,) slopes, steepest first: 2^(-8 (h + 1) / n), filled up from twice the next lower power of two."""

    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    lower = 2 ** math.floor(math.log2(n_head))
    return torch.tensor(geometric(lower) + geometric(2 * lower)[0::2][: n_head - lower], dtype=torch.float32)


class Part:
    positional = True  # no learned position table

    def context(self, ctx, mc):
        distance = (ctx.index[:, None] - ctx.index[None, :]).to(torch.float32)  # (T, T)
        ctx.extras["alibi"] = -alibi_slopes(mc["n_head"]).to(ctx.index.device)[:, None, None] * distance

    def scores(self, layer, s, ctx):
        return s + ctx.extras["alibi"]
