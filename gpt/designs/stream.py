"""StreamingLLM's attention sinks (Xiao et al. 2023): with a sliding window, every query also sees the first N
tokens, whose keys the KV cache keeps apart from its ring. A runtime choice like the window (no weights): a model
trained with a window may sample with sink tokens or without. One mask, so any kernel computes it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.errors import ConfigError, UserError
from gpt.kernels.masks import causal_mask
from gpt.model.design import Design, modeling_file, register
from gpt.model.kv_cache import LayerKV


def sink_band(t: int, window: int, sinks: int, key_mask: Tensor | None, device: torch.device) -> Tensor:
    """(B or 1, 1, T, T) bool: query i sees the keys of its causal window and the first ``sinks`` keys, and only real
    keys where a (B, T) key_mask marks left padding."""
    first = torch.arange(t, device=device) < sinks  # (T,) the sink keys
    allowed = (causal_mask(t, t, device, window) | (causal_mask(t, t, device) & first))[None, None]
    return allowed if key_mask is None else allowed & key_mask[:, None, None, :]


class SinkKV(LayerKV):
    """Keys and values in the window's ring, and those of the first ``sinks`` positions kept apart (B, Hkv, sinks, D),
    which a decoding step attends to before the ring, those the ring no longer holds."""

    def __init__(self, config, cache) -> None:
        super().__init__(config, cache)
        sinks = config.design_options["stream"]["sinks"]
        self.sinks = sinks if cache.window is not None else 0  # no ring: every key is kept anyway
        self.tokens = self.size + self.sinks
        self.sink_k: Tensor | None = None
        self.sink_v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor, ctx) -> tuple[Tensor, Tensor]:
        keys, values = super().update(k, v, ctx)
        if not self.sinks:
            return keys, values
        self.sink_k, self.sink_v = self.first(self.sink_k, k, ctx), self.first(self.sink_v, v, ctx)
        if ctx.start is None:  # a fixed-shape step: every sink (the context's mask says which count)
            return torch.cat([self.sink_k, keys], dim=2), torch.cat([self.sink_v, values], dim=2)
        gone = min(self.sinks, max(0, ctx.start + k.size(2) - self.size))  # sinks the ring no longer holds
        if ctx.start == 0 or not gone:  # the prompt attends to its own keys
            return keys, values
        return torch.cat([self.sink_k[:, :, :gone], keys], dim=2), torch.cat([self.sink_v[:, :, :gone], values], dim=2)

    def first(self, store: Tensor | None, new: Tensor, ctx) -> Tensor:
        """Keep the tokens among the first ``sinks`` positions (a decoding step's, without a branch on its index)."""
        if store is None:
            store = new.new_zeros(new.size(0), new.size(1), self.sinks, new.size(3))
        if ctx.start is not None:
            n = max(0, min(self.sinks - ctx.start, new.size(2)))
            store[:, :, ctx.start:ctx.start + n] = new[:, :, :n]
            return store
        slot = ctx.index.clamp(max=self.sinks - 1)  # (1,)
        kept = torch.where((ctx.index < self.sinks).view(1, 1, 1, 1), new, store.index_select(2, slot))
        return store.index_copy(2, slot, kept)


class Stream(Design):
    name = "stream"
    modeling = modeling_file("stream")
    about = "with a sliding window, every query also sees the first few tokens (StreamingLLM)"
    paper = "Xiao et al. 2023, Efficient Streaming Language Models with Attention Sinks"
    options = {"sinks": 4}  # the first tokens every query sees beside its window
    runtime = True
    cache = SinkKV
    preset = {"window": 16}
    conflicts = {"alibi": "the sink tokens' distances would grow without bound", "mla": "its cache keeps latents"}
    cases = {"alone": {"window": 5, "designs": ["stream"], "design_options": {"stream": {"sinks": 2}}},
             "gqa+rope": {"window": 4, "designs": ["stream", "rope"], "design_options": {"stream": {"sinks": 1}},
                          "n_kv_head": 2}}

    def flops(self, config, seq, flops) -> int:
        """A mask (the window plus the first tokens): attention is counted dense anyway, the count unchanged."""
        return flops

    def check(self, config) -> None:
        n = self.option(config, "sinks")
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ConfigError(f"model.design_options.stream.sinks must be a positive integer, got {n!r}",
                              hint="e.g. 4; leave stream out of model.designs for none")
        if config.window is None:
            raise ConfigError(f"model.designs=[stream] (sinks={n}) needs a sliding window (model.window): without "
                              "one every earlier token is attended to already", hint="add model.window=<tokens>")

    def context(self, ctx, config) -> None:
        n = self.option(config, "sinks")
        if ctx.start is None:  # a fixed-shape step: the sinks the ring no longer holds, before its slots (SinkKV)
            if ctx.cache.window is not None:
                gone = torch.arange(n, device=ctx.index.device) < ctx.index + 1 - ctx.cache.size  # (sinks,)
                ring = ctx.key_mask  # (B, size)
                ctx.key_mask = torch.cat([gone.expand(ring.size(0), n), ring], dim=1)
            return
        if ctx.window is None:  # a cache without a ring: every key is kept
            return
        if ctx.cache is not None and ctx.token_mask is not None:
            raise UserError("model.designs=[stream] cannot decode a batch of prompts of different lengths (left "
                            "padding would take the sink positions)", hint="generate one prompt at a time")
        ctx.key_mask = sink_band(len(ctx.index), ctx.window, n, ctx.key_mask, ctx.index.device)  # (B|1, 1, T, T)
        ctx.window = None

    def ref_keys(self, config, i, keys):
        return sorted(set(keys) | set(range(min(self.option(config, "sinks"), i + 1))))


register(Stream())
