"""Prefix caching: the keys and values of prompts' blocks of BLOCK tokens, kept by a hash of every token up to the
block's end, so a prompt that starts like an earlier one (a system prompt, the earlier turns of a chat) prefills
only what follows the longest cached prefix (vLLM's automatic prefix caching).

Blocks come from prefills and from sequences that finished (their generated tokens too: a chat's next turn repeats
the answer); a finished sequence's last partial block is kept too, so the next turn finds every token the model
computed, not only whole blocks (as SGLang's radix cache would, at the tail). At most ``capacity`` blocks are kept;
the least recently used go first. Only caches that hold every position in order can continue from a prefix
(KVCache's full stores: keys and values, MLA's latents); a ring (a sliding window, sink tokens) or a running state
cannot, and the engine then has no prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import Tensor

from gpt.designs.mla import LatentKV
from gpt.model.kv_cache import KVCache, LayerKV

BLOCK = 16  # tokens per block
KINDS: dict[type, tuple[str, ...]] = {LayerKV: ("k", "v"), LatentKV: ("c", "k_rope")}  # the kinds it keeps
AXES = {"k": 2, "v": 2, "c": 1, "k_rope": 1}  # each tensor's slot axis


def cacheable(cache: KVCache) -> bool:
    """Whether a model with this (empty) cache can continue a prefill from a cached prefix."""
    return len(cache.slots) == 1 and cache.slots[None].window is None and all(type(layer) in KINDS
                                                                            for layer in cache.layers)


def layer_tensors(cache: KVCache) -> list[dict[str, Tensor]]:
    """A filled one-row cache's tensors, per layer, by name (what PrefixCache.store takes)."""
    return [{name: getattr(layer, name) for name in KINDS[type(layer)]} for layer in cache.layers]


class Block(NamedTuple):
    """One cached block: the key of the block before it, its tokens (a hash match is checked against both; BLOCK of
    them, fewer in a finished sequence's last block), and per layer its tensors by name, (1, ...) with a position per
    token along the slot axis."""

    parent: int
    tokens: tuple[int, ...]
    layers: list[dict[str, Tensor]]


class PrefixCache:
    """Blocks of keys and values by the hash of the tokens up to their end, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, Block] = OrderedDict()
        self.looked = self.reused = 0  # prompt tokens looked up, and found

    @staticmethod
    def key(parent: int, tokens: tuple[int, ...]) -> int:
        """A block's key: its tokens and its parent's key, which chains every token before it."""
        return hash((parent, tokens))

    @staticmethod
    def hashes(tokens: list[int]) -> list[tuple[int, int, tuple[int, ...]]]:
        """(its key, its parent's key, its tokens) of each whole block of tokens: keys chain every earlier token."""
        out, parent = [], 0
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            block = tuple(tokens[start : start + BLOCK])
            out.append((PrefixCache.key(parent, block), parent, block))
            parent = out[-1][0]
        return out

    def lookup(self, context: list[int]) -> tuple[int, list[Block]]:
        """The longest cached prefix of context, leaving at least its last token to prefill: (tokens, blocks), whole
        blocks then the longest partial block a finished sequence left that continues them."""
        found, parent = [], 0
        for key, parent, tokens in self.hashes(context[:-1]):
            if not self._found(key, parent, tokens, found):
                break
            parent = key
        rest = context[len(found) * BLOCK : -1]
        for size in range(min(len(rest), BLOCK - 1), 0, -1):
            tail = tuple(rest[:size])
            if self._found(self.key(parent, tail), parent, tail, found):
                break
        tokens = sum(len(block.tokens) for block in found)
        self.looked += len(context)
        self.reused += tokens
        return tokens, found

    def _found(self, key: int, parent: int, tokens: tuple[int, ...], found: list[Block]) -> bool:
        """Whether this block is cached (its parent and tokens checked, not only the hash): then it is appended to
        found and becomes the most recently used."""
        block = self.blocks.get(key)
        if block is None or block.parent != parent or block.tokens != tokens:
            return False
        self.blocks.move_to_end(key)
        found.append(block)
        return True

    def fill(self, cache: KVCache, blocks: list[Block]) -> int:
        """Put the blocks' keys and values in an empty one-row cache as if its prefill had written them; the tokens."""
        n, slots = sum(len(block.tokens) for block in blocks), cache.slots[None]  # a uniform model's (cacheable)
        for i, layer in enumerate(cache.layers):
            for name in KINDS[type(layer)]:
                axis = AXES[name]
                prefix = torch.cat([block.layers[i][name] for block in blocks], dim=axis)
                shape = list(prefix.shape)
                shape[axis] = slots.size
                store = prefix.new_zeros(shape)
                store.narrow(axis, 0, n).copy_(prefix)
                setattr(layer, name, store)
        slots.started, slots.padded = True, False
        slots.key_mask[:, :n] = True
        slots.pos.fill_(n)
        return n

    def store(self, tokens: list[int], layers: list[dict[str, Tensor]], tail: bool = False) -> None:
        """Keep the whole blocks of tokens not cached yet, and with ``tail`` the partial block after them; ``layers``:
        per layer, name -> its tensor (1, ...) holding positions 0..len(tokens)-1 in order along the kind's slot axis
        (a one-row cache's, or a pool row's)."""
        blocks = self.hashes(tokens)
        end = len(blocks) * BLOCK
        if tail and end < len(tokens):
            parent = blocks[-1][0] if blocks else 0
            tail = tuple(tokens[end:])
            blocks.append((self.key(parent, tail), parent, tail))
        for b, (key, parent, block) in enumerate(blocks):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            self.blocks[key] = Block(parent, block, [{name: value.narrow(AXES[name], b * BLOCK, len(block)).clone()
                                                      for name, value in layer.items()} for layer in layers])
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens found in the cache over prompt tokens looked up (0 before any)."""
        return self.reused / self.looked if self.looked else 0.0
