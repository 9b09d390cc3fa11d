"""A KV cache for incremental decoding: each layer's keys and values, preallocated, filled as tokens arrive.

The prompt is prefilled once; each later step feeds one token and attends to the cached keys. Grouped-query
models cache only their n_kv_head heads. A sliding-window model keeps only the last `window` keys in a ring
buffer (slot = index % window): a one-token step may attend to all of them, so their order does not matter.

Under torch.compile a one-token step reads fixed shapes (gpt-fast's way): it attends to every slot, with a mask of
the filled ones, and the token count is a tensor (``pos``), so a compiled ``decode_step`` runs every step with one
compilation; eager steps read only the filled slots (no mask at all when nothing is padded).
Each layer's LayerKV holds its own two buffers and nothing else; each kind of layer's Slots keeps what its layers
share (how many tokens were seen, which slots hold real ones): one for a uniform model, one per kind of a layout
(model.layers), whose windows differ. A design may keep something else per layer (its ``cache`` kind: latents, a
running state, sink tokens' keys), with LayerKV's interface.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from gpt.errors import UserError
from gpt.model import design as designs
from gpt.model.config import GPTConfig

Context = Any  # gpt.model.Context (a Step's fields and the model's): the model imports this module, not the reverse


class Step(NamedTuple):
    """What the cache tells a forward pass about its tokens (gpt.model.Context takes these fields)."""

    start: int | None  # index of the first new token; None for a one-token decoding step (``index`` says it)
    index: Tensor  # (T,) the new tokens' indices in the (left-padded) sequence
    key_mask: Tensor | None  # (B, Tk) which keys the layers get back are real; None: all
    token_mask: Tensor | None  # (B, T) which new tokens are real; None: all
    window: int | None  # the window the kernel still applies (None once a ring holds only the window)


def write(store: Tensor, new: Tensor, start: int, dim: int) -> None:
    """Put positions start.. of `new` (along `dim`) into `store` at slot position % slots, keeping the last `slots`.

    A store of block_size slots never wraps; a ring of `window` slots does once positions pass its size.
    """
    size, n = store.size(dim), new.size(dim)
    first = start % size
    if first + n <= size:  # one contiguous run of slots: every write but a prompt longer than a ring
        store.narrow(dim, first, n).copy_(new)
        return
    keep_n = min(n, size)
    slots = torch.arange(start + n - keep_n, start + n, device=store.device) % size
    store.index_copy_(dim, slots, new.narrow(dim, n - keep_n, keep_n))


def keep(store: Tensor | None, new: Tensor, ctx: Context, dim: int, size: int) -> tuple[Tensor, Tensor]:
    """Store the new tokens' tensor (tokens along ``dim``) in ``store`` (``size`` slots, allocated on first use);
    returns the store and what these queries attend to: the prompt's own, every slot in a fixed-shape step (the
    cache's key mask hides empty ones), else the filled slots."""
    if store is None:
        shape = list(new.shape)
        shape[dim] = size
        store = new.new_zeros(shape)
    if ctx.start is None:  # one token at a tensor index: no Python number changes from step to step
        store.index_copy_(dim, ctx.index % size, new)
        return store, store
    write(store, new, ctx.start, dim)
    if ctx.start == 0:
        return store, new
    return store, store.narrow(dim, 0, min(ctx.start + new.size(dim), size))


