"""Contiguous windows from the prepared token shards: positioned reads for training's windows, memory maps for the rest.

Each split is one token stream cut into shard files; a window may run from one shard into the next, so
the stream reads exactly as if it were one file (offsets are global).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gpt.data.meta import open_meta
from gpt.errors import UserError
from gpt.tokenizers import tokenizer as tok


class TokenStream:
    """One split's shards as a single read-only sequence of token ids: len() and slicing with a step of 1."""

    def __init__(self, folder: Path, shards: list[dict], dtype: np.dtype) -> None:
        self.maps = [np.memmap(folder / s["file"], dtype=dtype, mode="r") for s in shards if s["tokens"]]
        sizes = [len(m) for m in self.maps]  # equal to the recorded counts: gpt.data.meta.check_shards
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])  # shard i starts at offsets[i]
        self.dtype = np.dtype(dtype)
        self.files = [open(m.filename, "rb", buffering=0) for m in self.maps] if hasattr(os, "pread") else None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """The shards that tokens [start, stop) lie in, in order: (shard, its first index, its stop index)."""
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.offsets[shard + 1]))
            yield shard, start - int(self.offsets[shard]), end - int(self.offsets[shard])
            start, shard = end, shard + 1

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise IndexError("a token stream is sliced with step 1 only")
        parts = [self.maps[shard][lo:hi] for shard, lo, hi in self.pieces(start, stop)]
        if len(parts) == 1:  # within one shard: a view of its memory map
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        """A copy of tokens [start, stop) read with positioned reads (where the system has them): unlike a view of
        the memory maps this leaves no file pages mapped, so a run's resident memory does not grow toward the data
        set's size as random windows touch it (300 batches of the default run: 25 MiB; nanoGPT reopens its memmap
        per batch for the same reason)."""
        if self.files is None or stop <= start:
            return np.array(self[start:stop])
        parts, size = [], self.dtype.itemsize
        for shard, lo, hi in self.pieces(start, stop):
            got = os.pread(self.files[shard].fileno(), (hi - lo) * size, lo * size)
            if len(got) != (hi - lo) * size:
                raise UserError(f"{self.files[shard].name} is shorter than when it was opened",
                                hint="the data set changed during the run: prepare it again")
            parts.append(np.frombuffer(got, dtype=self.dtype))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class TokenData:
    """The train and val token streams of one prepared data set, and its tokenizer."""

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir)
        self.meta = meta = open_meta(self.dir)  # schema, shard sizes and token ids checked (UserError)
        self.tokenizer = tok.from_meta(meta["tokenizer"])
        dtype = np.dtype(meta["dtype"])
        self.splits = {split: TokenStream(self.dir, meta["splits"][split]["shards"], dtype)
                       for split in ("train", "val")}

    def check_block_size(self, block_size: int) -> None:
        for split, data in self.splits.items():
            if len(data) < block_size + 1:
                raise UserError(
                    f"the {split} split of {self.dir} has {len(data)} tokens, "
                    f"fewer than block_size + 1 = {block_size + 1}",
                    hint="use more text or a smaller model.block_size",
                )

    def random_starts(self, split: str, batch_size: int, block_size: int, generator: torch.Generator) -> list[int]:
        """Start offsets of batch_size random windows; drawing them is all that advances the generator."""
        return torch.randint(len(self.splits[split]) - block_size, (batch_size,), generator=generator).tolist()

    def windows(self, split: str, starts: list[int], block_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The windows at ``starts``: inputs x and next-token targets y, both (len(starts), block_size)."""
        data = self.splits[split]
        window = np.stack([data.read(s, s + block_size + 1) for s in starts]).astype(np.int64)  # (B, block_size + 1)
        xy = torch.from_numpy(window)
        x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
