"""The engine's KV-cache pool: a fixed number of slots, one sequence's cache each, per layer in that layer's kind.

The sequences joining together are prefilled in one left-padded forward (as gpt.inference.decoding.stream pads a
batch: each row sees what it would alone) whose keys and values go straight into free slots (SlotPool.prefill), or
one is prefilled alone into a one-row gpt.model.kv_cache.KVCache as long as its context and copied in (insert);
every decode step feeds one token to each slot in use, whatever their lengths; a finished sequence gives its slot
back at once (the last slot in use moves into it, so the slots in use are always the first B rows and a step reads
plain views of them, never a gather).

The trick that keeps a step one model call of fixed shapes: all rows write the new token at the same column (the
pool's ``column``, counting up; column % size is the slot). A sequence of L tokens joining at column c is stored at
columns c - L .. c - 1, rotated (each layer's stores are rings of ``size`` slots, as KVCache's window ring), so its
next token lands at c like every other row's. Attention sums over keys in any order, a per-row mask says which
slots hold the row's tokens, and the distance of a key in column s to the query in column c is (c - s) % size for
every row (what ALiBi reads through key_index). Each layer keeps the stores of its own kind (KINDS): a list over
layers, so a model whose layers have different kinds is pooled the same way. Kinds the pool does not know (a
user's design) decode each sequence in its own KVCache instead (SoloPool): slower, the same text.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpt.designs.deltanet import DeltaState
from gpt.designs.linear import LinearState
from gpt.designs.mla import LatentKV
from gpt.designs.stream import SinkKV
from gpt.inference.decoding import decode_step, left_pad, prefill
from gpt.inference.plain_step import PlainStep, plain
from gpt.model import GPT
from gpt.model.kv_cache import KVCache, LayerKV, Slots, Step

# each known cache kind: its tensors, and the axis of their slots (counting the batch axis; None: no slots, copied
# whole: sink tokens' keys, a running state)
KINDS: dict[type, dict[str, int | None]] = {
    LayerKV: {"k": 2, "v": 2},
    SinkKV: {"k": 2, "v": 2, "sink_k": None, "sink_v": None},
    LatentKV: {"c": 1, "k_rope": 1},
    LinearState: {"state": None},
    DeltaState: {"state": None, "conv": None},
}
TUPLES = {(LinearState, "state")}  # attributes kept as a tuple of tensors (the others are one tensor)


def pooled(model: GPT) -> bool:
    """Whether the pool keeps this model's caches (else SoloPool): one kind of layer (a layout's kinds keep slots of
    their own, which one pool column cannot serve) and every layer's cache kind one the pool knows."""
    return len(model.config.kinds()) == 1 and all(type(layer) in KINDS
                                                  for layer in KVCache(model.config, 1, "cpu").layers)


def sized(cache: KVCache, tokens: int) -> KVCache:
    """An empty uniform cache whose slots are ``tokens`` (a ring's at most its window): a prefill whose keys go to
    the pool (or whose prefix the prefix cache fills) then allocates no block_size buffers to copy from."""
    slots = cache.slots[None]
    slots.size = slots.max_length = min(tokens, slots.size)
    slots.key_mask = slots.key_mask[:, : slots.size]
    for layer in cache.layers:
        if hasattr(layer, "size"):
            layer.size = slots.size
    return cache


def tensors(value: Any) -> list[Tensor]:
    """A kind's attribute as a list of tensors (a running state is a tuple of them; an unfilled one is None)."""
    if value is None:
        return []
    return list(value) if isinstance(value, tuple) else [value]


