"""A KV cache for incremental decoding: each layer's keys and values, preallocated, filled as tokens arrive.

The prompt is prefilled once; each later step feeds one token and attends to the cached keys. Grouped-
query models cache only their n_kv_head heads. A sliding-window model keeps only the last `window`
keys in a ring buffer (slot = position % window): a one-token step may attend to all of them, so their
order does not matter. Each layer's LayerKV holds its own two buffers and nothing else; the KVCache
keeps what the layers share (how many tokens were seen, which of them are real) and the model passes
it down. A model with causal linear attention (model.linear_attn) keeps no keys at all: each layer's
LinearState holds the running sums (S, z) of gpt.attention.linear, the same size at any context length.
With sink tokens (model.sink_tokens, StreamingLLM) a window model also keeps the keys of the first tokens apart,
and a step attends to those the ring no longer holds as well.
A model with multi-head latent attention (model.mla_latent) keeps per token only the latent c_kv and the one
rotated key part shared by the heads (LatentKV); each step up-projects them to the heads' keys and values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.config import GPTConfig
from gpt.errors import UserError


def write(store: Tensor, new: Tensor, start: int, dim: int) -> None:
    """Put positions start.. of `new` (along `dim`) into `store` at slot position % slots, keeping the last `slots`.

    A store of block_size slots never wraps; a ring of `window` slots does once positions pass its size.
    """
    size, n = store.size(dim), new.size(dim)
    first = start % size
    if first + n <= size:  # one contiguous run of slots: every write but a prompt longer than a ring
        store.narrow(dim, first, n).copy_(new)
        return
    keep = min(n, size)
    slots = torch.arange(start + n - keep, start + n, device=store.device) % size
    store.index_copy_(dim, slots, new.narrow(dim, n - keep, keep))


class LayerKV:
    """One layer's keys and values, (B, Hkv, size, D) each, allocated on first use in the keys' dtype; with sink
    tokens (StreamingLLM) also those of the first ``sinks`` positions, kept apart once the ring has moved past them."""

    def __init__(self, size: int, sinks: int = 0) -> None:
        self.size, self.sinks = size, sinks
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.sink_k: Tensor | None = None
        self.sink_v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Store k, v (B, Hkv, T, D) of positions start..start+T-1; return what these T queries attend to.

        A prompt (start 0) attends to its own keys (a ring may keep only their tail); a later step to every
        slot filled so far.
        """
        if self.k is None or self.v is None:
            shape = (k.size(0), k.size(1), self.size, k.size(3))
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
            if self.sinks:
                shape = (k.size(0), k.size(1), self.sinks, k.size(3))
                self.sink_k, self.sink_v = k.new_zeros(shape), v.new_zeros(shape)
        write(self.k, k, start, dim=2)
        write(self.v, v, start, dim=2)
        if start < self.sinks:  # positions start.. of the first `sinks`: kept whatever the ring overwrites
            n = min(self.sinks - start, k.size(2))
            self.sink_k[:, :, start:start + n] = k[:, :, :n]
            self.sink_v[:, :, start:start + n] = v[:, :, :n]
        if start == 0:
            return k, v
        end = start + k.size(2)
        filled, evicted = min(end, self.size), min(self.sinks, max(0, end - self.size))  # sinks no longer in the ring
        if not evicted:
            return self.k[:, :, :filled], self.v[:, :, :filled]
        return (torch.cat([self.sink_k[:, :, :evicted], self.k[:, :, :filled]], dim=2),
                torch.cat([self.sink_v[:, :, :evicted], self.v[:, :, :filled]], dim=2))

    def held_bytes(self) -> int:
        """Bytes of the buffers (allocated for every slot at the first update)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.sink_k, self.sink_v) if t is not None)


class LatentKV:
    """One layer's MLA latents: c_kv (B, size, d_c) and the rotated shared key part k_rope (B, size, d_R)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.c: Tensor | None = None
        self.k_rope: Tensor | None = None

    def update(self, c: Tensor, k_rope: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Store c (B, T, d_c) and k_rope (B, T, d_R) of positions start..start+T-1; return what these T queries
        attend to, as LayerKV.update does (the prompt's own, later every slot filled so far)."""
        if self.c is None or self.k_rope is None:
            self.c = c.new_zeros(c.size(0), self.size, c.size(2))
            self.k_rope = k_rope.new_zeros(k_rope.size(0), self.size, k_rope.size(2))
        write(self.c, c, start, dim=1)
        write(self.k_rope, k_rope, start, dim=1)
        if start == 0:
            return c, k_rope
        filled = min(start + c.size(1), self.size)
        return self.c[:, :filled], self.k_rope[:, :filled]

    def held_bytes(self) -> int:
        """Bytes of the buffers: (d_c + d_R) numbers per token, instead of 2 x n_head x head_dim."""
        return sum(t.numel() * t.element_size() for t in (self.c, self.k_rope) if t is not None)


class LinearState:
    """One layer's linear-attention state: S (B, Hkv, D, Dv) and z (B, Hkv, D), the sums over every token so far."""

    def __init__(self) -> None:
        self.state: tuple[Tensor, Tensor] | None = None

    def held_bytes(self) -> int:
        """Bytes of the state: constant once the prompt is in, whatever the length."""
        return sum(t.numel() * t.element_size() for t in self.state) if self.state is not None else 0


class KVCache:
    """Keys and values of every layer for a batch of sequences of up to block_size tokens, and which are real."""

    def __init__(self, config: GPTConfig, batch_size: int, device: torch.device | str) -> None:
        self.max_length = config.block_size
        ring = config.window is not None and config.window < config.block_size
        self.window = config.window if ring else None  # a ring of `window` slots; None: block_size slots in order
        self.size = self.window or config.block_size  # slots kept per layer
        self.sinks = config.sink_tokens if self.window is not None else 0  # first tokens kept apart from the ring
        self.length = 0  # tokens seen so far (positions in the padded batch)
        self.key_mask = torch.ones(batch_size, self.size, dtype=torch.bool, device=device)  # False: left padding
        self.padded = False  # whether the prompt was left-padded (else the kernels get no mask at all)
        self.layers: list[LayerKV | LatentKV | LinearState] = [self._layer(config) for _ in range(config.n_layer)]

    def _layer(self, config: GPTConfig) -> LayerKV | LatentKV | LinearState:
        """What one layer keeps: keys and values, MLA's latents, or linear attention's running state."""
        if config.linear_attn is not None:
            return LinearState()
        return LatentKV(self.size) if config.mla_latent is not None else LayerKV(self.size, self.sinks)

    def step(self, n: int, key_mask: Tensor | None) -> tuple[Tensor | None, int | None]:
        """Take the next n tokens (key_mask (B, n): False on left padding, None: all real).

        Returns the key mask and window for the attention over what each LayerKV.update returns: the
        prompt's own mask and the window, later the mask of every cached key and no window.
        """
        start = self.length
        if start + n > self.max_length:
            raise ValueError(f"KV cache overflow: {start} + {n} tokens exceed block_size {self.max_length}")
        if self.window is not None and start > 0 and n != 1:
            raise ValueError("a sliding-window cache takes one token at a time after the prompt")
        self.length += n
        if start == 0:
            self.padded = key_mask is not None
            if self.padded and self.sinks:
                raise UserError("model.sink_tokens cannot decode a batch of prompts of different lengths (left "
                                "padding would take the sink positions)", hint="generate one prompt at a time")
        if self.padded:  # tokens after a padded prompt are all real
            new = key_mask if key_mask is not None else self.key_mask.new_ones(self.key_mask.size(0), n)
            write(self.key_mask, new, start, dim=1)
        if start == 0:
            return key_mask, self.window
        filled = min(start + n, self.size)
        return (self.key_mask[:, :filled] if self.padded else None), None

    def key_index(self, n: int) -> Tensor:
        """(Tk,) the sequence index of each key LayerKV.update returned for the n tokens step() just took, in its
        order (ALiBi needs each key's distance): the prompt's own keys, or every filled slot (a ring's wrap)."""
        device = self.key_mask.device
        if self.length == n:  # the prompt: its own keys
            return torch.arange(n, device=device)
        last = self.length - 1
        slots = torch.arange(min(self.length, self.size), device=device)
        return last - (last - slots) % self.size  # slot s holds the latest index congruent to s (mod size)