class LayerKV:
    """One layer's keys and values, (B, Hkv, size, D) each, allocated on first use in the keys' dtype."""

    sinks = 0  # keys kept apart before the ring (StreamingLLM's sink tokens: gpt.designs.stream.SinkKV)

    def __init__(self, config: GPTConfig, cache: Slots) -> None:
        self.size = self.tokens = cache.size  # slots; tokens its bytes stand for (the arena's bytes per token)
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @classmethod
    def bytes_per_token(cls, config: GPTConfig, number_bytes: int) -> float:
        """Bytes one layer keeps per cached token (gpt.memory's KV-cache line)."""
        return 2 * config.n_kv_head * config.head_dim * number_bytes

    def update(self, k: Tensor, v: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """Store k, v (B, Hkv, T, D) of these tokens; return what the T queries attend to (see keep)."""
        self.k, k = keep(self.k, k, ctx, 2, self.size)
        self.v, v = keep(self.v, v, ctx, 2, self.size)
        return k, v

    def held_bytes(self) -> int:
        """Bytes of the buffers (allocated for every slot at the first update)."""
        return sum(t.numel() * t.element_size() for t in vars(self).values() if isinstance(t, Tensor))


def endless(config: GPTConfig) -> bool:
    """Whether decoding with a cache may run past block_size without sliding (StreamingLLM: a window's ring, with
    the stream design's sink tokens kept apart): every kind of layer keeps a ring of fewer than block_size slots,
    positions come from the layers (RoPE: relative within the window; no learned table to run out of) and the cache
    may be used. Its bytes then stay those of the ring, however long the stream."""
    kinds = config.kinds().values()
    return (all(kind.window is not None and kind.window < config.block_size for kind in kinds)
            and any(map(designs.positional, kinds)) and refusal(config) is None)


def refusal(config: GPTConfig) -> str | None:
    """Why a design keeps this model from decoding with a KV cache (Design.no_cache, any kind's); None: it can."""
    return next(filter(None, (d.no_cache(kind) for kind in config.kinds().values() for d in designs.active(kind))),
                None)


class KVCache:
    """Every layer's cache for a batch of sequences of up to block_size tokens: each layer keeps what its kind needs
    (keys and values, a window's ring, a design's kind), and each kind of layer its own Slots (the ring's size and
    which slots hold real tokens). A uniform model has one kind; a layout (model.layers) one per kind."""

    refusal: str | None = None  # why it may not be used (kv_cache.refusal); a view made without __init__ may use it

    def __init__(self, config: GPTConfig, batch_size: int, device: torch.device | str) -> None:
        self.refusal = refusal(config)
        self.layers: list[Any] = []
        self.slots = {name: Slots(kind, batch_size, device, self.layers) for name, kind in config.kinds().items()}
        for i in range(config.n_layer):
            kind, slots = config.layer(i), self.slots[config.kind_of(i)]
            self.layers.append((designs.cache_kind(kind) or LayerKV)(kind, slots))
            slots.sinks = max(slots.sinks, getattr(self.layers[-1], "sinks", 0))
        for slots in self.slots.values():  # an endless cache numbers positions inside its rings (Slots.renumbered)
            slots.renumber = endless(config)

    @property
    def length(self) -> int:
        """Tokens seen so far (a Python number: reading it waits for the device, which sampling does anyway)."""
        return next(iter(self.slots.values())).length

    @property
    def tokens(self) -> int:
        """The longest context any layer's bytes stand for (block_size unless every layer keeps a window's ring)."""
        return max(layer.tokens for layer in self.layers)

    def held_bytes(self) -> int:
        """Bytes every layer holds now."""
        return sum(layer.held_bytes() for layer in self.layers)

    def step(self, n: int, key_mask: Tensor | None) -> dict[str | None, Step]:
        """Take the next n tokens in every kind's slots (Slots.step): each kind's Step, by kind. A model a design
        keeps from decoding with a cache (Design.no_cache) is refused here, at its first forward with one (building
        one stays possible: the memory planner reads a meta-device cache's layers)."""
        if self.refusal:
            raise UserError(f"this model cannot decode with a KV cache: {self.refusal}",
                            hint="sample without it (kv_cache=false), or choose another setting")
        return {name: slots.step(n, key_mask) for name, slots in self.slots.items()}


class Slots:
    """The slots one kind of layer keeps (a window's ring, or block_size in order) and which hold real tokens, for
    a batch; ``layers`` is the whole cache's list (a layer reaches its own as ``ctx.cache.layers[i]``)."""

    def __init__(self, config: GPTConfig, batch_size: int, device: torch.device | str, layers: list[Any]) -> None:
        self.max_length = config.block_size
        ring = config.window is not None and config.window < config.block_size
        self.window = config.window if ring else None  # a ring of `window` slots; None: block_size slots in order
        self.size = self.window or config.block_size  # slots kept per layer
        self.started = False  # whether the prompt is in (then one-token steps decode)
        self.padded = False  # whether the prompt was left-padded (else a prompt's kernels get no mask at all)
        # tokens seen so far (indices in the padded batch), a tensor so a compiled decode_step advances it in place
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.key_mask = torch.zeros(batch_size, self.size, dtype=torch.bool, device=device)  # slot holds a real token
        self.layers = layers
        self.sinks = 0  # sink tokens' keys its layers keep apart before the ring (KVCache sets it)
        self.renumber = False  # positions numbered inside the ring (KVCache sets it for an endless cache)

    @property
    def length(self) -> int:
        """Tokens seen so far (a Python number: reading it waits for the device, which sampling does anyway)."""
        return int(self.pos)

    def step(self, n: int, key_mask: Tensor | None) -> Step:
        """Take the next n tokens (key_mask (B, n): False on left padding, None: all real).

        The layers then attend to the prompt's own keys, or to the filled slots: the prompt's mask and the window,
        later the mask of the cached keys (None when nothing is padded) and no window. Under torch.compile a
        one-token step reads every slot instead (_fixed_step), so that no shape or Python number changes."""
        if self.started and n == 1 and torch.compiler.is_compiling():
            return self._fixed_step(key_mask)
        start = self.length if self.started else 0
        if start + n > self.max_length and self.window is None:  # a ring keeps its last `window` (endless)
            raise ValueError(f"KV cache overflow: {start} + {n} tokens exceed block_size {self.max_length}")
        if self.window is not None and start > 0 and n != 1:
            raise ValueError("a sliding-window cache takes one token at a time after the prompt")
        if start == 0:
            self.padded, self.started = key_mask is not None, True
        write(self.key_mask, key_mask if key_mask is not None else self.key_mask.new_ones(len(self.key_mask), n),
              start, dim=1)
        self.pos.fill_(start + n)
        index = torch.arange(start, start + n, device=self.pos.device)
        if start == 0:
            return Step(0, index, key_mask, key_mask, self.window)
        filled = min(start + n, self.size)
        return Step(start, index, self.key_mask[:, :filled] if self.padded else None, key_mask, None)

    def _fixed_step(self, key_mask: Tensor | None) -> Step:
        """One token at the tensor index ``pos``: every slot, with the mask of the filled ones (gpt-fast's way)."""
        index = self.pos.view(1).clone()  # (1,)
        new = key_mask if key_mask is not None else self.key_mask.new_ones(len(self.key_mask), 1)
        self.key_mask.index_copy_(1, index % self.size, new)
        self.pos.add_(1)
        return Step(None, index, self.key_mask, key_mask, None)

    def renumbered(self, ctx: Context) -> tuple[Tensor, Tensor]:
        """StreamingLLM's positions inside the cache: (query positions, key positions) of this step, for the keys a
        layer's update returns in their order (the sinks the ring no longer holds first, then the ring's slots).
        The prompt keeps its own positions; a decoding step numbers what the cache holds 0, 1, ... in sequence
        order (the sinks the ring dropped, then the ring's tokens, oldest first), the new token last. A slot's
        distance to the query is its distance in the sequence, so only the sinks' distances change: they stay
        below sinks + window however long the stream."""
        if ctx.start == 0:
            return ctx.positions, ctx.positions
        last = ctx.index[-1]  # the new token's index (a tensor in a fixed-shape step)
        filled = self.size if ctx.start is None else min(ctx.start + 1, self.size)
        distance = (last - torch.arange(filled, device=last.device)) % self.size  # (filled,) slot s to the query
        gone = (last + 1 - self.size).clamp(min=0, max=self.sinks)  # sinks the ring no longer holds
        query = gone + (last + 1).clamp(max=self.size) - 1
        keys = query - distance
        if self.sinks:  # a fixed-shape step reads every sink (the mask hides those still in the ring), else the gone
            held = self.sinks if ctx.start is None else min(self.sinks, max(0, ctx.start + 1 - self.size))
            keys = torch.cat([torch.arange(held, device=last.device), keys])
        return query.view(1), keys

    def key_index(self, step: Step) -> Tensor:
        """(Tk,) the sequence index of each key LayerKV.update returned for ``step``, in its order (ALiBi needs
        each key's distance): the prompt's own keys, or every slot (slot s holds the latest index = s mod size)."""
        if step.start == 0:
            return step.index
        filled = self.size if step.start is None else min(step.start + len(step.index), self.size)
        last = step.index[-1]
        return last - (last - torch.arange(filled, device=last.device)) % self.size