class SlotPool:
    """``slots`` sequences' caches in one set of stores per layer; ``rows`` holds their sequences, slot order."""

    def __init__(self, model: GPT, slots: int, device: torch.device) -> None:
        probe = KVCache(model.config, 1, device)
        self.kinds = [type(layer) for layer in probe.layers]
        kind = probe.slots[None]  # a uniform model's one kind of slots (pooled)
        self.size, self.slots, self.device = kind.size, slots, device
        self.ring = kind.window is not None  # the stores are a sliding window's ring
        self.sinks = max((layer.sinks for layer in probe.layers if isinstance(layer, SinkKV)), default=0)
        self.renumber = kind.renumber  # an endless cache: positions numbered inside the ring (_View.renumbered)
        self.paddable = not self.sinks  # whether prefill may take contexts of different lengths together
        self.rows: list[Any] = []  # the sequence in each slot in use
        self.stores: list[dict[str, list[Tensor]]] = [{} for _ in self.kinds]  # allocated at the first insert
        self.key_mask = torch.zeros(slots, self.size, dtype=torch.bool, device=device)  # a slot holds the row's token
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)  # tokens each row's context holds
        self.tokens = torch.zeros(slots, dtype=torch.long, device=device)  # the token each row feeds next
        self.held: list[int] = []  # each row's context length (lengths, as Python numbers)
        self.column = 0  # the next step writes here (mod size)
        self._plain: PlainStep | None = None  # GPT-2's layers as straight calls (straight), made at the first step

    @property
    def free(self) -> int:
        return self.slots - len(self.rows)

    def insert(self, seq: Any, cache: KVCache, length: int, token: int) -> None:
        """Put a one-row cache holding ``length`` tokens (positions 0..length-1, in slots of any number: see sized)
        in the next free slot, rotated so its next token goes to ``column``; ``token`` is what it feeds next."""
        row = len(self.rows)
        if row == self.slots:
            raise RuntimeError("the cache pool has no free slot")
        if not self.rows:  # an empty pool: the sequence starts at column 0, so its columns do not wrap soon
            self.column = length
        self.key_mask[row] = False
        self._place(cache, row, 1, length, {})
        self.lengths[row], self.tokens[row] = length, token
        self.rows.append(seq)
        self.held.append(length)

    def prefill(self, model: GPT, contexts: list[list[int]], seqs: list[Any]) -> Tensor:
        """Prefill contexts together, left-padded to the longest (gpt.inference.decoding.left_pad: each row's
        positions from 0, as alone), into the next free slots; each one's next-token logits (K, vocab). Padding
        the rows to one width puts each row's last token in the column before ``column``, as insert would: the
        layers write their keys and values straight into the pool's stores where those columns do not wrap round
        (else into a cache of the prompts' width, copied in after). Not for sink tokens' stores unless the
        contexts are of one length (the first positions of a padded row are padding)."""
        r0, k = len(self.rows), len(contexts)
        if r0 + k > self.slots:
            raise RuntimeError("the cache pool has no free slot")
        idx, key_mask, positions = left_pad(contexts, self.device)
        width = idx.size(1)
        if not self.rows:
            self.column = width
        cache = sized(KVCache(model.config, k, self.device), width)
        self.key_mask[r0 : r0 + k] = False
        lo = (self.column - width) % self.size
        aimed = self._aim(cache, r0, k, lo) if self.stores[0] and lo + width <= self.size else {}
        logits = prefill(model, idx, positions, key_mask, cache)
        self._place(cache, r0, k, width, aimed)
        lengths = [len(context) for context in contexts]
        self.lengths[r0 : r0 + k] = torch.tensor(lengths, device=self.device)
        self.rows += seqs
        self.held += lengths
        return logits

    def _aim(self, cache: KVCache, r0: int, k: int, lo: int) -> dict[tuple[int, str], Tensor]:
        """Point a sized cache's slotted tensors (and its key mask) at rows r0.. of the stores, columns lo..: the
        prefill writes there (KVCache's write fills a given store in place). What it pointed, by (layer, name)."""
        width = cache.slots[None].size
        aimed = {}
        for i, (layer, stores) in enumerate(zip(cache.layers, self.stores)):
            for name, axis in KINDS[type(layer)].items():
                if axis is not None:
                    aimed[i, name] = stores[name][0][r0 : r0 + k].narrow(axis, lo, width)
                    setattr(layer, name, aimed[i, name])
        aimed[-1, "key_mask"] = cache.slots[None].key_mask = self.key_mask[r0 : r0 + k, lo : lo + width]
        return aimed

    def _place(self, cache: KVCache, r0: int, k: int, width: int, aimed: dict[tuple[int, str], Tensor]) -> None:
        """Copy a prefilled cache's rows into slots r0.. (what _aim did not point there): a slot s of its stores
        holds index p = s (mod its slots) of rows ``width`` wide, which goes to column (column - width + p) % size;
        the stores are allocated at the first call, in the cache's dtypes."""
        def columns(n: int) -> Tensor:
            return (torch.arange(n, device=self.device) + self.column - width) % self.size

        for i, (layer, stores) in enumerate(zip(cache.layers, self.stores)):
            for name, axis in KINDS[type(layer)].items():
                for j, value in enumerate(tensors(getattr(layer, name))):
                    if j == len(stores.setdefault(name, [])):
                        shape = [self.slots, *value.shape[1:]]
                        if axis is not None:
                            shape[axis] = self.size
                        stores[name].append(value.new_zeros(shape))
                    target = stores[name][j][r0 : r0 + k]
                    if axis is None:
                        target.copy_(value)
                    elif value is not aimed.get((i, name)):
                        target.index_copy_(axis, columns(value.size(axis)), value)
        mask = cache.slots[None].key_mask
        if (-1, "key_mask") not in aimed:
            self.key_mask[r0 : r0 + k].index_copy_(1, columns(mask.size(1)), mask)

    def release(self, row: int) -> Any:
        """Give a slot back at once: the last slot in use moves into it. Returns the sequence it held."""
        last = len(self.rows) - 1
        seq = self.rows[row]
        if row != last:  # only the columns the last row holds move (a GPT-2 slot is 75 MB of block_size columns)
            held = (torch.arange(min(self.held[last], self.size), device=self.device) + self.column
                    - min(self.held[last], self.size)) % self.size
            for kind, stores in zip(self.kinds, self.stores):
                for name, values in stores.items():
                    axis = KINDS[kind][name]
                    for value in values:
                        if axis is None:
                            value[row] = value[last]
                        else:
                            value[row].index_copy_(axis - 1, held, value[last].index_select(axis - 1, held))
            for t in (self.key_mask, self.lengths, self.tokens):
                t[row] = t[last]
            self.rows[row], self.held[row] = self.rows[last], self.held[last]
        self.rows.pop()
        self.held.pop()
        return seq

    def row_layers(self, row: int) -> list[dict[str, Tensor]]:
        """One row's slotted tensors, per layer by name, (1, ...) with its positions 0.. in order (the prefix cache
        keeps them); valid while the row's context has not outgrown a ring."""
        held = self.held[row]
        slots = (torch.arange(held, device=self.device) + self.column - held) % self.size
        return [{name: values[0][row : row + 1].index_select(KINDS[kind][name], slots)
                 for name, values in stores.items() if KINDS[kind][name] is not None}
                for kind, stores in zip(self.kinds, self.stores)]

    def feed(self, tokens: list[int]) -> None:
        """The token each row in use feeds next, in slot order."""
        self.tokens[: len(tokens)] = torch.tensor(tokens, device=self.device)

    def decode(self, model: GPT) -> Tensor:
        """One decode step of every row in use, each feeding its next token; the next logits (B, vocab)."""
        b = len(self.rows)
        self._unwrap()
        lo, hi, full = self.span()
        straight = self.straight(model)
        if straight is not None:
            column = self.column % self.size
            self.key_mask[:b, column] = True
            stores = [(layer["k"][0][:b], layer["v"][0][:b]) for layer in self.stores]
            logits = straight.pooled(self.tokens[:b].view(b, 1), self.lengths[:b].view(b, 1), stores, column, lo, hi,
                                     None if full else self.key_mask[:b, lo:hi])
        else:
            view = _View(self, lo, hi, full)
            logits = decode_step(model, self.tokens[:b].view(b, 1), self.lengths[:b].view(b, 1).clone(), view)
            view.written()
        self.advance(b)
        return logits

    def straight(self, model: GPT) -> PlainStep | None:
        """GPT-2's layers as straight calls (gpt.inference.plain_step) where they give this pool's steps exactly: a
        model plain() accepts, keys and values in columns (no ring, no sink tokens), no autocast. A step of the
        default model through them took half the general step's time here (docs/serving.md)."""
        if (self.ring or self.sinks or self.renumber or any(kind is not LayerKV for kind in self.kinds)
                or torch.is_autocast_enabled(self.device.type) or not plain(model)):
            return None
        if self._plain is None or self._plain.model is not model:
            self._plain = PlainStep(model, decode_step)
        return self._plain

    def advance(self, b: int) -> None:
        """After a step of the first b rows: the column and the rows' lengths one further."""
        self.column += 1
        self.lengths[:b] += 1
        self.held[:b] = [n + 1 for n in self.held[:b]]

    def _unwrap(self) -> None:
        """Where the rows' columns wrap round the ring (a prompt longer than the column joined, or the column reached
        the ring's end), move them, in order, to end at column max(held, size // 2): a step then reads only them
        (span) instead of every column. Seen serving GPT-2 with 32 clients: a third of the steps read all 1,024
        columns of every layer's keys and values, 2.4 GB a step; a move copies the held ones once."""
        held, column = min(max(self.held), self.size), self.column % self.size
        if self.sinks or held >= self.size or held <= column:
            return
        b, end = len(self.rows), max(held, self.size // 2)
        src = (torch.arange(held, device=self.device) + column - held) % self.size
        dst = torch.arange(end - held, end, device=self.device)
        for kind, stores in zip(self.kinds, self.stores):
            for name, values in stores.items():
                axis = KINDS[kind][name]
                for value in values if axis is not None else ():
                    value[:b].index_copy_(axis, dst, value[:b].index_select(axis, src))
        mask = self.key_mask[:b].index_select(1, src)
        self.key_mask[:b] = False
        self.key_mask[:b, end - held : end] = mask
        self.column = end

    def span(self) -> tuple[int, int, bool]:
        """The columns this step reads, [lo, hi), and whether every row holds a real token in each of them.

        The rows' tokens lie in the ``held`` columns before this one (the longest row's), so where those do not wrap
        round the ring the step reads only them: a short context is not charged for block_size slots; one row, or
        rows of one length, need no mask at all. Sink tokens' stores read every column (SinkKV reads the index)."""
        column, held = self.column % self.size, min(max(self.held), self.size)
        if self.sinks or held == self.size or held > column:
            return 0, self.size, not self.sinks and min(self.held) >= self.size
        return column - held, column + 1, min(self.held) == held


class _View(Slots):
    """The rows in use as the cache of one batch, as a uniform model's KVCache and its one kind of Slots at once:
    each layer's kind holding views of the pool's stores (columns [lo, hi)), and a step that writes every row's
    token at the pool's column (KVCache's fixed-shape step)."""

    def __init__(self, pool: SlotPool, lo: int, hi: int, full: bool) -> None:  # not the parent's: this views
        self.pool, self.lo, self.full, b = pool, lo, full, len(pool.rows)
        self.slots = {None: self}  # the model's contexts read a kind's slots here (KVCache.slots)
        self.size, self.window, self.max_length = hi - lo, None, None  # window None: no hook reads a global index
        self.sinks, self.renumber = pool.sinks, pool.renumber
        self.layers, self.views = [], []
        for kind, stores in zip(pool.kinds, pool.stores):
            layer = kind.__new__(kind)
            layer.size = layer.tokens = self.size
            if kind is SinkKV:
                layer.sinks = pool.sinks
            views = {name: [value[:b] if KINDS[kind][name] is None else value[:b].narrow(KINDS[kind][name], lo, hi - lo)
                            for value in values] for name, values in stores.items()}
            for name in KINDS[kind]:
                value = views.get(name)
                setattr(layer, name, None if value is None else tuple(value) if (kind, name) in TUPLES else value[0])
            self.layers.append(layer)
            self.views.append(views)

    def step(self, n: int, key_mask: Tensor | None) -> dict[str | None, Step]:
        """One token per row at the pool's column: the columns read, with each row's mask unless every one is real
        (sink tokens' keys first: those the ring no longer holds, per row)."""
        pool, b = self.pool, len(self.pool.rows)
        if n != 1:
            raise ValueError("the cache pool decodes one token at a time")
        column = pool.column % pool.size
        pool.key_mask[:b, column] = True
        mask = None if self.full else pool.key_mask[:b, self.lo : self.lo + self.size]
        if pool.sinks:
            gone = torch.arange(pool.sinks, device=pool.device) < (pool.lengths[:b, None] + 1 - pool.size)
            mask = torch.cat([gone, mask], dim=1)
        # the slot of the new token in the columns read; past the sinks' indices (SinkKV.first keeps index < sinks)
        index = column - self.lo + (pool.size * (pool.sinks // pool.size + 1) if pool.sinks else 0)
        return {None: Step(None, torch.tensor([index], device=pool.device), mask, None, None)}

    def renumbered(self, ctx) -> tuple[Tensor, Tensor]:
        """Slots.renumbered per row: (B, 1) query positions and (B, Tk) key positions inside each row's cache, for
        the keys this step reads (every sink, then the columns [lo, hi)), each row at its own length."""
        pool, b = self.pool, len(self.pool.rows)
        lengths = pool.lengths[:b, None]  # (B, 1) each row's tokens before this one
        columns = self.lo + torch.arange(self.size, device=pool.device)
        distance = (pool.column % pool.size - columns) % pool.size  # (Tk,) each column's distance to the query
        gone = (lengths + 1 - pool.size).clamp(min=0, max=pool.sinks)
        query = gone + (lengths + 1).clamp(max=pool.size) - 1
        keys = query - distance
        if pool.sinks:
            keys = torch.cat([torch.arange(pool.sinks, device=pool.device).expand(b, pool.sinks), keys], dim=1)
        return query, keys

    def written(self) -> None:
        """After the step: stores a kind replaced rather than wrote in place (a running state, sink tokens' keys)
        copied into the pool, a sink token decoded now kept (the pool's advance follows)."""
        pool, b = self.pool, len(self.pool.rows)
        for layer, views in zip(self.layers, self.views):
            for name, values in views.items():
                for value, new in zip(values, tensors(getattr(layer, name))):
                    if new is not value:
                        value.copy_(new)
            if type(layer) is SinkKV and pool.sinks:
                self._keep_sinks(views, b)

    def _keep_sinks(self, views: dict[str, list[Tensor]], b: int) -> None:
        """Rows whose new token is one of the first ``sinks``: its key and value also go to the sink stores."""
        slot = self.pool.column % self.pool.size
        for row in range(b):
            at = self.pool.held[row]
            if at < self.pool.sinks:
                views["sink_k"][0][row, :, at] = views["k"][0][row, :, slot]
                views["sink_v"][0][row, :, at] = views["v"][0][row, :, slot]


class SoloPool:
    """The pool's interface for cache kinds it does not know: each sequence keeps its own one-row KVCache and a
    decode step runs the model once per row."""

    def __init__(self, model: GPT, slots: int, device: torch.device) -> None:
        self.slots, self.device = slots, device
        self.rows: list[Any] = []
        self.caches: list[KVCache] = []
        self.next: list[tuple[int, int]] = []  # (token, position) each row feeds next

    @property
    def free(self) -> int:
        return self.slots - len(self.rows)

    def insert(self, seq: Any, cache: KVCache, length: int, token: int) -> None:
        self.rows.append(seq)
        self.caches.append(cache)
        self.next.append((token, length))

    def release(self, row: int) -> Any:
        self.caches.pop(row)
        self.next.pop(row)
        return self.rows.pop(row)

    def feed(self, tokens: list[int]) -> None:
        self.next = [(token, position) for token, (_, position) in zip(tokens, self.next)]

    def decode(self, model: GPT) -> Tensor:
        logits = []
        for i, cache in enumerate(self.caches):
            token, position = self.next[i]
            tensor = torch.tensor([[token]], device=self.device)
            logits.append(decode_step(model, tensor, torch.tensor([[position]], device=self.device), cache))
            self.next[i] = (token, position + 1)
        return torch.cat(logits)
