"""A KV cache for incremental decoding: each layer's keys and values, preallocated, filled as tokens arrive.

The prompt is prefilled once; each later step feeds one token and attends to the cached keys. Grouped-
query models cache only their n_kv_head heads. A sliding-window model keeps only the last `window`
keys in a ring buffer: a one-token step may attend to all of them, so their order does not matter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.config import GPTConfig


class LayerCache:
    """One layer's slice of the cache; ``update`` stores new keys and returns what the step attends to."""

    def __init__(self, parent: "KVCache") -> None:
        self.parent = parent
        self.k: Tensor | None = None  # (B, Hkv, size, D), allocated on first use in the keys' dtype
        self.v: Tensor | None = None

    def update(
        self, k: Tensor, v: Tensor, key_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None, int | None]:
        """Store k, v (B, Hkv, T, D) and the new tokens' key_mask (B, T; None: all real tokens).

        Returns keys, values, their key mask (None while nothing is padded) and the window the kernel
        should apply (None when the cache itself holds only keys inside the window).
        """
        cache, start, T = self.parent, self.parent.length, k.size(2)
        if key_mask is not None and start == 0:
            cache.padded = True
        if key_mask is None and cache.padded:  # new tokens after a padded prompt are all real
            key_mask = torch.ones(k.size(0), T, dtype=torch.bool, device=k.device)
        if self.k is None:
            shape = (k.size(0), k.size(1), cache.size, k.size(3))
            self.k = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v = torch.zeros(shape, dtype=v.dtype, device=v.device)
        if cache.window is None:  # keys in position order: slots 0..length-1
            self.k[:, :, start : start + T] = k
            self.v[:, :, start : start + T] = v
            if key_mask is not None:
                cache.key_mask[:, start : start + T] = key_mask
            end = start + T
            return self.k[:, :, :end], self.v[:, :, :end], cache.mask(end), None
        if start == 0:  # the prompt: attend to it directly, keep its last `window` keys
            slots = torch.arange(max(0, T - cache.size), T, device=k.device) % cache.size
            self.k[:, :, slots] = k[:, :, -cache.size :]
            self.v[:, :, slots] = v[:, :, -cache.size :]
            if key_mask is not None:
                cache.key_mask[:, slots] = key_mask[:, -cache.size :]
            return k, v, key_mask, cache.window
        if T != 1:
            raise ValueError("a sliding-window cache takes one token at a time after the prompt")
        slot = start % cache.size
        self.k[:, :, slot] = k[:, :, 0]
        self.v[:, :, slot] = v[:, :, 0]
        if key_mask is not None:
            cache.key_mask[:, slot] = key_mask[:, 0]
        filled = min(start + 1, cache.size)
        return self.k[:, :, :filled], self.v[:, :, :filled], cache.mask(filled), None


class KVCache:
    """Keys and values of every layer for a batch of sequences of up to block_size tokens."""

    def __init__(self, config: GPTConfig, batch_size: int, device: torch.device | str) -> None:
        self.max_length = config.block_size
        self.window = config.window if config.window is not None and config.window < config.block_size else None
        self.size = self.window or config.block_size  # slots kept per layer
        self.length = 0  # tokens seen so far (positions in the padded batch)
        self.key_mask = torch.zeros(batch_size, self.size, dtype=torch.bool, device=device)
        self.padded = False  # whether any prompt was left-padded (else the kernels get no mask)
        self.layers = [LayerCache(self) for _ in range(config.n_layer)]

    def mask(self, n: int) -> Tensor | None:
        return self.key_mask[:, :n] if self.padded else None

    @property
    def full(self) -> bool:
        return self.length >= self.max_length

    def advance(self, n: int) -> None:
        if self.length + n > self.max_length:
            raise ValueError(f"KV cache overflow: {self.length} + {n} tokens exceed block_size {self.max_length}")
        self.length += n
