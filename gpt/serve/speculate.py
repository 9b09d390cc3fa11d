"""Prompt-lookup speculative decoding (Saxena 2023): the tokens that followed the last occurrence of the sequence's
latest n-gram are guessed to follow again; one forward pass checks them all, and a greedy sequence keeps the guesses
its own argmax agrees with, plus the model's token after them: the same tokens one step at a time would give.

The engine speculates for a greedy sequence decoded alone in the pool (one slot in use: its columns are its positions
in order), on caches that hold every position (keys and values, MLA's latents); rejected guesses' columns are masked
out and overwritten later. Sampling at a temperature draws from a generator token by token, so it is not speculated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.model import GPT
from gpt.model.kv_cache import KVCache, Slots
from gpt.serve.cache_pool import SlotPool
from gpt.serve.prefix_cache import KINDS


def lookup(ids: list[int], ngram: int = 3, draft: int = 4) -> list[int]:
    """``draft`` tokens guessed from the latest earlier occurrence of the last ``ngram`` tokens (fewer n-gram tokens
    tried down to 1): the tokens that followed it, and where they run out, the sequence repeating itself with the same
    period; none when nothing repeats. (A run of one token repeated has its latest occurrence one token back, one
    token after it: taken alone that guessed one token a step, 32 checks for 64 tokens, no faster than without.)"""
    for n in range(min(ngram, len(ids) - 1), 0, -1):
        tail = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == tail:
                period = len(ids) - n - start  # the guesses go on from start + n, the text repeating after it
                return [ids[len(ids) - period + i % period] for i in range(draft)]
    return []


def speculable(pool: SlotPool) -> bool:
    """Whether the pool's caches hold every position in order (no ring, no running state)."""
    return not pool.ring and all(kind in KINDS for kind in pool.kinds)


def guesses_for(pool: SlotPool, ids: list[int], draft: int) -> list[int]:
    """The guesses to verify for the pool's one row: none unless its columns are its positions (it has been alone
    since it joined an empty pool), as many as fit its context."""
    if len(pool.rows) != 1 or pool.column != pool.held[0]:
        return []
    return lookup(ids, draft=draft)[: pool.size - pool.held[0] - 1]


def verify(model: GPT, pool: SlotPool, guesses: list[int]) -> Tensor:
    """Feed the pool's one row its next token and the guesses in one forward pass, at its own columns; the logits
    after each (1 + len(guesses), vocab). Call ``keep`` after, with how many it keeps."""
    held = pool.held[0]
    cache, slots = KVCache.__new__(KVCache), Slots.__new__(Slots)  # a uniform model's cache: one kind of slots
    slots.max_length, slots.window, slots.size = pool.size, None, pool.size
    slots.started, slots.padded = True, True
    slots.pos = torch.tensor(held, device=pool.device)
    slots.key_mask = pool.key_mask[:1]
    cache.layers = slots.layers = []
    cache.slots = {None: slots}
    for kind, stores in zip(pool.kinds, pool.stores):
        layer = kind.__new__(kind)
        layer.size = layer.tokens = pool.size
        for name in KINDS[kind]:
            setattr(layer, name, stores[name][0][:1])
        cache.layers.append(layer)
    tokens = torch.tensor([[int(pool.tokens[0]), *guesses]], device=pool.device)
    positions = torch.arange(held, held + len(tokens[0]), device=pool.device)[None]
    with torch.no_grad():
        logits, _ = model(tokens, positions=positions, cache=cache)
    return logits[0]


def keep(pool: SlotPool, fed: int, kept: int) -> None:
    """After verify fed ``fed`` tokens: the row keeps the first ``kept`` of them; the others' columns are masked."""
    held = pool.held[0]
    pool.key_mask[0, held + kept : held + fed] = False
    pool.held[0] = held + kept
    pool.lengths[0] = held + kept
    pool.column = held + kept
